"""keel's native Triton backend (gpu_runtime/backend/keel_lightgbm.cc) in the real Triton binary, on real models and
real February 2013 flights: it answers what LightGBM answers in process (scores, TreeSHAP contributions and raw
scores, |Δ| ≤ 1e-6), refuses a model file that does not hash to its registered sha256, fails the same inputs as the
Python backend under an injected partial fault, and reports Triton's statistics that metering reads."""

from __future__ import annotations

import hashlib
import subprocess
import time
import zlib

import lightgbm as lgb
import numpy as np
import polars as pl
import pytest
import tritonclient.grpc as grpcclient

from gpu_runtime.repository import NATIVE_BACKEND, ModelRepository, ServingConfig, model_config, triton_name
from gpu_runtime.triton import REPO_ROOT as REPO
from gpu_runtime.triton import TritonError, TritonServer
from usecases.flights.features import FEATURE_NAMES

NAME = "native"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("native")
    with TritonServer(work / "repository", work / "triton") as server:
        yield server, ModelRepository(work / "repository"), work


@pytest.fixture(scope="module")
def rows(serving_models):
    """Real February flights as the gateway sends them: FP32, missing values as NaN (LightGBM's missing)."""
    _, feb = serving_models
    return feb.head(2_000).select([pl.col(n).cast(pl.Float32) for n in FEATURE_NAMES]).to_numpy()


def publish_and_load(server, version: int, text: str, **parameters: str) -> grpcclient.InferenceServerClient:
    triton, repository, _ = server
    repository.publish(NAME, version, text, {"sha256": hashlib.sha256(text.encode()).hexdigest(), "version": version})
    config = model_config(NAME, version, ServingConfig(n_features=len(FEATURE_NAMES), parameters=parameters))
    assert config["backend"] == NATIVE_BACKEND  # the default: no Python backend involved
    triton.client().load(triton_name(NAME, version), config)
    return grpcclient.InferenceServerClient(triton.grpc_url)


def infer(client, version: int, x: np.ndarray, outputs=("score",)):
    inp = grpcclient.InferInput("features", list(x.shape), "FP32")
    inp.set_data_from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    wanted = [grpcclient.InferRequestedOutput(n) for n in outputs]
    return client.infer(triton_name(NAME, version), [inp], model_version=str(version), outputs=wanted)


def test_it_answers_what_lightgbm_answers_in_process(server, serving_models, rows):
    texts, _ = serving_models
    client = publish_and_load(server, 1, texts[0])
    booster = lgb.Booster(model_str=texts[0])
    x64 = rows.astype(np.float64)  # the FP32 values the request carried, as LightGBM reads them
    # one row at a time (the single-row path) and in batches of 256 (dynamic batching's largest)
    single = np.array([infer(client, 1, rows[i : i + 1]).as_numpy("score")[0, 0] for i in range(200)])
    assert np.abs(single - booster.predict(x64[:200])).max() <= 1e-6
    for start in range(0, len(rows), 256):
        batch = infer(client, 1, rows[start : start + 256]).as_numpy("score")[:, 0]
        assert np.abs(batch - booster.predict(x64[start : start + 256])).max() <= 1e-6
    # explanations: TreeSHAP per feature and the expected value, adding up to the raw score
    answer = infer(client, 1, rows[:256], outputs=("score", "contrib", "raw_score"))
    contrib, raw = answer.as_numpy("contrib"), answer.as_numpy("raw_score")[:, 0]
    assert contrib.shape == (256, len(FEATURE_NAMES) + 1)
    assert np.abs(contrib - booster.predict(x64[:256], pred_contrib=True)).max() <= 1e-6
    assert np.abs(raw - booster.predict(x64[:256], raw_score=True)).max() <= 1e-6
    assert np.abs(contrib.sum(axis=1) - raw).max() <= 1e-9
    # a plain answer carries only the score: explaining costs only those who ask
    assert [o.name for o in infer(client, 1, rows[:4]).get_response().outputs] == ["score"]


def test_a_model_that_does_not_hash_to_its_registered_sha_is_refused_and_the_old_one_serves(server, serving_models,
                                                                                           rows):  # fmt: skip
    texts, _ = serving_models
    triton, repository, _ = server
    client = publish_and_load(server, 2, texts[1])
    before = infer(client, 2, rows[:8]).as_numpy("score")
    sha = hashlib.sha256(texts[0].encode()).hexdigest()
    repository.publish(NAME, 5, texts[0], {"sha256": sha, "version": 5})
    model_file = repository.version_dir(NAME, 5) / "model.txt"
    model_file.write_text(texts[0].replace("shrinkage=", "shrinkage=0", 1))  # tampered after it was published
    config = model_config(NAME, 5, ServingConfig(n_features=len(FEATURE_NAMES)))
    with pytest.raises(TritonError, match=f"model.txt hashes to .*, registered as {sha[:12]} — corrupt or tampered"):
        triton.client().load(triton_name(NAME, 5), config)
    np.testing.assert_array_equal(infer(client, 2, rows[:8]).as_numpy("score"), before)


def test_an_injected_partial_fault_fails_the_inputs_the_python_backend_failed(server, serving_models, rows):
    texts, _ = serving_models
    _, _, work = server
    fault = work / "fault-{version}"
    client = publish_and_load(server, 3, texts[2], keel_fault_file=str(fault))
    (work / "fault-3").write_text("0.3")
    failed = []
    for i in range(300):
        try:
            infer(client, 3, rows[i : i + 1])
            failed.append(False)
        except Exception as exc:  # noqa: BLE001 - the injected error is what is asserted
            assert "injected fault" in str(exc)
            failed.append(True)
    expected = [zlib.crc32(rows[i : i + 1].tobytes()) % 10_000 < 3_000 for i in range(300)]
    assert failed == expected and 50 < sum(failed) < 150
    (work / "fault-3").unlink()  # the fault is over: every input answers again
    assert infer(client, 3, rows[:256]).as_numpy("score").shape == (256, 1)


def test_a_request_that_waited_past_its_own_timeout_in_the_queue_is_rejected_and_read_as_a_timeout(
    server, serving_models, rows
):
    """Each call carries what is left of its request's time as Triton's queue timeout (repository.py): the work of a
    call the gateway abandoned stays bounded, and the rejection is a timeout (no strike against the version)."""
    from gpu_runtime.gateway.scoring import timed_out

    texts, _ = serving_models
    client = publish_and_load(server, 11, texts[0])  # a version of its own: the metering test counts v4's
    x = np.ascontiguousarray(rows[:1], dtype=np.float32)
    inp = grpcclient.InferInput("features", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(Exception) as rejected:
        client.infer(triton_name(NAME, 11), [inp], model_version="11", timeout=1)  # 1 µs: always waited longer
    assert "Request timeout expired" in str(rejected.value) and timed_out(rejected.value)
    answered = client.infer(triton_name(NAME, 11), [inp], model_version="11", timeout=5_000_000)
    assert answered.as_numpy("score").shape == (1, 1)


def test_triton_counts_its_requests_for_metering(server, serving_models, rows):
    texts, _ = serving_models
    triton, _, _ = server
    client = publish_and_load(server, 4, texts[0])
    for size in (1, 7, 64):
        infer(client, 4, rows[:size])
    # the backend reports a request's statistics right after sending its answer: the last may land a moment later
    deadline = time.monotonic() + 30
    while True:
        stats = triton.client().inference_statistics(triton_name(NAME, 4), 4)["model_stats"][0]
        if int(stats["inference_count"]) >= 72 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert int(stats["inference_count"]) == 72 and int(stats["inference_stats"]["success"]["count"]) == 3
    assert int(stats["inference_stats"]["compute_infer"]["ns"]) > 0


@pytest.fixture(scope="module")
def python_server(tmp_path_factory):
    """A Triton with the Python backend option configured: KEEL_RUNTIME_PYTHON names the numpy<2 interpreter
    scripts/python-backend-env makes (.venv-pybackend; created on first use, ~1 min)."""
    made = subprocess.run([str(REPO / "scripts" / "python-backend-env")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    work = tmp_path_factory.mktemp("pybackend")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KEEL_RUNTIME_PYTHON", made.stdout.strip().splitlines()[-1])
        server = TritonServer(work / "repository", work / "triton").start()
    try:
        yield server, ModelRepository(work / "repository"), work
    finally:
        server.stop()


@pytest.mark.slow
def test_the_python_backend_is_an_explicit_option_that_answers_the_same(python_server, serving_models, rows):
    texts, _ = serving_models
    triton, repository, _ = python_server
    text = texts[2]
    repository.publish(NAME, 6, text, {"sha256": hashlib.sha256(text.encode()).hexdigest(), "version": 6})
    config = model_config(NAME, 6, ServingConfig(n_features=len(FEATURE_NAMES), backend="python"))
    assert config["backend"] == "python"
    triton.client().load(triton_name(NAME, 6), config)
    client = publish_and_load(python_server, 7, text)  # the same model on the native backend, in the same server
    python, native = (infer(client, v, rows[:256]).as_numpy("score") for v in (6, 7))
    assert np.abs(python - native).max() <= 1e-6
    with pytest.raises(ValueError, match="backend must be one of"):
        ServingConfig(n_features=3, backend="onnx")


def test_without_the_option_a_python_backend_model_does_not_load_and_the_error_says_so(server, serving_models):
    """The default runtime has no Python interpreter for Triton: a python-backend model is refused, by name."""
    texts, _ = serving_models
    triton, repository, _ = server
    repository.publish(NAME, 8, texts[0], {"sha256": hashlib.sha256(texts[0].encode()).hexdigest(), "version": 8})
    config = model_config(NAME, 8, ServingConfig(n_features=len(FEATURE_NAMES), backend="python"))
    with pytest.raises(TritonError, match=f"(?s){triton_name(NAME, 8)}.*needs KEEL_RUNTIME_PYTHON"):
        triton.client().load(triton_name(NAME, 8), config)
