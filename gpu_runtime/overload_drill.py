"""The fault of the ``overload`` chaos drill (keel/chaos.py): a starved machine, then a flood of the lowest tier —
driven against the running model runtime while probe traffic of the highest tier measures what its users got.

    python -m gpu_runtime.overload_drill [--starve-s 15] [--flood-s 10] [--recover-s 20] [--out FILE]

Phases, each timed on the wall clock, the probe running through all of them (open loop, ``PROBE_RPS``, client
timeout ``CLIENT_TIMEOUT_S``):

1. **baseline** (``--baseline-s``): the probe alone — the highest tier's unloaded latency;
2. **starve**: one busy process per core (normal priority) for ``--starve-s``;
3. **flood**: the lowest tier's model offered ``FLOOD_FACTOR`` × the rate the runtime answered it in a short
   closed-loop calibration, spread over ``FLOOD_TENANTS`` tenants (no tenant limit does the work), for
   ``--flood-s``; its real offered rate is reported;
4. **recovery** (``--recover-s``): the probe alone again; the first 5 s window with ≥ 99 % answered and p99 within 2×
   the baseline's p99 is when the service recovered.

Each stream runs in a process of its own (``--stream SPEC``), so no client loop delays another's answers, and every
one on ``--client-cpus`` (default: the machine's last CPU, when it has several — the runtime keeps the others, as a
remote client would leave it its cores; the flood is sent by one process per CPU given). ``--flood-rps`` sets the
flood's rate instead of the calibration's multiple (bench/edge_flood.py: 2,500 req/s). The report
(JSON, ``--out``): per phase the probe's answered share (at all, and within its tier's timeout), p50/p99, client timeouts; every refusal's code and the
slowest refusal; the flood's offered and answered rates; when the recovery window came; and how many connections to
the gateway were left in CLOSE-WAIT afterwards. With one model served, the flood and the probe are the same model
(the report says so: no tier to protect).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_runtime.overload_report import _codes, _ms, close_wait, pct, phase_report, recovered_at, refusal_times

PROBE_RPS = 40.0
CLIENT_TIMEOUT_S = 5.0
FLOOD_FACTOR = 10.0
FLOOD_TENANTS = 64
MAX_CONNECTIONS = 4096  # a stream's open connections at most (a client's file descriptors)
IDLE_REUSE_S = 2.0  # a keep-alive connection idle longer is closed, not reused (uvicorn closes them after 5 s)
BUSY = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True: pass"


def api_key(body: bytes, keys: dict[str, str] | None) -> str | None:
    """The request's API key behind the edge: its tenant's (the body's ``tenant_id``); None without an edge."""
    return keys.get(json.loads(body).get("tenant_id", "")) if keys else None


async def stream(url: str, route: str, bodies: list[bytes], rate: float, seconds: float,
                 keys: dict[str, str] | None = None) -> list[list]:  # fmt: skip
    """Open loop: requests leave on schedule whatever the answers do. Per request: [sent offset s, latency s or
    None, status (0: transport failure or client timeout), error code, how late it left s].

    A plain HTTP/1.1 client on asyncio streams (keep-alive connections reused, a new one when all are busy, up to
    ``MAX_CONNECTIONS``; requests prebuilt): a flood of thousands a second from a client library would take the cores
    the gateway is measured on. Latency runs from when the request was written; how late the sender was against
    its schedule is kept apart (the last field), so the client's own lag is not counted as the gateway's."""
    from urllib.parse import urlsplit

    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80

    def request(b: bytes) -> bytes:
        key = api_key(b, keys)
        auth = f"x-api-key: {key}\r\n" if key else ""
        head = f"POST {route} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n{auth}"
        return f"{head}content-length: {len(b)}\r\n\r\n".encode() + b

    requests = [request(b) for b in bodies]
    out: list[list] = []
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []  # (…, when it was last answered)
    open_connections = 0
    start = time.perf_counter()

    async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        status = int((await reader.readline()).split()[1])
        length, keep = 0, True
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
        return status, await reader.readexactly(length), keep

    async def one(i: int, due: float) -> None:
        nonlocal open_connections
        t0 = time.perf_counter()
        while idle and t0 - idle[-1][2] > IDLE_REUSE_S:  # the server may be closing it: a client lets it go
            idle.pop()[1].close()
            open_connections -= 1
        conn = idle.pop()[:2] if idle else None
        try:
            if conn is None:
                if open_connections >= MAX_CONNECTIONS:
                    raise ConnectionError("the client's connection limit")
                open_connections += 1
                try:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, port), CLIENT_TIMEOUT_S)
                except BaseException:
                    open_connections -= 1
                    raise
            reader, writer = conn
            writer.write(requests[i % len(requests)])
            left = CLIENT_TIMEOUT_S - (time.perf_counter() - t0)
            status, payload, keep = await asyncio.wait_for(answer(reader), left)
        except Exception as exc:  # noqa: BLE001 - a client timeout or a refused connection: counted
            if conn is not None:
                conn[1].close()
                open_connections -= 1
            out.append([t0 - start, None, 0, type(exc).__name__, t0 - start - due])
            return
        if keep:
            idle.append((reader, writer, time.perf_counter()))
        else:
            writer.close()
            open_connections -= 1
        code = None if status == 200 else json.loads(payload).get("error", {}).get("code")
        out.append([t0 - start, time.perf_counter() - t0, status, code, t0 - start - due])

    tasks, i = [], 0
    while (now := time.perf_counter() - start) < seconds:
        while i <= now * rate:  # request i is due at i / rate
            tasks.append(asyncio.create_task(one(i, i / rate)))
            i += 1
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    for _, writer, _ in idle:
        writer.close()
    return out


def run_stream(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    bodies = [b.encode() for b in spec["bodies"]]
    import uvloop  # the gateway's own loop: the cheapest sender on the same cores

    result = uvloop.run(stream(spec["url"], spec["route"], bodies, spec["rate"], spec["seconds"], spec.get("keys")))
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


def default_client_cpus() -> str:
    """The last CPU this process may use, when it may use several: the load generator's own ('' with one)."""
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[-1]) if len(cpus) > 1 and shutil.which("taskset") else ""


def cpu_list(text: str) -> set[int]:
    """CPUs from taskset's list form (``1``, ``0,2``, ``2-3``)."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def start_stream(work: Path, name: str, url: str, route: str, bodies: list[bytes], rate: float,
                 seconds: float, keys: dict[str, str] | None = None,
                 cpus: str | None = None) -> tuple[subprocess.Popen, Path]:  # fmt: skip
    spec = work / f"{name}.json"
    out = work / f"{name}.out.json"
    spec.write_text(json.dumps({"url": url, "route": route, "bodies": [b.decode() for b in bodies], "rate": rate,
                                "seconds": seconds, "out": str(out), "keys": keys or {}}))  # fmt: skip
    spec.chmod(0o600)  # (API keys)
    pin = ["taskset", "-c", cpus] if cpus else []  # the load generator on CPUs of its own (a remote client's)
    return subprocess.Popen([*pin, sys.executable, "-m", "gpu_runtime.overload_drill", "--stream", str(spec)]), out


def calibrate(url: str, route: str, bodies: list[bytes], seconds: float = 2.0, concurrency: int = 16,
              keys: dict[str, str] | None = None) -> float:  # fmt: skip
    """Answers per second the runtime gives the flooded model, closed loop."""
    import httpx

    async def run() -> int:
        done = 0
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:

            async def worker(k: int) -> None:
                nonlocal done
                i = k
                while time.monotonic() < deadline:
                    body = bodies[i % len(bodies)]
                    key = api_key(body, keys)
                    headers = {"content-type": "application/json"} | ({"x-api-key": key} if key else {})
                    r = await client.post(route, content=body, headers=headers)
                    done += r.status_code == 200
                    i += concurrency

            await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return done

    return asyncio.run(run()) / seconds


def targets(url: str) -> tuple[str, str, int]:
    """(the highest tier's model, the lowest tier's model, how many models) from the gateway's /readyz and the
    installed use cases' declared tiers (the policy's model_tiers, when it names one)."""
    import httpx

    from keel.usecase import installed

    ready = httpx.get(f"{url}/readyz", timeout=10).json()
    served = list(ready.get("models", {}) or {})
    ucs = {uc.model.name: uc for uc in installed().values()}
    if not served:
        served = [next(iter(ucs))] if len(ucs) == 1 else [m for m in ucs]
    by_tier = sorted(served, key=lambda m: ucs[m].serving.tier if m in ucs else "L9")
    return by_tier[0], by_tier[-1], len(served)


def tier_timeout_s(model: str) -> float:
    """The timeout of ``model``'s declared tier (the default policy's tiers)."""
    from keel.policies.gateway import DEFAULT_TIERS
    from keel.usecase import installed

    uc = next(u for u in installed().values() if u.model.name == model)
    return DEFAULT_TIERS[uc.serving.tier].timeout_ms / 1000


def bodies_of(model: str, n: int = 2000) -> list[bytes]:
    from keel.usecase import installed

    uc = next(u for u in installed().values() if u.model.name == model)
    rows = [r for month in uc.months[-2:] for r in uc.replay.requests(month)][:n]
    return [json.dumps({"entities": [r], "tenant_id": "drill-probe", "risk_level": 2}, default=str).encode()
            for r in rows]  # fmt: skip


def flood_bodies(model: str, n: int = 2000) -> list[bytes]:
    return [b.replace(b'"drill-probe"', f'"drill-flood-{i % FLOOD_TENANTS}"'.encode())
            for i, b in enumerate(bodies_of(model, n))]  # fmt: skip


DRILL_TENANTS = ["drill-probe", *(f"drill-flood-{i}" for i in range(FLOOD_TENANTS))]


def drill(url: str, port: int, baseline_s: float, starve_s: float, flood_s: float, recover_s: float,
          progress=print, keys: dict[str, str] | None = None, flood_rps: float | None = None,
          client_cpus: str | None = None) -> dict:  # fmt: skip
    protected, flooded, n_models = targets(url)
    probe_route, flood_route = f"/v1/models/{protected}/predict", f"/v1/models/{flooded}/predict"
    flood = flood_bodies(flooded)
    capacity = calibrate(url, flood_route, flood, keys=keys)
    progress(
        f"overload drill: {flooded} answers {capacity:.0f}/s closed loop; probing {protected} at {PROBE_RPS:g}/s"
    )
    total = baseline_s + starve_s + flood_s + recover_s
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="keel-overload-") as tmp:
        work = Path(tmp)
        probe, probe_out = start_stream(work, "probe", url, probe_route, bodies_of(protected), PROBE_RPS, total,
                                        keys, client_cpus)  # fmt: skip
        time.sleep(baseline_s)
        if starve_s > 0:
            progress(f"overload drill: starving the machine: {cores} busy processes for {starve_s:g} s")
            busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(cores)]
            time.sleep(starve_s)
            for b in busy:
                b.terminate()
                b.wait()
        rate = flood_rps or FLOOD_FACTOR * capacity
        senders = len(os.sched_getaffinity(0) if client_cpus is None else cpu_list(client_cpus))
        progress(f"overload drill: flooding {flooded} at {rate:.0f}/s over {FLOOD_TENANTS} tenants for {flood_s:g} s"
                 f" from {senders} process(es)" + (f" on CPU {client_cpus}" if client_cpus else ""))  # fmt: skip
        floods = [
            start_stream(work, f"flood-{k}", url, flood_route, flood, rate / senders, flood_s, keys, client_cpus)
            for k in range(senders)
        ]
        for proc, _ in floods:
            proc.wait()
        progress("overload drill: the fault has ended; watching the recovery")
        probe.wait()
        probe_records = json.loads(probe_out.read_text())
        flood_records = [r for _, out in floods for r in json.loads(out.read_text())]
    t1, t2, t3 = baseline_s, baseline_s + starve_s, baseline_s + starve_s + flood_s
    timeout_s = tier_timeout_s(protected)
    baseline = phase_report(probe_records, 0, t1, timeout_s)
    base_p99 = (baseline["p99_ms"] or 1.0) / 1000
    refusals = [r for r in probe_records + flood_records if r[2] not in (0, 200)]
    return {
        "protected_model": protected, "flooded_model": flooded, "models": n_models,
        "capacity_rps": round(capacity, 1), "flood_offered_rps": round(len(flood_records) / flood_s, 1),
        "flood_answered_rps": round(sum(1 for r in flood_records if r[2] == 200) / flood_s, 1),
        "flood": {"refusals": _codes([r for r in flood_records if r[2] not in (0, 200)]),
                  **refusal_times([r for r in flood_records if r[2] not in (0, 200)]),
                  "client_timeouts": sum(1 for r in flood_records if r[2] == 0),
                  "transport_failures": _codes([r for r in flood_records if r[2] == 0])},
        "probe_timeout_ms": round(timeout_s * 1000, 1),
        "probe": {"baseline": baseline, "starve": phase_report(probe_records, t1, t2, timeout_s),
                  "flood": phase_report(probe_records, t2, t3, timeout_s),
                  "recovery": phase_report(probe_records, t3, total, timeout_s)},
        # the probe's share answered within its timeout in each second of the flood (when the harm came)
        "probe_in_time_by_second": [phase_report(probe_records, t, t + 1, timeout_s)["answered_in_time_share"]
                                    for t in range(int(t2), int(t3))],
        "slowest_refusal_ms": _ms(max((r[1] for r in refusals), default=None)),
        # how late the senders wrote their requests against the schedule (their own lag, not the gateway's)
        "sender_lag_p99_ms": {"probe": _ms(pct([r[4] for r in probe_records], 0.99)),
                              "flood": _ms(pct([r[4] for r in flood_records], 0.99))},
        "recovered_after_s": recovered_at(probe_records, t3, total, base_p99),
        "close_wait": close_wait(port),
    }  # fmt: skip


def drill_keys(url: str) -> dict[str, str] | None:
    """Behind the edge (endpoints.json names its admin): a key for each of the drill's tenants, committed to the
    policy store in one version and revoked when the drill ends; once the edge takes them (within a second or two),
    the drill starts. None without an edge."""
    from datetime import UTC, datetime

    from gpu_runtime.live_traffic import wait_for_key
    from keel.home import KeelHome
    from keel.policies import PolicyStore
    from keel.tenants import issue_keys

    home = KeelHome.from_env()  # the runtime drilled: this replica's ($KEEL_REPLICA), else the single one
    if not json.loads(home.replica(os.environ.get("KEEL_REPLICA")).endpoints.read_text()).get("edge_admin"):
        return None
    with PolicyStore(home.policies) as store:
        keys = issue_keys(store, DRILL_TENANTS, datetime.now(UTC).isoformat(timespec="seconds"),
                          "keel overload drill", "the overload drill's tenants, for the drill's run")  # fmt: skip
    wait_for_key(url, keys["drill-probe"])  # (one commit: the others are in force with it)
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_runtime.overload_drill", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stream", help=argparse.SUPPRESS)  # one stream's own process
    parser.add_argument("--url", help="the gateway (default: the running runtime's, from endpoints.json)")
    parser.add_argument("--baseline-s", type=float, default=5.0)
    parser.add_argument("--starve-s", type=float, default=15.0)
    parser.add_argument("--flood-s", type=float, default=10.0)
    parser.add_argument("--recover-s", type=float, default=20.0)
    parser.add_argument(
        "--flood-rps", type=float, help=f"the flood's rate (default: {FLOOD_FACTOR:g}× the calibration)"
    )
    parser.add_argument("--client-cpus", default=default_client_cpus(),
                        help="pin the load generator to these CPUs (taskset's list: '1', '2-3'; default: the last "
                        "CPU of several — the runtime keeps the others, as a remote client would leave them; '' "
                        "not pinned)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the report here (JSON)")
    args = parser.parse_args(argv)
    if args.stream:
        return run_stream(args.stream)
    url = args.url
    if url is None:
        from keel.home import KeelHome

        url = "http://" + json.loads(KeelHome.from_env().serving.endpoints.read_text())["gateway"]
    port = int(url.rsplit(":", 1)[1].rstrip("/"))
    keys = drill_keys(url) if args.url is None else None
    try:
        report = drill(url, port, args.baseline_s, args.starve_s, args.flood_s, args.recover_s, keys=keys,
                       flood_rps=args.flood_rps, client_cpus=args.client_cpus or None)  # fmt: skip
    finally:
        if keys:
            from keel.home import KeelHome
            from keel.policies import PolicyStore
            from keel.tenants import revoke_keys

            with PolicyStore(KeelHome.from_env().policies) as store:
                revoke_keys(store, list(keys), "keel overload drill", "the drill is over: its keys revoked")
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
