"""One request as it passes the gateway's stages (stages.py): a typed context that each stage reads and fills, its
deadline, and the answer every exit builds (answers.py). The exposure-log line is made from the context once, at the
end (``exposure_record``) — the log line is not the request's data model.

A request's **deadline** is fixed when the gateway first sees its bytes: its tier's timeout, or the client's
``x-keel-deadline-ms`` when that is shorter. Every stage starts with ``ctx.check(stage)``: past the deadline it does
no work and the answer is a fast 503 ``deadline_exceeded`` naming the stage; a client that has gone (its connection
closed) is dropped (``ClientGone``: logged as 499 ``client_gone``, nothing is sent).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_runtime.gateway.limits import RequestError
from keel.deploy.routing import Route, RoutingTable

DEADLINE_HEADER = "x-keel-deadline-ms"
MAX_CLIENT_DEADLINE_MS = 600_000.0
CLIENT_GONE_STATUS = 499  # nginx's code for "the client closed the request": logged, never sent


class ClientGone(Exception):
    """The client closed its connection: the request is dropped before any more work."""

    def __init__(self, stage: str):
        super().__init__(f"the client went away before {stage}")
        self.stage = stage


def deadline_exceeded(stage: str, budget_ms: float) -> RequestError:
    return RequestError(
        503, "deadline_exceeded", f"the request's deadline ({budget_ms:g} ms) passed before {stage}",
        stage=stage, deadline_ms=budget_ms, retry_after_s=1,
    )  # fmt: skip


# W3C Trace Context's traceparent (version-trace id-parent id-flags): the one id that follows a request from the edge
# (Envoy passes it, and logs it beside x-request-id) into the exposure log and from there to the ledger's releases.
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def client_budget_ms(headers: dict[str, str]) -> float | None:
    """The client's own deadline in ms (``x-keel-deadline-ms``), None when absent; a bad value is a 400."""
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_CLIENT_DEADLINE_MS:
        raise RequestError(
            400, "bad_header", f"header {DEADLINE_HEADER} must be milliseconds in (0, {MAX_CLIENT_DEADLINE_MS:g}]",
            header=DEADLINE_HEADER,
        )  # fmt: skip
    return value


@dataclass(slots=True)
class Answer:
    """What goes back to the client: status, JSON body, extra headers."""

    status: int
    payload: dict[str, Any]
    headers: dict[str, str]


@dataclass(slots=True)
class RequestContext:
    request_id: str
    arrived: float  # time.monotonic() when the gateway first saw the request's bytes
    budget_ms: float  # the deadline, as a budget from ``arrived``
    ts: float  # the exposure's timestamp (the simulated clock's during a live replay)
    policy_version: int
    generic: bool  # the route named the model (/v1/models/{model}/predict), not the use case's alias route
    headers: dict[str, str] = field(default_factory=dict)
    asked_model: str | None = None  # the model the route names (None: the alias route)
    client_gone: Callable[[], bool] = lambda: False
    started: float = field(default_factory=time.perf_counter)
    # parse
    req: dict[str, Any] | None = None
    entities: list[Any] | None = None  # None: the request gave feature values directly
    parsed: bool = False  # the request's identifiers are checked (safe to log)
    tenant: str | None = None
    risk_level: int | None = None
    unit_id: str | None = None
    experiment_id: str | None = None
    top_k: int | None = None  # explanation size asked for
    # admit
    tier: str | None = None
    admitted_at: float | None = None
    # validate → features
    checked: Any = None  # inputs.Validated
    values: np.ndarray | None = None  # the [rows, features] matrix scored (what an explanation shows)
    rows: int | None = None
    entity_key: str | None = None
    degraded: list[str] = field(default_factory=list)
    # route → infer
    table: RoutingTable | None = None
    route: Route | None = None
    variant: str | None = None
    routed_version: int | None = None
    scores: np.ndarray | None = None
    explained: Any = None  # scoring.Explained
    coarse: bool = False  # the coarse model answered
    last_resort: float | None = None  # the policy's last-resort score answered
    shadow_version: int | None = None
    shadow_score: Any = None
    shadow_error: str | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)  # e.g. the soft-budget header
    # the end
    status: int | None = None
    error: str | None = None
    stage: str | None = None  # the stage that ended a refused request
    late: dict[str, float] | None = None  # a deadline refusal: where its time went (overload.lateness)
    latency_ms: float | None = None

    @property
    def deadline(self) -> float:
        return self.arrived + self.budget_ms / 1000

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, stage: str) -> None:
        """At the start of ``stage``: drop a request whose client has gone, refuse one past its deadline."""
        if self.client_gone():
            raise ClientGone(stage)
        if time.monotonic() >= self.deadline:
            raise deadline_exceeded(stage, self.budget_ms)

    @property
    def model_version(self) -> int | None:
        """The version that answered (None: none did — an error, the coarse model or the last resort)."""
        if self.route is None or self.coarse or self.scores is None:
            return None
        return self.route.version

    def exposure_record(self) -> dict[str, Any]:
        """The exposure-log line of this request (keel/exposure_log.py): every answer, errors included."""
        rec: dict[str, Any] = {
            "request_id": self.request_id, "ts": self.ts, "model_version": self.model_version,
            "policy_version": self.policy_version,
        }  # fmt: skip
        if self.tenant is not None:
            rec["tenant_id"] = self.tenant
        trace = self.headers.get("traceparent")
        if trace is not None and TRACEPARENT.fullmatch(trace):  # W3C trace context, kept only when well-formed
            rec["traceparent"] = trace
        if self.parsed:
            rec.update(risk_level=self.risk_level, unit_id=self.unit_id, experiment_id=self.experiment_id)
        optional = {
            "tier": self.tier, "rows": self.rows, "explain": self.top_k, "variant": self.variant,
            "routed_version": self.routed_version, "entity_key": self.entity_key,
        }  # fmt: skip
        rec.update({k: v for k, v in optional.items() if v is not None})
        if self.table is not None:  # the model asked about, answered or not: a failure counts against it too
            rec["model"] = self.table.model
        answered = self.scores is not None or self.last_resort is not None
        if answered:
            rec.setdefault("model", None)
            if self.last_resort is not None:
                rec.update(score=self.last_resort, variant=None)
            else:
                s = self.scores
                rec.update(sha256=self.route.sha256, release_id=self.route.release_id,
                           score=float(s[0]) if len(s) == 1 else np.round(s, 6).tolist())  # fmt: skip
            rec["degraded"] = sorted(set(self.degraded)) or None
            if self.coarse:
                rec.update(variant="coarse", coarse_version=self.route.version)
        if self.shadow_version is not None:
            rec["shadow_version"] = self.shadow_version
            rec.update(
                {"shadow_error": self.shadow_error} if self.shadow_error else {"shadow_score": self.shadow_score}
            )
        rec["status"] = self.status
        rec["deadline_ms"] = self.budget_ms
        if self.error is not None:
            rec["error"] = self.error
        if self.stage is not None:
            rec["stage"] = self.stage
        if self.late is not None:
            rec["late"] = self.late
        rec["latency_ms"] = self.latency_ms
        return rec
