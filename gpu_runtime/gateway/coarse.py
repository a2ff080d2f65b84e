"""The coarse fallback: when no version of the model can answer — every breaker open, the retries spent, or the
model runtime down — the gateway answers from the model's coarse model (keel/training/coarse.py), a small LightGBM
scored in the gateway's own process, so the answer does not need Triton.

The routing table names it (``RoutingTable.coarse``: its ``<model>-coarse`` version and sha256); the deployment
wrote its text beside the routing tables (``keel.deploy.routing.coarse_path``). It is read when the table is, and
used only if its bytes hash to the sha256 the table names: a missing or altered file leaves the model without a
coarse answer (``keel_gateway_coarse_unusable_total``), never a wrong one.

The answer says so: ``degraded: ["coarse_fallback", …]`` (with ``runtime_unavailable`` or ``breaker_open`` when
that was why), ``variant: "coarse"``, ``model_version: null`` (no version of the model answered; the canary's arms
count it as their version's failure) and ``coarse_version``. The exposure log records the same.

A mixin of ``Gateway`` (app.py), which owns ``config``, ``routing`` and ``metrics``; the answer itself is built by
predict.py's ``_answer``.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from gpu_runtime.gateway.scoring import Explained
from keel.deploy.routing import Route, RoutingTable, coarse_path

RETRY_UNUSABLE_S = 30.0  # a coarse file that could not be used is looked at again after this long


class AnswersCoarse:
    def _init_coarse(self) -> None:
        self._coarse: dict[str, object] = {}  # sha256 → its LightGBM booster
        self._coarse_unusable: dict[str, float] = {}  # sha256 → when it was found unusable (monotonic)

    def coarse_model(self, table: RoutingTable | None):
        """The loaded coarse model of ``table`` (a lightgbm.Booster), or None when it names none or its file is not
        usable."""
        route = table.coarse if table is not None else None
        if route is None:
            return None
        booster = self._coarse.get(route.sha256)
        if booster is not None:
            return booster
        failed = self._coarse_unusable.get(route.sha256)
        if failed is not None and time.monotonic() - failed < RETRY_UNUSABLE_S:
            return None
        return self._load_coarse(route)

    def _load_coarse(self, route: Route):
        import lightgbm as lgb

        path = coarse_path(self.config.routing_path, route.sha256)
        try:
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != route.sha256:
                raise ValueError(f"{path} does not hash to the sha256 the routing table names")
            booster = lgb.Booster(model_str=data.decode())
            if booster.num_feature() != len(self.features.names):
                raise ValueError(
                    f"{path} takes {booster.num_feature()} features, the model {len(self.features.names)}"
                )
        except Exception as exc:  # noqa: BLE001 - no coarse answer, said in the metrics; never a wrong one
            self._coarse_unusable[route.sha256] = time.monotonic()
            self.metrics.inc("keel_gateway_coarse_unusable_total", {"coarse_version": str(route.version)})
            self.coarse_error = f"coarse model v{route.version}: {exc}"
            return None
        self._coarse = {route.sha256: booster}  # only the routed one is kept
        self._coarse_unusable.pop(route.sha256, None)
        return booster

    def _coarse_scores(self, booster, x: np.ndarray, explain: bool) -> tuple[np.ndarray, Explained | None]:
        """Scores (and, when ``explain``, TreeSHAP contributions and raw scores) from the coarse model."""
        scores = np.asarray(booster.predict(x), dtype=np.float64)
        if not explain:
            return scores, None
        contrib = np.asarray(booster.predict(x, pred_contrib=True), dtype=np.float64)
        return scores, Explained(contrib, np.asarray(booster.predict(x, raw_score=True), dtype=np.float64))
