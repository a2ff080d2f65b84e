"""Hot swap under load: 200 requests/s of held-out real flights for 60 s from a second process, 10 swaps, one of
them a corrupt model file — no request fails, every answer names exactly one model version and carries its hash."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpu_runtime.repository import triton_name
from gpu_runtime.triton import TritonError
from keel.exposure_log import read_exposures
from tests import REPO
from tests.serving.conftest import MODEL, PATIENT, Runtime, start_serve, stop_serve

pytestmark = pytest.mark.slow

RPS, SECONDS = 200, 60


def test_ten_swaps_under_load_lose_no_request(runtime_home, serving_models, tmp_path):
    proc, endpoints = start_serve(runtime_home, PATIENT)
    rt = Runtime(runtime_home, proc, endpoints, serving_models[0])
    try:
        rt.deployer().deploy(MODEL, [rt.target(1)])
        rt.wait_ready()
        out = tmp_path / "replay.jsonl"
        replay = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_runtime.replay",
                "--usecase",
                "flights",
                "--url",
                rt.url,
                "--rps",
                str(RPS),
                "--seconds",
                str(SECONDS),
                "--month",
                "2013-02",
                "--out",
                str(out),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert replay.stdout.readline().startswith("replay:")  # flights loaded; the load starts now
        started = time.monotonic()
        plan = [2, 3, 1, 2, "corrupt", 3, 1, 2, 3, 1]
        serving, cold, swapped = 1, [], 0
        for step in plan:
            time.sleep(max(0.0, started + 5 * (swapped + 1) - time.monotonic()))
            if step == "corrupt":
                # Version 4: model 3's registered hash, but the file's bytes were altered.
                bad = rt.target(3)
                bad = type(bad)(
                    type(bad.route)("champion", 4, bad.route.sha256, 1.0, "rel-bad"), bad.model_text + "\n#"
                )
                with pytest.raises(TritonError, match="corrupt or tampered"):
                    rt.deployer().deploy(MODEL, [bad])
                assert rt.control.ready(triton_name(MODEL, serving), serving)  # the old version still serves
            else:
                report = rt.deployer().deploy(MODEL, [rt.target(step)])
                cold += list(report.cold_start_s.values())
                serving = step
            swapped += 1
        stdout, _ = replay.communicate(timeout=SECONDS + 120)
    finally:
        stop_serve(proc)
    summary = json.loads(stdout.strip().splitlines()[-1])
    results = [json.loads(line) for line in out.read_text().splitlines()]
    print(f"replay: {summary}; cold starts (s): {[round(c, 3) for c in cold]}")

    assert summary["sent"] == RPS * SECONDS == len(results)
    failed = [r for r in results if r["status"] != 200]
    assert not failed, f"{len(failed)} failed requests, e.g. {failed[:3]}"
    sha_of = {v: rt.shas[v - 1] for v in (1, 2, 3)}
    for r in results:  # attributable to exactly one version: the header hash is that version's hash
        assert r["model_version"] in sha_of and r["signature"] == sha_of[r["model_version"]], r
    assert set(summary["versions"]) == {"1", "2", "3"}  # every swap took effect under load
    assert 4 not in {r["model_version"] for r in results}
    exposures = [e for e in read_exposures(runtime_home / "serving" / "exposures") if e.get("tenant_id") == "replay"]
    assert len(exposures) == len(results)
    assert all(e["sha256"] == sha_of[e["model_version"]] for e in exposures)
