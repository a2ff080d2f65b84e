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

Each stream runs in a process of its own (gpu_runtime/overload_load.py), so no client loop delays another's answers, and every
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_runtime.overload_load import (
    CLIENT_TIMEOUT_S,
    api_key,
    cpu_list,
    default_client_cpus,
    start_stream,
)
from gpu_runtime.overload_report import _codes, _ms, close_wait, pct, phase_report, recovered_at, refusal_times

PROBE_RPS = 40.0
FLOOD_FACTOR = 10.0
FLOOD_TENANTS = 64
BUSY = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True: pass"


def calibrate(
    url: str,
    route: str,
    bodies: list[bytes],
    seconds: float = 2.0,
    concurrency: int = 16,
    keys: dict[str, str] | None = None,
) -> float:
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
    return [
        json.dumps({"entities": [r], "tenant_id": "drill-probe", "risk_level": 2}, default=str).encode() for r in rows
    ]


def flood_bodies(model: str, n: int = 2000) -> list[bytes]:
    return [
        b.replace(b'"drill-probe"', f'"drill-flood-{i % FLOOD_TENANTS}"'.encode())
        for i, b in enumerate(bodies_of(model, n))
    ]


DRILL_TENANTS = ["drill-probe", *(f"drill-flood-{i}" for i in range(FLOOD_TENANTS))]


def drill(
    url: str,
    port: int,
    baseline_s: float,
    starve_s: float,
    flood_s: float,
    recover_s: float,
    progress=print,
    keys: dict[str, str] | None = None,
    flood_rps: float | None = None,
    client_cpus: str | None = None,
    probe_url: str | None = None,
) -> dict:
    """``probe_url``: where the L1 probe goes (L1's own door at the edge, keel/edge/door.py), else ``url``."""
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
        probe, probe_out = start_stream(
            work, "probe", probe_url or url, probe_route, bodies_of(protected), PROBE_RPS, total, keys, client_cpus
        )
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
        progress(
            f"overload drill: flooding {flooded} at {rate:.0f}/s over {FLOOD_TENANTS} tenants for {flood_s:g} s"
            f" from {senders} process(es)" + (f" on CPU {client_cpus}" if client_cpus else "")
        )
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
        "probe_url": probe_url or url,
        "protected_model": protected,
        "flooded_model": flooded,
        "models": n_models,
        "capacity_rps": round(capacity, 1),
        "flood_offered_rps": round(len(flood_records) / flood_s, 1),
        "flood_answered_rps": round(sum(1 for r in flood_records if r[2] == 200) / flood_s, 1),
        "flood": {
            "refusals": _codes([r for r in flood_records if r[2] not in (0, 200)]),
            **refusal_times([r for r in flood_records if r[2] not in (0, 200)]),
            "client_timeouts": sum(1 for r in flood_records if r[2] == 0),
            "transport_failures": _codes([r for r in flood_records if r[2] == 0]),
        },
        "probe_timeout_ms": round(timeout_s * 1000, 1),
        "probe": {
            "baseline": baseline,
            "starve": phase_report(probe_records, t1, t2, timeout_s),
            "flood": phase_report(probe_records, t2, t3, timeout_s),
            "recovery": phase_report(probe_records, t3, total, timeout_s),
        },
        # the probe's share answered within its timeout in each second of the flood (when the harm came)
        "probe_in_time_by_second": [
            phase_report(probe_records, t, t + 1, timeout_s)["answered_in_time_share"]
            for t in range(int(t2), int(t3))
        ],
        "slowest_refusal_ms": _ms(max((r[1] for r in refusals), default=None)),
        # how late the senders wrote their requests against the schedule (their own lag, not the gateway's)
        "sender_lag_p99_ms": {
            "probe": _ms(pct([r[4] for r in probe_records], 0.99)),
            "flood": _ms(pct([r[4] for r in flood_records], 0.99)),
        },
        "recovered_after_s": recovered_at(probe_records, t3, total, base_p99),
        "close_wait": close_wait(port),
    }


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
        keys = issue_keys(
            store,
            DRILL_TENANTS,
            datetime.now(UTC).isoformat(timespec="seconds"),
            "keel overload drill",
            "the overload drill's tenants, for the drill's run",
        )
    wait_for_key(url, keys["drill-probe"])  # (one commit: the others are in force with it)
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_runtime.overload_drill", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", help="the gateway (default: the running runtime's, from endpoints.json)")
    parser.add_argument("--baseline-s", type=float, default=5.0)
    parser.add_argument("--starve-s", type=float, default=15.0)
    parser.add_argument("--flood-s", type=float, default=10.0)
    parser.add_argument("--recover-s", type=float, default=20.0)
    parser.add_argument(
        "--flood-rps", type=float, help=f"the flood's rate (default: {FLOOD_FACTOR:g}× the calibration)"
    )
    parser.add_argument(
        "--client-cpus",
        default=default_client_cpus(),
        help="pin the load generator to these CPUs (taskset's list: '1', '2-3'; default: the last "
        "CPU of several — the runtime keeps the others, as a remote client would leave them; '' "
        "not pinned)",
    )
    parser.add_argument("--out", type=Path, help="write the report here (JSON)")
    args = parser.parse_args(argv)
    url, probe_url = args.url, None
    if url is None:
        from keel.home import KeelHome

        endpoints = json.loads(KeelHome.from_env().serving.endpoints.read_text())
        url = "http://" + endpoints["gateway"]
        probe_url = "http://" + endpoints["edge_l1"] if endpoints.get("edge_l1") else None  # L1's own door
    port = int(url.rsplit(":", 1)[1].rstrip("/"))
    keys = drill_keys(url) if args.url is None else None
    try:
        report = drill(
            url,
            port,
            args.baseline_s,
            args.starve_s,
            args.flood_s,
            args.recover_s,
            keys=keys,
            flood_rps=args.flood_rps,
            client_cpus=args.client_cpus or None,
            probe_url=probe_url,
        )
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
