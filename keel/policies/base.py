"""What every policy type is built from (keel/policies/types.py): the ``PolicyType`` base class and the checks that
name the violated rule (``number``, ``known_keys``, ``tenant_id``, ``registry_version``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from keel.names import TENANT_ID_RULE, is_tenant_id
from keel.policies.errors import PolicyValidationError

VersionsOf = Callable[[str], set[int]]
WEIGHT_TOLERANCE = 1e-9
EXPERIMENT_STATUSES = ("running", "paused", "stopped", "rolled_back")


def tenant_id(name: str, tenant: object) -> None:
    """A tenant a policy names has the gateway's tenant-id alphabet (keel.names), or the policy is refused."""
    if not is_tenant_id(tenant):
        raise PolicyValidationError(name, "tenant_id", f"tenants: {tenant!r} is not a tenant id ({TENANT_ID_RULE})")


def number(
    name: str,
    rule: str,
    body: Mapping[str, Any],
    key: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
    required: bool = True,
) -> float | None:
    if key not in body:
        if required:
            raise PolicyValidationError(name, f"{rule}_present", f"'{key}' is required")
        return None
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v)):
        raise PolicyValidationError(name, f"{rule}_number", f"'{key}' must be a finite number, got {v!r}")
    if integer and int(v) != v:
        raise PolicyValidationError(name, f"{rule}_integer", f"'{key}' must be a whole number, got {v!r}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise PolicyValidationError(
            name, f"{rule}_range", f"'{key}' must be {'>' if lo_open else '≥'} {lo}, got {v!r}"
        )
    if hi is not None and v > hi:
        raise PolicyValidationError(name, f"{rule}_range", f"'{key}' must be ≤ {hi}, got {v!r}")
    return float(v)


def known_keys(name: str, body: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise PolicyValidationError(
            name, "known_fields", f"unknown field '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})"
        )


def registry_version(
    name: str, model: Any, version: Any, versions_of: Callable[[str], set[int]] | None, what: str
) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PolicyValidationError(
            name, "model_version_integer", f"{what} must be a registry version ≥ 1, got {version!r}"
        )
    if versions_of is not None:
        known = versions_of(model)
        if version not in known:
            raise PolicyValidationError(
                name,
                "model_version_registered",
                f"{what} {model} version {version} is not in the registry (registered: {sorted(known) or 'none'})",
            )


class PolicyType:
    """A policy type: ``validate`` raises PolicyValidationError or returns None; ``apply`` lays a valid body over
    the gateway policy's fields (a dict of ``GatewayPolicy.to_dict()``), for the types that shape the gateway."""

    type: ClassVar[str]
    shapes_gateway: ClassVar[bool] = False

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        raise NotImplementedError

    @classmethod
    def apply(cls, gateway: dict[str, Any], body: dict[str, Any]) -> None:
        """Only types with ``shapes_gateway`` are applied."""
