"""The Triton Python-backend model that serves one registered LightGBM model version.

Copied into ``<repository>/<model>/<version>/model.py`` by gpu_runtime.repository; it runs inside Triton's Python
stub — only with the explicit option ``ServingConfig(backend="python")``; keel's native backend serves by default —
in the interpreter ``$KEEL_RUNTIME_PYTHON`` names (numpy<2, lightgbm: scripts/python-backend-env), and imports
nothing from keel. ``initialize`` reads ``model.txt`` and ``meta.json`` next to it and refuses to load when the text does not
hash to the registered sha256: a corrupt or tampered file is a failed load, and Triton keeps serving whatever was
loaded before.

Input ``features`` FP32 [batch, n_features]; output ``score`` FP32 [batch, 1] = P(late). Two more outputs, computed
only when a request asks for them (an explained prediction; plain scoring pays nothing for them):
``contrib`` FP64 [batch, n_features + 1] — LightGBM's exact TreeSHAP (``pred_contrib``): each feature's contribution to
the raw score (log-odds), the last column the base value — and ``raw_score`` FP64 [batch, 1], the model's raw score
from its own predict call, so a caller can check contributions + base value = raw score.

Fault injection (named as such; for drills and the circuit-breaker test): when the model config's parameter
``keel_fault_file`` names a file (``{version}`` in it is replaced by this version's number) and that file exists,
``execute`` answers requests with an error: every request when the file is empty, else the share of inputs the
file's number says (e.g. ``0.3``), chosen by a hash of the input's bytes — the same input always fails.
"""

import hashlib
import json
import os
import zlib

import lightgbm as lgb
import numpy as np
import triton_python_backend_utils as pb_utils


def _explain_requested(request) -> bool:
    """Did the request ask for the ``contrib`` output? (A request that names no outputs gets only the score.)"""
    try:
        return "contrib" in request.requested_output_names()
    except AttributeError:  # a Python backend without requested_output_names: explanations only when asked
        return False


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, "meta.json")) as fh:
            meta = json.load(fh)
        with open(os.path.join(version_dir, "model.txt"), "rb") as fh:
            data = fh.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != meta["sha256"]:
            raise pb_utils.TritonModelException(
                f"model {args['model_name']} version {args['model_version']}: model.txt hashes to {actual[:12]}, "
                f"registered as {meta['sha256'][:12]} — corrupt or tampered, refusing to load"
            )
        self.booster = lgb.Booster(model_str=data.decode())
        self.n_features = self.booster.num_feature()
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        fault = params.get("keel_fault_file", {}).get("string_value") or None
        self.fault_file = fault.replace("{version}", str(args["model_version"])) if fault else None

    def _faulty(self, request) -> bool:
        try:
            with open(self.fault_file) as fh:
                text = fh.read().strip()
        except OSError:
            return False
        try:
            share = float(text) if text else 1.0
        except ValueError:
            share = 1.0  # not a number: fail everything, as an empty file does
        if share >= 1.0:
            return True
        data = pb_utils.get_input_tensor_by_name(request, "features").as_numpy().tobytes()
        return zlib.crc32(data) % 10_000 < share * 10_000

    def execute(self, requests):
        if self.fault_file and os.path.exists(self.fault_file):
            faulty = [self._faulty(r) for r in requests]
            if any(faulty):
                if all(faulty):
                    return [
                        pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("injected fault"))
                        for _ in requests
                    ]
                good = [r for r, f in zip(requests, faulty, strict=True) if not f]
                answers = iter(self._score(good))
                return [
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("injected fault"))
                    if f
                    else next(answers)
                    for f in faulty
                ]
        return self._score(requests)

    def _score(self, requests):
        # Dynamic batching hands us several requests: score them in one predict call (and explain, in one more,
        # only the rows of requests that asked for contributions).
        arrays = [pb_utils.get_input_tensor_by_name(r, "features").as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        x = np.concatenate(arrays).astype(np.float64, copy=False) if len(arrays) > 1 else arrays[0].astype(np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            return [
                pb_utils.InferenceResponse(
                    output_tensors=[],
                    error=pb_utils.TritonError(f"features must be [batch, {self.n_features}], got {list(x.shape)}"),
                )
                for _ in requests
            ]
        scores = self.booster.predict(x, num_threads=1).astype(np.float32).reshape(-1, 1)
        wants = [_explain_requested(r) for r in requests]
        contrib = raw = None
        if any(wants):
            rows = np.concatenate(
                [np.arange(s, s + n) for s, n, w in zip(np.cumsum([0, *sizes[:-1]]), sizes, wants, strict=True) if w]
            )
            contrib = self.booster.predict(x[rows], pred_contrib=True, num_threads=1).astype(np.float64)
            raw = self.booster.predict(x[rows], raw_score=True, num_threads=1).astype(np.float64).reshape(-1, 1)
        out, start, at = [], 0, 0
        for n, want in zip(sizes, wants, strict=True):
            tensors = [pb_utils.Tensor("score", scores[start : start + n])]
            if want:
                tensors += [
                    pb_utils.Tensor("contrib", np.ascontiguousarray(contrib[at : at + n])),
                    pb_utils.Tensor("raw_score", np.ascontiguousarray(raw[at : at + n])),
                ]
                at += n
            out.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += n
        return out

    def finalize(self):
        self.booster = None
