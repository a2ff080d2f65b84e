"""The model runtime under test: a real Triton (the build from nvidia-pytriton, .keel-triton) and the real gateway process,
serving LightGBM models trained here on real January 2013 features, with a real online store snapshot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import date
from pathlib import Path

import httpx
import lightgbm as lgb
import numpy as np
import polars as pl
import pytest

from gpu_runtime.triton import TritonControl, free_port
from keel.deploy.routing import Route, Target
from keel.features.sqlite_store import SQLiteOnlineStore
from keel.home import KeelHome
from keel.policies.gateway import DEFAULT_TIERS
from keel.registry import ModelRegistry
from keel.training.model import TrainingConfig, train_model
from resources.triton import TritonResource
from tests import REPO
from tests.features.conftest import validated  # noqa: F401 - shared session fixture
from usecases.flights.features import FEATURE_NAMES, FLIGHT_FEATURES, build_views, offline_features

AS_OF = date(2013, 2, 15)
MODEL = "flight-delay"


@pytest.fixture(scope="session")
def serving_models(validated):  # noqa: F811
    """Three real models (different seeds and leaves) registered as versions 1, 2, 3, and February test rows."""
    feats = offline_features(validated["flights"], validated["weather"], validated["planes"], validated["flights"])
    texts = []
    for seed, leaves in ((2013, 31), (7, 15), (11, 63)):
        config = TrainingConfig(train_months=("2013-01",), valid_month="2013-02")
        config = replace(config, params={**config.params, "seed": seed, "num_leaves": leaves})
        texts.append(train_model(feats, config, FLIGHT_FEATURES).text)
    feb = feats.filter(pl.col("sched_date") >= AS_OF).sort("flight_id")
    return texts, feb


@pytest.fixture(scope="module")
def runtime_home(tmp_path_factory, validated, serving_models):  # noqa: F811
    home = tmp_path_factory.mktemp("keel_home")
    store = SQLiteOnlineStore(home / "online" / "flights.sqlite", features=FLIGHT_FEATURES)
    store.write_snapshot(
        build_views(validated["weather"], validated["planes"], validated["flights"], as_of=AS_OF),
        as_of=AS_OF,
        partition="2013-02",
    )
    store.close()
    registry = ModelRegistry(home / "registry")
    for i, text in enumerate(serving_models[0]):
        registry.register(MODEL, text, {"note": f"serving test model {i + 1}"})
    registry.close()
    return home


GENEROUS_TIERS = {
    name: {"p99_ms": t.p99_ms, "availability": t.availability, "timeout_ms": 30_000.0}
    for name, t in DEFAULT_TIERS.items()
}


# The gateway policy of the tests that count lost requests under replayed load (hot swaps, canaries, experiments):
# lanes and timeouts so generous that a slow, shared machine makes requests wait instead of shedding them. What
# those tests count is requests lost to a swap, a rollout or a rollback — not load shedding, which
# tests/serving/test_gateway.py tests on purpose. A swap that broke requests still fails them: errors are not waits.
PATIENT = {
    "lanes": {1: 1024, 2: 1024, 3: 1024},
    "admit_in_flight": {"L1": 4096, "L2": 4096, "L3": 4096},
    "tiers": {
        name: {"p99_ms": p99, "availability": 0.99, "timeout_ms": 30_000.0}
        for name, p99 in (("L1", 15.0), ("L2", 50.0), ("L3", 250.0))
    },
}


def start_serve(
    home: Path, policy: dict | None = None, *, replica: str | None = None, env: dict | None = None,
    tier_timeouts: bool = False,
) -> tuple[subprocess.Popen, dict]:  # fmt: skip
    """``python -m gpu_runtime.serve`` on ``home`` (its runtime ``replica`` of several, when given; ``env``: more
    settings, such as the shared stores); returns once it announced its endpoints.

    Every request has a deadline, its tier's timeout (100–1000 ms). The tests that count answers to routing, swaps,
    policies or rollouts are not about deadlines, and on a busy CI machine a request can wait longer than that: they
    run with the tiers' targets as they are and their timeouts at 30 s (``GENEROUS_TIERS``) unless the policy names
    its tiers. ``tier_timeouts``: the real timeouts (the overload drill, deadline tests)."""
    if not tier_timeouts and "tiers" not in (policy or {}):
        policy = (policy or {}) | {"tiers": GENEROUS_TIERS}
    # the serving tests' world is flights' model (those of a second use case add it through ``env``)
    # one gateway process unless a test asks for workers (tests/serving/test_workers.py)
    env = os.environ | {"KEEL_HOME": str(home), "KEEL_USECASES": "flights", "KEEL_GATEWAY_WORKERS": "1"} | (env or {})
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    if replica:
        env["KEEL_REPLICA"] = replica
    args = [sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(free_port())]
    if policy is not None:
        (home / "policy.yaml").write_text(json.dumps(policy))  # JSON is YAML
        args += ["--policy", str(home / "policy.yaml")]
    layout = KeelHome(home).replica(replica)
    endpoints = layout.endpoints
    endpoints.unlink(missing_ok=True)
    log = open(home / f"serve{'-' + replica if replica else ''}.log", "ab")
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not endpoints.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"gpu_runtime.serve did not come up:\n{Path(log.name).read_text()[-3000:]}")
        time.sleep(0.1)
    return proc, json.loads(endpoints.read_text())


def stop_serve(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


class Runtime:
    """A running serve process and what a test needs to drive it."""

    def __init__(self, home: Path, proc: subprocess.Popen, endpoints: dict, texts: list[str]):
        self.home, self.proc, self.endpoints, self.texts = home, proc, endpoints, texts
        self.headers: dict[
            str, str
        ] = {}  # behind the edge: the tenant's API key (tests/serving/test_hostile_edge.py)
        self.url = f"http://{endpoints['gateway']}"
        self.resource = TritonResource(serving_dir=str(home / "serving"), drain_s=0.5)
        self.control = TritonControl(endpoints["triton_grpc"], endpoints["admin_key"])
        registry = ModelRegistry(home / "registry")
        self.shas = [registry.get(MODEL, s).sha256 for s in (_sha(t) for t in texts)]
        registry.close()

    def target(self, version: int, name: str = "champion", weight: float = 1.0, text: str | None = None) -> Target:
        sha = self.shas[version - 1]
        return Target(
            Route(name, version, sha, weight, release_id=f"rel-test-v{version}"), text or self.texts[version - 1]
        )

    def deployer(self, **serving_parameters: str):
        d = self.resource.deployer(MODEL, len(FEATURE_NAMES), control=self.control)
        if serving_parameters:
            d.serving = replace(d.serving, parameters=serving_parameters)
        return d

    def post(self, body: dict, headers: dict | None = None) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/predict", json=body, headers=self.headers | (headers or {}), timeout=10)

    def wait_ready(self, timeout: float = 30) -> None:
        """Until the gateway is ready on the routing table the last deploy wrote (not an older one it still holds:
        a deploy of a further version leaves /readyz at 200 on the previous table until the gateway's next poll)."""
        from keel.deploy.routing import RoutingTable

        written = RoutingTable.read(self.deployer().routing_path)
        deadline = time.monotonic() + timeout
        while True:
            r = httpx.get(f"{self.url}/readyz", timeout=5)
            body = r.json()
            body = body.get("models", {}).get(MODEL, body)  # a process serving several models: this one's
            if r.status_code == 200 and (written is None or body.get("generation", -1) >= written.generation):
                return
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)


@contextmanager
def serving_version_1(home: Path, texts: list[str], policy: dict | None = None, env: dict[str, str] | None = None,
                      headers: dict[str, str] | None = None):  # fmt: skip
    """A running serve process on ``home`` with model version 1 deployed and ready; stopped afterwards (also when
    a test replaced ``proc`` with a serve process of its own). ``headers``: sent with every request (a key)."""
    proc, endpoints = start_serve(home, policy, env=env)
    rt = Runtime(home, proc, endpoints, texts)
    rt.headers = headers or {}
    try:
        report = rt.deployer().deploy(MODEL, [rt.target(1)])
        assert report.loaded == (1,)
        rt.wait_ready()
        yield rt
    finally:
        stop_serve(rt.proc)


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def request_body(row: dict, **extra) -> dict:
    flight = {k: row[k] for k in ("carrier", "origin", "dest", "tailnum", "hour")}
    d = row["sched_date"]
    flight |= {
        "year": d.year,
        "month": d.month,
        "day": d.day,
        "flight": int(row["flight_id"].split("-")[4]),  # flight_id = date-carrier-flight-origin-sched_dep_time
        "distance": float(row["distance"]),
        "time_hour": row["time_hour"].strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return {"flight": flight, "tenant_id": "tests", "risk_level": 2, "unit_id": row["flight_id"], **extra}


def local_scores(text: str, feature_rows: pl.DataFrame) -> np.ndarray:
    """What the model says in-process for the same feature values (NaN → the reference default, as the gateway)."""
    from usecases.flights.features import FEATURES

    x = feature_rows.select([pl.col(n).cast(pl.Float64) for n in FEATURE_NAMES]).to_numpy()
    defaults = np.array([f.default for f in FEATURES])
    x = np.where(np.isnan(x), defaults, x).astype(np.float32).astype(np.float64)
    return lgb.Booster(model_str=text).predict(x)


SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an HTTP/2 SETTINGS frame, empty
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"


@pytest.fixture
def silent_endpoint():
    """An HTTP/2 endpoint that completes the connection's handshake and never answers a call: a hung Triton, as the
    gRPC client meets it (each call runs into its timeout: DEADLINE_EXCEEDED)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
                conn.sendall(SETTINGS + SETTINGS_ACK)
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for s in held:
        s.close()
    server.close()
