"""The gateway app without a server or a Triton, for the request path's tests: a deployment of a use case's model with
a fake deployer (routing only), a request body of its reference defaults, and ``Asgi`` — one request through the
app's ASGI interface, as uvicorn makes it. ``silent_endpoint`` (tests/serving/conftest.py) is the hung Triton."""

from __future__ import annotations

import hashlib
import json
import time

import lightgbm as lgb
import numpy as np

from gpu_runtime.gateway.app import Gateway, GatewayConfig
from keel.deploy.fake import FakeDeployer
from keel.deploy.routing import Route, Target
from keel.usecase import resolve

FLIGHTS = resolve("flights")
HOTELS = resolve("hotels")


def small_model(n_features: int, objective: str) -> str:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, n_features))
    y = (x[:, 0] > 0).astype(float) if objective == "binary" else x[:, 0] * 10 + 100
    params = {"objective": objective, "num_leaves": 4, "verbose": -1, "seed": 1, "num_threads": 1}
    return lgb.train(params, lgb.Dataset(x, y), num_boost_round=5).model_to_string()


def deploy(tmp_path, usecase, triton_url: str, coarse: bool = False) -> GatewayConfig:
    model = usecase.model.name
    n = len(usecase.features.names)
    deployer = FakeDeployer(tmp_path / "routing" / f"{model}.json", n_features=n)
    main = Target(Route("champion", 1, hashlib.sha256(b"main").hexdigest(), 1.0, "rel-1"), "main")
    c = None
    if coarse:
        text = small_model(n, "binary" if usecase.features.label.task == "binary" else "regression")
        c = Target(Route("coarse", 9, hashlib.sha256(text.encode()).hexdigest(), 0.0, "rel-1"), text)
    deployer.deploy(model, [main], coarse=c)
    return GatewayConfig(triton_url=triton_url, routing_path=deployer.routing_path, usecase=usecase.name,
                         exposure_dir=tmp_path / "exposures")  # fmt: skip


def body_of(usecase) -> bytes:
    values = dict(zip(usecase.features.names, usecase.features.defaults.tolist(), strict=True))
    return json.dumps({"features": values, "unit_id": "u1"}).encode()


class Asgi:
    """One request through the app's ASGI interface, as uvicorn makes it (scope state from server.py)."""

    def __init__(self, app: Gateway):
        self.app = app
        self.body_reads = 0

    async def post(self, path: str, body: bytes, *, arrived: float | None = None, gone: bool = False,
                   headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:  # fmt: skip
        sent: list[dict] = []

        async def receive():
            self.body_reads += 1
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            sent.append(message)

        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        scope = {
            "type": "http", "method": "POST", "path": path, "headers": raw,
            "state": {"keel_arrived": time.monotonic() if arrived is None else arrived,
                      "keel_client_gone": lambda: gone},
        }  # fmt: skip
        await self.app(scope, receive, send)
        if not sent:
            return 0, {}, {}
        start = next(m for m in sent if m["type"] == "http.response.start")
        payload = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
        return start["status"], payload, {k.decode(): v.decode() for k, v in start["headers"]}
