"""The gateway's policy: routing split, circuit breaker, rate limits, priority lanes, retries, timeouts, SLA tiers.

A base read from a YAML file (``gpu_runtime.serve --policy``) or built in code, with the committed policies of the
store laid over it (``effective_policy``, each through its type's ``apply``). Every field has a default a careful
operator would pick; ``GatewayPolicy.from_dict`` names the field of a bad value. Pure values: the gateway, the
canary sensor and the CLI use the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from keel.policies.errors import PolicyError, PolicyValidationError
from keel.policies.types import POLICY_TYPES, RETIRED_TYPES, validate_policy


@dataclass(frozen=True)
class BreakerPolicy:
    error_rate: float = 0.05  # open when the error share over the window exceeds this …
    window_s: float = 5.0
    min_requests: int = 20  # … and at least this many requests were seen in the window
    open_s: float = 30.0  # then answer with the fallback for this long
    half_open_probes: int = 5  # then let this many requests through; all succeed → closed, one fails → open again


@dataclass(frozen=True)
class RateLimit:
    rps: float = 500.0
    burst: float = 1000.0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 2  # the first try and one retry
    budget_ratio: float = 0.1  # retries may add at most 10 % to the requests …
    budget_min_per_s: float = 5.0  # … or this many per second, whichever is larger


@dataclass(frozen=True)
class SlaTier:
    p99_ms: float
    availability: float
    timeout_ms: float


DEFAULT_TIERS = {
    "L1": SlaTier(p99_ms=15.0, availability=0.999, timeout_ms=100.0),
    "L2": SlaTier(p99_ms=50.0, availability=0.995, timeout_ms=300.0),
    "L3": SlaTier(p99_ms=250.0, availability=0.99, timeout_ms=1000.0),
}


@dataclass(frozen=True)
class GatewayPolicy:
    version: str = "builtin-1"
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    default_rate_limit: RateLimit = field(default_factory=RateLimit)
    tenant_rate_limits: dict[str, RateLimit] = field(default_factory=dict)
    lanes: dict[int, int] = field(default_factory=lambda: {1: 64, 2: 32, 3: 16})  # risk level → max concurrent
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tiers: dict[str, SlaTier] = field(default_factory=lambda: dict(DEFAULT_TIERS))
    model_tiers: dict[str, str] = field(default_factory=dict)  # model → tier (else its use case's, keel/usecase.py)
    # Admission across every model the process serves, by service tier (gpu_runtime/gateway/admission.py): a request
    # of tier T starts only while fewer than admit_in_flight[T] requests of any model are in flight, waits for a place
    # up to admit_wait_ms[T] (default: the highest tier its timeout, lower tiers a tenth of it), else is shed (503 shed, naming its tier). Lower tiers get
    # lower limits, so the room between them is reserved for the higher: under overload L1 is admitted first, L2 and
    # L3 wait, then are shed. A tier admit_in_flight does not name (a custom sla_tier) is not limited here. The
    # defaults sit above the risk lanes' limits, so one model alone behaves as without them.
    admit_in_flight: dict[str, int] = field(default_factory=lambda: {"L1": 256, "L2": 128, "L3": 64})
    admit_wait_ms: dict[str, float] = field(default_factory=dict)
    route_timeout_ms: dict[str, float] = field(default_factory=dict)  # route name → Triton call timeout (else tier)
    invalid_input: str = "reject"  # reject → 422; default → serve with the reference defaults, flagged degraded
    routing_poll_s: float = 0.1  # how often the routing file is checked for a new generation
    # Per-model memory budget (bytes) for the feature matrices of requests in flight; × 1.2 headroom is the pool's
    # limit. Over it, that model answers 503 memory_budget_exceeded; other models are unaffected. A model the policy
    # does not name gets its use case's budget (``Serving.pool_budget_bytes``, keel/usecase.py).
    pool_budgets: dict[str, int] = field(default_factory=dict)
    # While the model runtime is down (Triton restarting): None → 503 runtime_unavailable; a score in [0, 1] → that
    # score is the answer, flagged degraded "runtime_unavailable" (a documented last resort for callers that must
    # get a number).
    last_resort_score: float | None = None

    def tier_name(self, model: str, declared: str = "L2") -> str:
        """The tier ``model`` is served in: the policy's word for it, else what its use case declares."""
        return self.model_tiers.get(model, declared)

    def tier_of(self, model: str, declared: str = "L2") -> SlaTier:
        return self.tiers[self.tier_name(model, declared)]

    def rate_limit_of(self, tenant: str) -> RateLimit:
        return self.tenant_rate_limits.get(tenant, self.default_rate_limit)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "policy") -> GatewayPolicy:
        def build(kind: Any, value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise PolicyError(f"{source}: {where} must be a mapping, got {value!r}")
            known = {f.name: f for f in fields(kind)}
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise PolicyError(f"{source}: unknown field {where}.{unknown[0]} (known: {', '.join(known)})")
            out = {}
            for name, v in value.items():
                f = known[name]
                out[name] = _coerce(f.type, v, f"{where}.{name}", source)
            return kind(**out)

        def name_of(where: str) -> str:
            return where.rsplit(".", 1)[-1]

        def _coerce(type_text: str, v: Any, where: str, source: str) -> Any:
            nested = {"BreakerPolicy": BreakerPolicy, "RetryPolicy": RetryPolicy, "RateLimit": RateLimit}
            if type_text in nested:
                return build(nested[type_text], v, where)
            if type_text == "dict[str, RateLimit]":
                return {str(k): build(RateLimit, x, f"{where}.{k}") for k, x in (v or {}).items()}
            if type_text == "dict[str, SlaTier]":
                return {str(k): build(SlaTier, x, f"{where}.{k}") for k, x in (v or {}).items()}
            if type_text == "dict[str, float]":
                try:
                    return {str(k): float(x) for k, x in (v or {}).items()}
                except (TypeError, ValueError):
                    keys = "tiers" if name_of(where) == "admit_wait_ms" else "route names"
                    raise PolicyError(f"{source}: {where} maps {keys} to milliseconds, got {v!r}") from None
            if type_text == "dict[str, int]":
                try:
                    return {str(k): int(x) for k, x in (v or {}).items()}
                except (TypeError, ValueError):
                    what = (
                        "tiers to in-flight limits"
                        if name_of(where) == "admit_in_flight"
                        else "model names to byte budgets"
                    )
                    raise PolicyError(f"{source}: {where} maps {what}, got {v!r}") from None
            if type_text == "dict[int, int]":
                try:
                    return {int(k): int(x) for k, x in (v or {}).items()}
                except (TypeError, ValueError):
                    raise PolicyError(
                        f"{source}: {where} maps risk levels to concurrency limits, got {v!r}"
                    ) from None
            if type_text in ("float", "int"):
                if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                    raise PolicyError(f"{source}: {where} must be a non-negative number, got {v!r}")
                return float(v) if type_text == "float" else int(v)
            if type_text == "str":
                if not isinstance(v, str):
                    raise PolicyError(f"{source}: {where} must be text, got {v!r}")
                return v
            return v

        policy = build(cls, raw, "policy")
        if policy.invalid_input not in ("reject", "default"):
            raise PolicyError(
                f"{source}: policy.invalid_input must be reject or default, got {policy.invalid_input!r}"
            )
        missing = sorted({t for t in policy.model_tiers.values() if t not in policy.tiers})
        if missing:
            raise PolicyError(f"{source}: policy.model_tiers names unknown tier {missing[0]}")
        lr = policy.last_resort_score
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 <= lr <= 1):
            raise PolicyError(
                f"{source}: policy.last_resort_score must be a probability in [0, 1] or null, got {lr!r}"
            )
        if not 0 < policy.breaker.error_rate < 1:
            raise PolicyError(f"{source}: policy.breaker.error_rate must be in (0, 1)")
        for what, table in (("admit_in_flight", policy.admit_in_flight), ("admit_wait_ms", policy.admit_wait_ms)):
            if any(x < 0 for x in table.values()):
                raise PolicyError(f"{source}: policy.{what} must be non-negative for every tier, got {table}")
        return policy

    @classmethod
    def load(cls, path: str | Path) -> GatewayPolicy:
        import yaml

        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise PolicyError(f"{path}: cannot read the gateway policy: {exc}") from None
        return cls.from_dict(raw, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        def dump(v: Any) -> Any:
            if is_dataclass(v):
                return {f.name: dump(getattr(v, f.name)) for f in fields(v)}
            if isinstance(v, dict):
                return {k: dump(x) for k, x in v.items()}
            return v

        return dump(self)


@dataclass(frozen=True)
class Split:
    """The store's traffic split in force for a model: weight by model version, and the salt that places units.

    Each experiment or canary has its own salt (an experiment's id; a canary's name and versions), so consecutive
    splits put independent sets of units into treatment — hashing the model name alone would send the same users
    to every treatment (carry-over bias)."""

    weights: dict[int, float]
    salt: str
    shadow: int | None = None  # a version the gateway scores beside the served one on every request, never serves


LIVE_EXPERIMENT = ("running", "paused")


def header_only(body: dict[str, Any]) -> bool:
    """An ab_test body of an experiment that takes only the requests naming it (``traffic: header``): never the
    model's split."""
    return (body.get("experiment") or {}).get("traffic") == "header"


def live_experiments(policies: dict[str, Any], model: str | None) -> dict[str, tuple[tuple[str, int, float], ...]]:
    """Every running or paused experiment on ``model``, by id: its arms as (variant, model version, weight) — how a
    request that names it (``x-experiment-id``) is routed, sticky per unit by the experiment's id. A paused one
    sends every unit to the control (its policy's weights say so)."""
    out = {}
    for p in policies.values():
        meta = p.body.get("experiment") if p.type == "ab_test" else None
        if meta and meta.get("status") in LIVE_EXPERIMENT and p.body.get("model") == model:
            out[meta["id"]] = tuple((v["name"], int(v["version"]), float(v["weight"])) for v in p.body["variants"])
    return out


def split_salt(policy_name: str, body: dict[str, Any]) -> str:
    """A split's own salt: its ``salt`` field, else its policy name."""
    return str(body.get("salt") or policy_name)


def effective_policy(
    base: GatewayPolicy, policies: dict[str, Any], model: str | None, routed_versions: set[int], store_version: int
) -> tuple[GatewayPolicy, Split | None, list[str]]:
    """The gateway's policy once the committed policies (keel.policies.store.Policy by name) are laid over ``base``, the
    model's split from its ab_test policy (weights by model version and the split's salt; None: the routing table's
    weights stand), and notes on what was not applied.

    Each committed policy is validated again here (a gateway trusts no writer): a bad one raises PolicyError and the
    caller keeps its last good policy. An ab_test split that gives traffic to a version this gateway does not serve
    (a canary committed before its challenger is deployed, or the split of a finished rollout whose versions have
    since been retired) is valid but not applicable: it is not applied — the deployment's weights stand — and a note
    says why; the other policies still apply. With several splits of the model, the newest committed applicable one
    is in force (a new canary's split supersedes a finished one's); of the other types, the first by name."""
    raw = base.to_dict()
    split: Split | None = None
    notes: list[str] = []
    splits = []
    seen: set[str] = set()
    for name in sorted(policies):
        p = policies[name]
        if p.type in RETIRED_TYPES:  # committed before the type was retired: nothing reads it
            notes.append(f"policy '{p.name}' not applied: type {p.type} is retired ({RETIRED_TYPES[p.type]})")
            continue
        try:
            validate_policy(p.name, p.type, p.body)
        except PolicyValidationError as exc:
            raise PolicyError(str(exc)) from None
        if p.type in seen and p.type != "ab_test":
            continue
        seen.add(p.type)
        kind = POLICY_TYPES[p.type]
        if kind.shapes_gateway:
            kind.apply(raw, p.body)
        elif p.type == "ab_test" and p.body["model"] == model and not header_only(p.body):
            splits.append(p)
    for p in sorted(splits, key=lambda p: p.version, reverse=True):  # the newest applicable split is in force
        wanted = {int(v["version"]): float(v["weight"]) for v in p.body["variants"]}
        missing = sorted(v for v, w in wanted.items() if w > 0 and v not in routed_versions)
        if missing:
            notes.append(
                f"split '{p.name}' not applied: versions {missing} of {model} get traffic in it but are not "
                f"deployed (deployed: {sorted(routed_versions)})"
            )
            continue
        shadow = p.body.get("shadow")
        if shadow is not None and int(shadow) not in routed_versions:
            notes.append(f"split '{p.name}': shadow version {shadow} of {model} is not deployed: not scored")
            shadow = None
        split = Split(wanted, split_salt(p.name, p.body), int(shadow) if shadow is not None else None)
        break
    raw["version"] = f"store-{store_version}"
    return GatewayPolicy.from_dict(raw, source="policy store"), split, notes
