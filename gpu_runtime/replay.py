"""Replay load: a use case's real requests (its ``replay`` declaration, keel/usecase.py) sent to the gateway at a
fixed rate, from a process of its own.

    .venv/bin/python -m gpu_runtime.replay --url http://127.0.0.1:8080 --rps 200 --seconds 60 \
        [--usecase NAME] [--month YYYY-MM] [--out results.jsonl] [--max-in-flight 256] [--tenants ops,pricing]
    .venv/bin/python -m gpu_runtime.replay --url http://127.0.0.1:8080 --live [--rps 25]

Requests go to ``POST /v1/models/{model}/predict``, one entity each. ``--live`` (gpu_runtime/live_traffic.py) follows the live replay's simulated
clock (``$KEEL_HOME/clock.json``) instead: each request asks about an entity of the simulated day (the day's
entities in order, cycled), at ``--rps`` while the clock runs, none while it is paused, until the clock reaches its
end; its running totals (sent, ok, failed by status, error and simulated month, versions seen) are rewritten every
few seconds to ``$KEEL_HOME/serving/live_traffic/<use case>.json`` for the platform's summary.
On a **stepped** clock (keel/clock.py) each step's traffic phase sends ``--per-day`` of the day's entities, spread
over the day (``day_sample``), waits for every answer and writes the summary with ``step`` for the driver.

Open loop: request i is sent at start + i / rps whether or not earlier ones were answered (a slow server shows up
as latency, not as a politely lower rate), bounded by ``--max-in-flight`` and ``--seconds``. The entities are the
month's (``--month``, default the middle month of the use case's period), cycled; each carries the entity's ``unit_of``
as ``unit_id`` and the tenant whose turn it is (``--tenants``: request i is the (i mod n)-th's; default ``replay``).
One JSON line per request goes to ``--out`` (status, model_version, x-model-signature, latency), the summary to
stdout. TERM (whatever was inherited: keel/signals.py) or Ctrl-C stops sending; requests in flight finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from pathlib import Path

from gpu_runtime.live_traffic import key_headers, live
from keel.signals import restore_default_signals


def _usecase(name: str | None):
    from keel.usecase import UseCaseError, get, only

    try:
        uc = get(name) if name else only()
    except UseCaseError as exc:  # an unknown name, or several installed and none named: say which exist
        raise SystemExit(f"replay: {exc} (--usecase)") from None
    if uc.replay is None:
        raise SystemExit(f"replay: the {uc.name} use case declares no replay (UseCase.replay)")
    return uc


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def run(
    url: str,
    uc,
    entities: list[dict],
    rps: float,
    seconds: float,
    max_in_flight: int,
    out: Path | None,
    tenants: tuple[str, ...] = ("replay",),
):
    import aiohttp  # lighter per request than httpx: the load generator should not eat the CPU it measures

    results: list[dict] = []
    sem = asyncio.Semaphore(max_in_flight)
    total = int(rps * seconds)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    timeout = aiohttp.ClientTimeout(total=10.0)
    headers = key_headers(tenants)
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout) as client:
        route = f"/v1/models/{uc.model.name}/predict"

        async def one(i: int) -> None:
            entity = entities[i % len(entities)]
            body = {
                "entities": [entity],
                "tenant_id": tenants[i % len(tenants)],
                "risk_level": 2,
                "unit_id": uc.replay.unit_of(entity),
            }
            t0 = time.perf_counter()
            try:
                async with client.post(route, json=body, headers=headers[body["tenant_id"]]) as resp:
                    payload = await resp.json()
                    latency = time.perf_counter() - t0
                    results.append(
                        {
                            "i": i,
                            "tenant_id": body["tenant_id"],
                            "status": resp.status,
                            "model_version": payload.get("model_version"),
                            "signature": resp.headers.get("x-model-signature"),
                            "degraded": payload.get("degraded"),
                            "error": (payload.get("error") or {}).get("code"),
                            "latency_ms": latency * 1000,
                            "sent_at_s": t0,
                        }
                    )
            except Exception as exc:  # noqa: BLE001 - a transport failure is a failed request, recorded
                results.append(
                    {
                        "i": i,
                        "tenant_id": body["tenant_id"],
                        "status": 0,
                        "error": type(exc).__name__,
                        "latency_ms": None,
                    }
                )
            finally:
                sem.release()

        stop = asyncio.Event()  # SIGTERM / Ctrl-C: stop sending, let what is in flight finish, report
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        start = time.perf_counter()
        tasks = []
        for i in range(total):
            delay = start + i / rps - time.perf_counter()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
            if stop.is_set():
                break
            await sem.acquire()
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        elapsed = time.perf_counter() - start
    for r in results:
        if "sent_at_s" in r:
            r["sent_at_s"] = round(r["sent_at_s"] - start, 4)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as fh:
            for r in sorted(results, key=lambda r: r["i"]):
                fh.write(json.dumps(r) + "\n")
    lat = [r["latency_ms"] for r in results if r["status"] == 200]
    versions: dict[str, int] = {}
    by_tenant: dict[str, int] = {}
    for r in results:
        by_tenant[r["tenant_id"]] = by_tenant.get(r["tenant_id"], 0) + 1
        if r["status"] == 200:
            versions[str(r["model_version"])] = versions.get(str(r["model_version"]), 0) + 1
    return {
        "sent": len(tasks),
        "stopped_early": len(tasks) < total,
        "answered": len(results),
        "ok": sum(1 for r in results if r["status"] == 200),
        "failed": sum(1 for r in results if r["status"] != 200),
        "elapsed_s": round(elapsed, 3),
        "achieved_rps": round(len(results) / elapsed, 1),
        "p50_ms": round(statistics.median(lat), 3) if lat else None,
        "p99_ms": round(percentile(lat, 0.99), 3) if lat else None,
        "versions": versions,
        "by_tenant": by_tenant,
    }


def main(argv: list[str] | None = None) -> int:
    restore_default_signals()
    parser = argparse.ArgumentParser(prog="python -m gpu_runtime.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8080")
    parser.add_argument("--rps", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--usecase", help="whose traffic (default: the installed use case)")
    parser.add_argument("--month", help="the month to replay (default: the middle month of the use case's period)")
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--live", action="store_true", help="follow the live replay's clock (see above)")
    parser.add_argument("--per-day", type=int, default=175, help="--live on a stepped clock: requests per "
                        "simulated day (default 175: 40 req/s at the default speed)")  # fmt: skip
    parser.add_argument(
        "--tenants", default="replay", help="comma-separated tenant ids, taking turns request by request"
    )
    args = parser.parse_args(argv)
    tenants = tuple(t for t in args.tenants.split(",") if t)
    if not tenants:
        parser.error("--tenants needs at least one tenant id")
    if not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        print("replay: refusing a non-loopback target; this load generator is for local runs", file=sys.stderr)
        return 2
    uc = _usecase(args.usecase)
    if args.live:
        from keel.home import KeelHome

        home = KeelHome.from_env()
        print(f"replay: live traffic at {args.rps:g} req/s while the simulated clock runs (a stepped clock: "
              f"{args.per_day} requests per simulated day)", flush=True)  # fmt: skip
        summary = asyncio.run(live(args.url, uc, home, args.rps, args.max_in_flight, tenants, args.per_day))
        print(json.dumps(summary), flush=True)
        return 0 if summary["failed"] == 0 else 1
    month = args.month or (uc.months[(len(uc.months) - 1) // 2] if uc.months else None)
    if month is None:
        parser.error(f"the {uc.name} use case declares no period: pass --month")
    entities = uc.replay.requests(month)
    if not entities:
        parser.error(f"the {uc.name} use case has no requests for {month}")
    print(f"replay: {len(entities):,} {uc.features.entity.name} requests of {month}, {args.rps:g} req/s for "
          f"{args.seconds:g} s", flush=True)  # fmt: skip
    summary = asyncio.run(run(args.url, uc, entities, args.rps, args.seconds, args.max_in_flight, args.out, tenants))
    print(json.dumps(summary), flush=True)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
