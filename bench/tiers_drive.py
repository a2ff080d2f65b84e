"""bench/tiers.py's load: open-loop streams, each in a process of its own (``python bench/tiers_drive.py --drive
SPEC``: its stream from a JSON file, its counts out as JSON), and the closed-loop client of the unloaded phase.
Behind the edge each stream carries its tenant's API key."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLIENT_TIMEOUT_S = 5.0


def error_code(payload: bytes, status: int) -> str:
    """A refusal's code: the gateway's ``{"error": {"code": …}}``, the edge filter's ``{"error": "<code>"}``, or —
    Envoy's own plain-text answers — ``edge <status>``."""
    try:
        error = json.loads(payload).get("error")
    except (ValueError, AttributeError):
        return f"edge {status}"
    return error.get("code", str(status)) if isinstance(error, dict) else str(error or status)


async def drive(url: str, streams: list[tuple[str, str, list[bytes], float]], seconds: float,
                headers: dict[str, str] | None = None) -> dict:  # fmt: skip
    """Open-loop load: each stream (tier, route, bodies, rate) sends at its rate for ``seconds`` whatever the
    answers do. Per tier: sent, status counts, error codes, latencies (ms) of 200 answers."""
    import aiohttp

    out = {t: {"sent": 0, "ok": 0, "shed": 0, "other": 0, "codes": {}, "lat": []} for t, *_ in streams}
    connector = aiohttp.TCPConnector(limit=2048)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout) as client:

        async def one(tier: str, route: str, body: bytes) -> None:
            t0 = time.perf_counter()
            try:
                async with client.post(
                    route, data=body, headers={"content-type": "application/json"} | (headers or {})
                ) as r:
                    payload = await r.read()
                    status = r.status
            except Exception as exc:  # noqa: BLE001 - a client-side failure is counted, not fatal
                out[tier]["other"] += 1
                out[tier]["codes"][type(exc).__name__] = out[tier]["codes"].get(type(exc).__name__, 0) + 1
                return
            ms = (time.perf_counter() - t0) * 1000
            if status == 200:
                out[tier]["ok"] += 1
                out[tier]["lat"].append(ms)
                return
            code = error_code(payload, status)
            out[tier]["shed" if code == "shed" else "other"] += 1
            out[tier]["codes"][code] = out[tier]["codes"].get(code, 0) + 1

        async def stream(tier: str, route: str, bodies: list[bytes], rate: float) -> list[asyncio.Task]:
            tasks, start, i = [], time.perf_counter(), 0
            while (now := time.perf_counter() - start) < seconds:
                due = int(now * rate)
                while i < due:
                    tasks.append(asyncio.create_task(one(tier, route, bodies[i % len(bodies)])))
                    out[tier]["sent"] += 1
                    i += 1
                await asyncio.sleep(0.002)
            return tasks

        all_tasks = await asyncio.gather(*(stream(*s) for s in streams))
        await asyncio.gather(*(t for ts in all_tasks for t in ts))
    return out


def drive_in_own_process(home: Path, url: str, streams: list[tuple[str, str, list[bytes], float]],
                         seconds: float, keys: dict[str, str] | None = None) -> dict:  # fmt: skip
    """``drive`` with each stream in a child process of its own (``bench/tiers.py --drive SPEC``; streams in, counts
    out, as JSON files): the flood's client loop never delays the L1 client's reading of its answers."""
    children = []
    for i, (tier, route, bodies, rate) in enumerate(streams):
        spec = home / f"drive-{i}.json"
        spec.write_text(json.dumps({"url": url, "seconds": seconds, "key": (keys or {}).get(tier),
                                    "streams": [[tier, route, [b.decode() for b in bodies], rate]]}))  # fmt: skip
        children.append((spec, subprocess.Popen([sys.executable, __file__, "--drive", str(spec)])))
    import httpx

    seen: dict[str, list[float]] = {}  # the limiter's gauges, once a second while the load runs
    while any(child.poll() is None for _, child in children):
        try:
            text = httpx.get(f"{url}/metrics", timeout=5).text
        except httpx.HTTPError:
            text = ""
        for line in text.splitlines():
            name = line.split(" ")[0].split("{")[0]  # one series per worker when the gateway has several
            if name in ("keel_gateway_concurrency_limit", "keel_gateway_lower_tier_share", "keel_gateway_in_flight",
                        "keel_gateway_standing_queue", "keel_gateway_cpu_pressure"):  # fmt: skip
                seen.setdefault(name, []).append(float(line.split(" ")[1]))
        time.sleep(1.0)
    out: dict = {
        "limiter": {k.removeprefix("keel_gateway_"): round(statistics.median(v), 3) for k, v in seen.items()}
    }
    for spec, child in children:
        if child.wait() != 0:
            raise RuntimeError(f"the load generator {spec} failed")
        out |= json.loads(spec.with_suffix(".out.json").read_text())
    return out


def drive_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    streams = [(t, r, [b.encode() for b in bodies], rate) for t, r, bodies, rate in spec["streams"]]
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    headers = {"x-api-key": spec["key"]} if spec.get("key") else None
    result = run(drive(spec["url"], streams, spec["seconds"], headers))
    Path(spec_path).with_suffix(".out.json").write_text(json.dumps(result))
    return 0


def closed_loop(url: str, route: str, bodies: list[bytes], n: int, key: str | None = None) -> list[float]:
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        conn.request("POST", route, bodies[i % len(bodies)],
                     {"Content-Type": "application/json"} | ({"x-api-key": key} if key else {}))  # fmt: skip
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        lat.append((time.perf_counter() - t0) * 1000)
    return lat


if __name__ == "__main__":
    sys.exit(drive_main(sys.argv[sys.argv.index("--drive") + 1]))
