"""Throughput at a latency bound: the highest open-loop rate of flights requests (batch 1, through the gateway with
contract validation and the online store) that one machine answers with p99 ≤ ``--p99-ms`` and ≥ 99 % answered —
for this tree's model runtime and, in the same run, another tree's (``--against``: a worktree of an earlier commit),
alternating tree by tree at each rate.

The same model (LightGBM trained here on real January 2013 flights) and the same February flights for both; each
runtime is the real ``python -m gpu_runtime.serve`` (Triton + the gateway, its default workers) started from its own
tree, in a throwaway KEEL_HOME; the load generator is a process of its own (open loop: requests leave on schedule
whatever the answers do; client timeout 5 s). Per tree and rate: offered, answered share, p50/p99; then the highest
rate that met the bound.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/throughput.py --against /tmp/before [--rates 200,400,...] [--seconds 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_runtime.triton import free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEPLOY = """
import hashlib, json, sys
from pathlib import Path
from gpu_runtime.triton import TritonControl
from keel.deploy.routing import Route, Target
from resources.triton import TritonResource
from usecases.flights.features import FEATURE_NAMES
home = Path(sys.argv[1])
ep = json.loads((home / "serving" / "endpoints.json").read_text())
text = (home / "bench-model.txt").read_text()
sha = hashlib.sha256(text.encode()).hexdigest()
resource = TritonResource(serving_dir=str(home / "serving"), drain_s=0.3)
control = TritonControl(ep["triton_grpc"], ep["admin_key"])
resource.deployer("flight-delay", len(FEATURE_NAMES), control=control).deploy(
    "flight-delay", [Target(Route("champion", 1, sha, 1.0, "rel-bench"), text)])
"""
RATES = (200, 400, 600, 800, 1000, 1200, 1500, 2000)


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_runtime(tree: Path, home: Path, text: str) -> tuple[subprocess.Popen, str]:
    """The model runtime of ``tree`` on ``home`` with ``text`` deployed as version 1; (its process, its URL)."""
    env = os.environ | {"KEEL_HOME": str(home), "KEEL_USECASES": "flights", "PYTHONPATH": str(tree)}
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    port = free_port()
    endpoints = home / "serving" / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(port)], cwd=tree,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    while not endpoints.exists():
        assert proc.poll() is None, f"gpu_runtime.serve of {tree} exited"
        time.sleep(0.1)
    # deployed by the tree's own code: its routing table is what its gateway reads (an earlier tree's lacks fields)
    (home / "bench-model.txt").write_text(text)
    subprocess.run([sys.executable, "-c", DEPLOY, str(home)], cwd=tree, env=env, check=True)
    import httpx

    url = f"http://127.0.0.1:{port}"
    ok, deadline = 0, time.monotonic() + 120
    while ok < 10:  # ready on ten new connections in a row: every worker follows the table
        r = httpx.get(f"{url}/readyz", timeout=5)
        ok = ok + 1 if r.status_code == 200 else 0
        assert time.monotonic() < deadline, r.text
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    import signal

    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def median_run(runs: list[dict]) -> dict:
    """The run of median p99 (a run with no answers counts as the slowest), with how many runs there were."""
    ordered = sorted(runs, key=lambda r: float("inf") if r["p99"] is None else r["p99"])
    return ordered[(len(ordered) - 1) // 2] | {"runs": len(runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another tree (a worktree of an earlier commit) to measure too")
    parser.add_argument("--rates", default=",".join(map(str, RATES)), help="requests per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="each rate's duration")
    parser.add_argument("--p99-ms", type=float, default=10.0)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per tree and rate (alternating trees); the table gives the median run by p99",
    )
    args = parser.parse_args()
    serving, tiers = load("serving"), load("tiers")
    rates = [float(r) for r in args.rates.split(",")]
    trees = {"this tree": REPO} | ({f"against ({args.against})": args.against} if args.against else {})
    work = Path(tempfile.mkdtemp(prefix="keel-bench-throughput-"))
    print(f"bench/throughput: training the model and building the store in {work} …", flush=True)
    base = work / "base"
    base.mkdir()
    texts, feb = serving.setup(base)
    bodies = [json.dumps({"flights": [serving.flight_of(r)], "unit_id": r["flight_id"]}).encode()
              for r in feb.head(5000).to_dicts()]  # fmt: skip
    runs: dict[str, dict[float, list[dict]]] = {name: {} for name in trees}
    for rate, attempt in [(rate, i) for rate in rates for i in range(args.repeat)]:
        for name, tree in trees.items():
            home = work / f"{name.split()[0]}-{int(rate)}-{attempt}"
            subprocess.run(["cp", "-r", str(base), str(home)], check=True)
            proc, url = start_runtime(tree, home, texts[0])
            try:
                tiers.closed_loop(url, "/v1/predict", bodies, 200)  # warm-up
                out = tiers.drive_in_own_process(home, url, [("L2", "/v1/predict", bodies, rate)], args.seconds)
            finally:
                stop(proc)
            r = out["L2"]
            p99 = tiers.pct(r["lat"], 0.99)
            run = {"sent": r["sent"], "answered": r["ok"] / max(r["sent"], 1), "p50": tiers.pct(r["lat"], 0.5),
                   "p99": p99, "codes": r["codes"]}  # fmt: skip
            runs[name].setdefault(rate, []).append(run)
            print(f"  {name} {rate:g}/s: answered {run['answered']:.1%}, p99 "
                  f"{p99 if p99 is None else f'{p99:.1f}'} ms", flush=True)  # fmt: skip
    results = {name: {rate: median_run(rs) for rate, rs in by_rate.items()} for name, by_rate in runs.items()}
    print()
    print(f"(the median of {args.repeat} run(s) per tree and rate, by p99)" if args.repeat > 1 else "")
    print("| tree | rate /s | offered | answered | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for name, by_rate in results.items():
        for rate, r in by_rate.items():
            p50, p99 = r["p50"], r["p99"]
            print(f"| {name} | {rate:g} | {r['sent']} | {r['answered']:.1%} | "
                  f"{'–' if p50 is None else f'{p50:.2f}'} | {'–' if p99 is None else f'{p99:.2f}'} |")  # fmt: skip
    print()
    for name, by_rate in results.items():
        met = [rate for rate, r in by_rate.items() if r["answered"] >= 0.99 and r["p99"] is not None
               and r["p99"] <= args.p99_ms]  # fmt: skip
        print(f"{name}: the highest rate answered with p99 ≤ {args.p99_ms:g} ms and ≥ 99 % answered: "
              f"{max(met) if met else 'none of the rates'}{'/s' if met else ''}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
