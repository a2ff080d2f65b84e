"""Where the gateway's batch-1 overhead goes (bench/serving.py's last part, and its ``--profile``): the gateway's own
code (a ``Gateway`` in this process, ``predict`` timed minus its Triton call, same body), the HTTP hop (uvicorn with
the same settings serving a constant answer to the same client), and — what bench/serving.py computes from them —
the remainder: the scheduling cost of one more process in the chain on the machine's cores."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

from gpu_runtime.triton import free_port

MODEL = "flight-delay"  # the flights use case's model, as bench/serving.py serves it

FLOOR_APP = """
import sys, orjson, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    data = orjson.dumps({"request_id": "0" * 32, "score": 0.5, "confidence_score": 0.0})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def http_floor(bodies: list[bytes]) -> list[float]:
    """The HTTP hop alone: the same client and bodies against uvicorn answering a constant (no gateway code)."""
    port = free_port()
    app = subprocess.Popen([sys.executable, "-c", FLOOR_APP, str(port)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port)
                conn.connect()
                break
            except ConnectionRefusedError:
                assert app.poll() is None and time.monotonic() < deadline, "the constant-answer server did not start"
                time.sleep(0.1)
        out = []
        for body in bodies:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
            json.loads(conn.getresponse().read())
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        app.terminate()
        app.wait(timeout=30)


def gateway_code(home: Path, triton_grpc: str, bodies: list[bytes]) -> list[float]:
    """The gateway's own time per request: ``Gateway.predict`` in this process minus its Triton calls (ms)."""

    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from keel.policies.gateway import GatewayPolicy, RateLimit

    root = home / "serving"
    gw = Gateway(
        GatewayConfig(
            triton_url=triton_grpc,
            routing_path=root / "routing" / f"{MODEL}.json",
            usecase="flights",
            exposure_dir=home / "bench-exposures",
            online_store_path=home / "online" / "flights.sqlite",
            policy_store_path=home / "policies.sqlite",
        ),
        GatewayPolicy(default_rate_limit=RateLimit(1e9, 1e9)),  # the loop is faster than the default limit
    )
    infer_s: list[float] = []
    scorer = gw.model().scorer
    timed = scorer.infer

    async def infer(*a, **k):
        t0 = time.perf_counter()
        try:
            return await timed(*a, **k)
        finally:
            infer_s.append(time.perf_counter() - t0)

    scorer.infer = infer  # type: ignore[method-assign]

    async def run() -> list[float]:
        gw.model().follow()
        gw.watching = True  # as under uvicorn's lifespan: the watcher follows routing, not requests
        out = []
        for body in bodies:
            infer_s.clear()
            t0 = time.perf_counter()
            status, payload, _ = await gw.predict(body, {})
            total = time.perf_counter() - t0
            assert status == 200, payload
            out.append((total - sum(infer_s)) * 1000)
        gw.watching = False
        await gw.close()
        return out

    try:
        import uvloop

        return uvloop.run(run())
    except ImportError:
        return asyncio.run(run())


def profile_gateway(home: Path, triton_grpc: str, *body_sets: list[bytes]) -> int:
    """Where the gateway's time goes at batch 256 (``--profile``): cProfile over ``gateway_code`` per body set."""
    import cProfile
    import pstats

    for bodies in body_sets:
        profiler = cProfile.Profile()
        profiler.enable()
        gateway_code(home, triton_grpc, bodies)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)  # and where the time is spent itself
    return 0
