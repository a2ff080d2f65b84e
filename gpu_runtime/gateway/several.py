"""Several models behind one gateway: one serving context per model, on one Triton.

The gateway a process runs (``Gateway``, app.py) serves its own use case's model and, given ``also`` (the configs of
more use cases), one ``Gateway`` context per further model: each with its use case's request contract, features,
ranges and defaults, online store, routing table (``routing/<model>.json``), breakers, memory pool, lanes, rate
limits and retry budget — a model's failures and overload never reach another model's requests. What is the
process's stays single: the HTTP server and its connection limits, tier admission (admission.py), the exposure log (every record names its
``model``), ``/metrics`` (each context's series carry ``model=<name>``) and ``/readyz`` (ready when every model is).

``POST /v1/models/{model}/predict`` goes to that model's context; an unknown model is 404 ``unknown_model`` listing
every served model. A mixin of ``Gateway``, which calls ``_init_several`` once its own state exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_runtime.gateway.metrics import LabelledMetrics


class ServesSeveral:
    def _init_several(self, also: Sequence[Any]) -> None:
        self.others: dict[str, ServesSeveral] = {}  # model → its context (a Gateway of its own)
        if not also:
            return
        base = self.metrics
        self.metrics = LabelledMetrics(base, {"model": self.usecase.model.name})
        for config in also:
            other = type(self)(
                config, self.base_policy, runtime=self.runtime, _shared=(base, self.exposures, self.admission)
            )
            name = other.usecase.model.name
            if name == self.usecase.model.name or name in self.others:
                raise ValueError(f"model {name} is served twice by this gateway")
            self.others[name] = other

    def served_models(self) -> list[str]:
        """The models this gateway answers for (``/v1/models/{model}/predict``)."""
        return [self.usecase.model.name, *self.others]

    def context_of(self, model: str | None):
        """The serving context of ``model`` (None, or a model not served: this gateway's own, which answers 404)."""
        return self.others.get(model, self) if model is not None else self

    async def ready_all(self) -> tuple[bool, dict[str, Any]]:
        ready, detail = await self.ready()
        if not self.others:
            return ready, detail
        models = {self.usecase.model.name: {"ready": ready, **detail}}
        for name, other in self.others.items():
            ok, more = await other.ready()
            models[name] = {"ready": ok, **more}
            ready = ready and ok
        return ready, {"models": models}

    def follow_others(self) -> None:
        """Routing and policies of every further model (the process's watcher calls it each round)."""
        for other in self.others.values():
            other.reload_routing()
            other.reload_policies()

    def export_others(self) -> None:
        for other in self.others.values():
            other._export_breakers()
            other._export_pools()
            other._export_sla()
            other._export_freezes()

    async def close_others(self) -> None:
        for other in self.others.values():
            if other._client is not None:
                await other._client.close()
            if other._policy_reader is not None:
                other._policy_reader.close()
