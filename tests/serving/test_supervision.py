"""Triton supervised, for real: killed, it is restarted and what the routing table serves is loaded again; while it
is down the gateway answers a structured runtime_unavailable and /healthz and /readyz say so; a restart of the
runtime on an existing KEEL_HOME serves the deployed models without a new deployment; no tritonserver outlives a
killed serve process; the admin key is not on tritonserver's command line."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.serving.conftest import MODEL, request_body, serving_version_1, start_serve, stop_serve


def wait_until(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def triton_pid(home: Path) -> int:
    return int((home / "serving" / "triton" / "tritonserver.pid").read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie is gone too


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    with serving_version_1(runtime_home, serving_models[0]) as rt:
        yield rt


def test_the_admin_key_is_not_on_tritons_command_line(runtime):
    cmdline = Path(f"/proc/{triton_pid(runtime.home)}/cmdline").read_bytes()
    assert b"tritonserver" in cmdline and runtime.endpoints["admin_key"].encode() not in cmdline
    assert httpx.get(f"{runtime.url}/healthz", timeout=5).json()["runtime"]["admin_key_hidden"] is True
    runtime.deployer().deploy(MODEL, [runtime.target(1)])  # the key still works for deployments


def thread_nices(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_triton_and_the_gateway_serve_at_the_serving_priority(runtime):
    """Every thread of the serving process and of Triton at KEEL_SERVING_NICE's default (−5) where this machine lets a
    process lower its nice value (root, CAP_SYS_NICE), else at the priority they were started with — Triton's model
    instance threads too, which Triton itself starts at nice 0."""
    import subprocess
    import sys

    permitted = subprocess.run([sys.executable, "-c", "import os; os.setpriority(os.PRIO_PROCESS, 0, -5)"],
                               capture_output=True).returncode == 0  # fmt: skip
    expected = -5 if permitted else os.getpriority(os.PRIO_PROCESS, 0)
    assert thread_nices(runtime.endpoints["pid"]) == {expected}
    # Triton sets its model instances' threads to a nice value of its own as it loads a model; the supervisor
    # (polling every 0.5 s) brings them back
    runtime.deployer().deploy(MODEL, [runtime.target(1)])
    wait_until(
        lambda: thread_nices(triton_pid(runtime.home)) == {expected}, f"every Triton thread at nice {expected}"
    )
    # Linux's autogroup shares the CPU between sessions before nice values count: Triton stays in the serving
    # session (a process group of its own), whose autogroup the serving process (its leader) gave the same priority
    serving, triton = runtime.endpoints["pid"], triton_pid(runtime.home)
    assert os.getsid(triton) == os.getsid(serving) == serving
    if os.path.exists(f"/proc/{serving}/autogroup"):  # a kernel with autogroup
        group = open(f"/proc/{serving}/autogroup").read()
        assert group == open(f"/proc/{triton}/autogroup").read() and group.split()[-1] == str(expected), group


def test_a_killed_triton_is_restarted_and_serves_the_routed_version_again(runtime, serving_models):
    body = request_body(serving_models[1].row(3, named=True))
    hold = runtime.home / "serving" / "triton" / "hold"
    hold.touch()  # maintenance hold: the supervisor reports the runtime down but waits, so the test can look
    try:
        os.kill(triton_pid(runtime.home), signal.SIGKILL)
        health = wait_until(
            lambda: (r := httpx.get(f"{runtime.url}/healthz", timeout=5)).status_code == 503 and r, "healthz 503"
        )
        assert (
            health.json()["status"] == "runtime_unavailable" and "exited" in health.json()["runtime"]["last_failure"]
        )
        ready = httpx.get(f"{runtime.url}/readyz", timeout=5)
        assert ready.status_code == 503 and "model runtime" in ready.json()["reason"]
        answer = runtime.post(body)
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "runtime_unavailable"
        assert answer.json()["request_id"]
    finally:
        hold.unlink()
    wait_until(lambda: httpx.get(f"{runtime.url}/readyz", timeout=5).status_code == 200, "readyz after restart")
    answer = runtime.post(body)
    assert answer.status_code == 200 and answer.json()["model_version"] == 1
    health = httpx.get(f"{runtime.url}/healthz", timeout=5).json()
    assert health["runtime"]["restarts"] == 1 and health["runtime"]["restored_versions"] == [1]
    metrics = httpx.get(f"{runtime.url}/metrics", timeout=5).text
    assert "keel_gateway_runtime_restarts_total 1" in metrics and "keel_gateway_runtime_up 1" in metrics
    assert "keel_gateway_runtime_unavailable_total 1" in metrics


def test_under_traffic_a_killed_triton_costs_only_structured_answers_and_serving_resumes(runtime, serving_models):
    """Requests keep coming while Triton is killed: every answer is either scored or the structured
    runtime_unavailable (never a bare 5xx, nor a backend_error or an open breaker because the runtime died), and once
    the supervisor has restarted it, requests are scored again — on a fresh gRPC channel, not one stuck in the dead
    process's reconnect back-off."""
    import threading

    body = request_body(serving_models[1].row(3, named=True))
    answers: list[tuple[bool, int, str | None]] = []  # (after the kill, status, error code)
    killed, stop = threading.Event(), threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                try:
                    r = client.post(f"{runtime.url}/v1/predict", json=body)
                    answers.append((killed.is_set(), r.status_code, (r.json().get("error") or {}).get("code")))
                except (httpx.HTTPError, ValueError) as exc:  # a dropped connection or a bare body: counted, asserted
                    answers.append((killed.is_set(), 0, type(exc).__name__))
                time.sleep(0.01)

    restarts = httpx.get(f"{runtime.url}/healthz", timeout=5).json()["runtime"]["restarts"]
    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        wait_until(lambda: len(answers) >= 20, "traffic flowing before the kill")
        os.kill(triton_pid(runtime.home), signal.SIGKILL)
        killed.set()

        def scored_again() -> bool:  # 50 scored answers in a row after the kill
            after = [a for a in answers if a[0]]
            return len(after) >= 50 and all(status == 200 for _, status, _ in after[-50:])

        wait_until(scored_again, "scored answers again after the restart", timeout=180)
    finally:
        stop.set()
        sender.join(timeout=60)
    after = [(status, code) for was_killed, status, code in answers if was_killed]
    assert {(s, c) for s, c in after if s != 200} <= {(503, "runtime_unavailable")}, set(after)
    assert any(s == 503 for s, _ in after)  # the outage was met (the kill was under traffic)
    assert httpx.get(f"{runtime.url}/healthz", timeout=5).json()["runtime"]["restarts"] == restarts + 1


def test_a_restarted_runtime_serves_what_is_deployed_and_a_killed_serve_leaves_no_triton(runtime, serving_models):
    body = request_body(serving_models[1].row(4, named=True))
    stop_serve(runtime.proc)
    proc, endpoints = start_serve(runtime.home)  # same KEEL_HOME, no deployment
    runtime.proc, runtime.url = proc, f"http://{endpoints['gateway']}"
    wait_until(lambda: httpx.get(f"{runtime.url}/readyz", timeout=5).status_code == 200, "readyz without a deploy")
    answer = runtime.post(body)
    assert answer.status_code == 200 and answer.json()["model_version"] == 1
    pid = triton_pid(runtime.home)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the serve process (and nothing else of ours)
    proc.wait(timeout=30)
    wait_until(lambda: gone(pid), "tritonserver to die with its parent", timeout=60)
    wait_until(lambda: not any(_in_group(p, pid) for p in _pids()), "Triton's Python stubs to exit", timeout=120)


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _in_group(pid: int, pgid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[2]) == pgid and fields[0] != "Z"


def test_a_start_stops_what_a_killed_run_left_of_its_triton(tmp_path):
    """What serve does first: a process left in the recorded Triton process group (here a stand-in named like a
    Python stub — a real orphan needs a serve killed before the stubs' own exit) is stopped; others are left."""
    import subprocess
    import sys

    from gpu_runtime.process import reap_orphan

    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "triton_python_backend_stub"], start_new_session=True
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        (tmp_path / "tritonserver.pid").write_text(str(stand_in.pid))
        assert reap_orphan(tmp_path) == stand_in.pid
        assert stand_in.wait(timeout=30) == -signal.SIGKILL
        assert bystander.poll() is None and not (tmp_path / "tritonserver.pid").exists()
        (tmp_path / "tritonserver.pid").write_text(str(bystander.pid))
        assert reap_orphan(tmp_path) is None and bystander.poll() is None  # not a Triton process: left alone
    finally:
        for p in (stand_in, bystander):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_the_serving_priority_is_validated_and_a_refusal_is_said(monkeypatch):
    from gpu_runtime.process import serving_priority

    with pytest.raises(ValueError, match="KEEL_SERVING_NICE must be an integer"):
        serving_priority({"KEEL_SERVING_NICE": "high"})
    with pytest.raises(ValueError, match="within -20…19"):
        serving_priority({"KEEL_SERVING_NICE": "-40"})

    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)  # what the kernel answers a process without CAP_SYS_NICE
    current = os.getpriority(os.PRIO_PROCESS, 0)
    line = serving_priority({"KEEL_SERVING_NICE": str(current - 1 if current > -20 else current + 1)})
    assert line.startswith(f"serving at nice {current}: not permitted") and "CAP_SYS_NICE" in line
