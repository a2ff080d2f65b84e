"""What actually answered, per model and day, against the model's tier objective — from the exposure log.

The gateway logs every request it answered or refused, one line each (keel/exposure_log.py). A request ends one of
four ways, and only the first is the model serving:

- **scored** — answered 200 by a version of the model (``model_version`` set);
- **coarse** — answered 200 by the model's coarse fallback (``variant: "coarse"``: the runtime down, the breaker open);
- **last resort** — answered 200 with the last-resort score (no model answered, no coarse model either);
- **failed** — not answered (a status other than 200: a timeout, a refusal, a runtime error), by ``error`` code.

``day_health`` counts them per (model, UTC day of ``ts``), with the share each version scored, the answers flagged
``breaker_open``, and the p50/p99 latency of the answers. ``breaches`` judges one day against the model's SLA tier
(keel/policies/gateway.py ``SlaTier``): the model's own answers at least the tier's availability, its p99 within the
tier's target, the fallback share (coarse + last resort) at most ``FALLBACK_LIMIT``. A day with a breach is a day the
model did not serve as promised, whatever the answers' status codes said.

Pure: records in, values out (assets/serving_health.py turns them into the asset, its check and the incident).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from keel.policies.errors import PolicyError
from keel.policies.gateway import GatewayPolicy, SlaTier, effective_policy
from keel.usecase import UseCaseError, by_model

log = logging.getLogger(__name__)

FALLBACK_LIMIT = 0.05  # a day on which more than 5 % of the answers were not the model's is degraded serving
UNROUTED = "(unrouted)"  # requests that ended before a model was known (a malformed request, one shed at the door)


@dataclass(frozen=True)
class DayHealth:
    model: str
    day: str  # YYYY-MM-DD, UTC
    requests: int
    scored: int
    coarse: int
    last_resort: int
    failed: int
    breaker_open: int  # answers flagged ``breaker_open`` (coarse or last resort while the breaker was open)
    errors: dict[str, int] = field(default_factory=dict)  # failed requests by error code
    versions: dict[int, int] = field(default_factory=dict)  # scored answers by model version
    p50_ms: float | None = None
    p99_ms: float | None = None
    breaker_open_s: float = 0.0  # how long the breaker was seen open (breaker_open_seconds)

    def share(self, count: int) -> float:
        return count / self.requests if self.requests else 0.0

    @property
    def fallback(self) -> int:
        return self.coarse + self.last_resort

    def breaches(self, tier: SlaTier, fallback_limit: float = FALLBACK_LIMIT) -> list[str]:
        """What the day missed of ``tier``'s objective, in words; [] when it met it (or had no request)."""
        if not self.requests:
            return []
        out = []
        served = self.share(self.scored)
        if served < tier.availability:
            out.append(f"the model answered {served:.1%} of {self.requests:,} requests, below the tier's "
                       f"availability {tier.availability:.1%}")  # fmt: skip
        if self.share(self.fallback) > fallback_limit:
            out.append(f"{self.share(self.fallback):.1%} answered by a fallback (coarse {self.coarse:,}, last resort "
                       f"{self.last_resort:,}; breaker open on {self.breaker_open:,}, for {self.breaker_open_s:,.0f} s), above {fallback_limit:.0%}")  # fmt: skip
        if self.failed:
            kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(self.errors.items(), key=lambda kv: -kv[1]))
            out.append(f"{self.failed:,} requests failed ({kinds})")
        if self.p99_ms is not None and self.p99_ms > tier.p99_ms:
            out.append(f"p99 {self.p99_ms:.1f} ms above the tier's {tier.p99_ms:g} ms")
        return out

    def as_row(self) -> dict[str, Any]:
        """A flat row for a table: counts, shares, latency, versions and errors as text."""
        return {
            "model": self.model,
            "day": self.day,
            "requests": self.requests,
            "scored_share": round(self.share(self.scored), 4),
            "coarse_share": round(self.share(self.coarse), 4),
            "last_resort_share": round(self.share(self.last_resort), 4),
            "failed_share": round(self.share(self.failed), 4),
            "breaker_open": self.breaker_open,
            "breaker_open_s": round(self.breaker_open_s, 1),
            "p50_ms": None if self.p50_ms is None else round(self.p50_ms, 2),
            "p99_ms": None if self.p99_ms is None else round(self.p99_ms, 2),
            "versions": ", ".join(f"v{v}: {self.share(n):.1%}" for v, n in sorted(self.versions.items())),
            "errors": ", ".join(f"{k}: {n}" for k, n in sorted(self.errors.items())),
        }


def tier_for(policies: dict[str, Any], model: str) -> SlaTier:
    """``model``'s SLA tier as the gateways read it: the committed policies (keel.policies.store.Policy by name) over
    the defaults, the model in the tier its use case declares unless an ``sla_tier`` policy moves it (L2 for a model
    no installed use case serves). An invalid store state: the gateways keep their defaults, so does this."""
    policy, names = served_tiers(policies, [model])
    return policy.tiers[names[model]]


def served_tiers(
    policies: dict[str, Any], models: list[str], base: GatewayPolicy | None = None
) -> tuple[GatewayPolicy, dict[str, str]]:
    """The gateway policy in force under ``policies`` (laid over ``base``, the runtime's own policy file; default
    the built-in policy) and each model's tier name (as ``tier_for`` reads them)."""
    base = base or GatewayPolicy()
    try:
        policy, _, _ = effective_policy(base, policies, None, set(), 0)
    except (PolicyError, KeyError, TypeError, ValueError):  # what the gateways refuse (gateway/following.py) …
        log.warning("the policy store's state cannot be applied: tiers read from the base policy", exc_info=True)
        policy = base  # … and what they then serve on
    names = {}
    for model in models:
        try:
            declared = by_model(model).serving.tier
        except UseCaseError:
            declared = "L2"
        names[model] = policy.tier_name(model, declared)
    return policy, names


def outcome(record: dict[str, Any]) -> str:
    """scored, coarse, last_resort or failed (module docstring)."""
    if record.get("status") != 200:
        return "failed"
    if record.get("variant") == "coarse":
        return "coarse"
    return "scored" if record.get("model_version") is not None else "last_resort"


def breaker_open_seconds(rows: list[dict[str, Any]]) -> float:
    """How long the breaker was seen open in ``rows`` (one model's requests): in time order, each stretch of answers
    flagged ``breaker_open`` lasts from its first answer to the first request after it that was not (or to its own
    last answer when the day ends open). A lone open answer between closed ones counts the time to the next request."""
    total, opened = 0.0, None
    ordered = sorted(rows, key=lambda r: float(r["ts"]))
    for r in ordered:
        is_open = "breaker_open" in (r.get("degraded") or ())
        if is_open and opened is None:
            opened = float(r["ts"])
        elif not is_open and opened is not None:
            total += float(r["ts"]) - opened
            opened = None
    if opened is not None:
        total += float(ordered[-1]["ts"]) - opened
    return total


def day_health(records: list[dict[str, Any]]) -> list[DayHealth]:
    """Each (model, day) of ``records`` (exposure-log lines), sorted by model and day."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        day = datetime.fromtimestamp(float(r["ts"]), UTC).strftime("%Y-%m-%d")
        groups.setdefault((r.get("model") or UNROUTED, day), []).append(r)
    out = []
    for (model, day), rows in sorted(groups.items()):
        kinds = Counter(outcome(r) for r in rows)
        answered = [
            float(r["latency_ms"]) for r in rows if r.get("status") == 200 and r.get("latency_ms") is not None
        ]
        p50, p99 = (float(np.percentile(answered, q)) for q in (50, 99)) if answered else (None, None)
        out.append(
            DayHealth(
                model=model,
                day=day,
                requests=len(rows),
                scored=kinds["scored"],
                coarse=kinds["coarse"],
                last_resort=kinds["last_resort"],
                failed=kinds["failed"],
                breaker_open=sum("breaker_open" in (r.get("degraded") or ()) for r in rows),
                errors=dict(
                    Counter(
                        str(r.get("error") or f"status {r.get('status')}") for r in rows if outcome(r) == "failed"
                    )
                ),  # fmt: skip
                versions=dict(Counter(int(r["model_version"]) for r in rows if outcome(r) == "scored")),
                p50_ms=p50,
                p99_ms=p99,
                breaker_open_s=breaker_open_seconds(rows),
            )
        )
    return out


def combined(days: list[DayHealth], model: str, label: str) -> DayHealth:
    """``model``'s days of ``days`` as one (``label`` in place of a day: a month): the counts added (percentiles do not
    add: None)."""
    mine = [d for d in days if d.model == model]
    versions: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    for d in mine:
        versions.update(d.versions)
        errors.update(d.errors)
    return DayHealth(
        model, label, *(sum(getattr(d, f) for d in mine) for f in ("requests", "scored", "coarse", "last_resort",
                                                                    "failed", "breaker_open")),
        errors=dict(errors), versions=dict(versions), breaker_open_s=sum(d.breaker_open_s for d in mine),
    )  # fmt: skip


def answered_words(h: DayHealth) -> str:
    """How ``h``'s requests ended, in one line a person reads."""
    if not h.requests:
        return "no request logged"
    parts = [f"the model {h.share(h.scored):.1%}", f"coarse {h.share(h.coarse):.1%}",
             f"last resort {h.share(h.last_resort):.1%}", f"failed {h.share(h.failed):.1%}"]  # fmt: skip
    return f"of {h.requests:,} requests: " + ", ".join(parts)
