"""Tenants that prove who they are: a tenant is a policy (type ``tenant``, named by its tenant id) holding what it
may claim — its tiers, its risk levels, its quota share — and its API keys, each stored only as a salted hash.

A key is shown once, when it is made (``keel tenant add`` / ``rotate``): ``keel_<key id>_<secret>``, the secret 32
random bytes (URL-safe base64). The policy keeps the key id, a random salt and ``sha256(salt ‖ secret)``: the
secret has 256 bits of entropy, so a fast salted hash is enough (a slow password hash protects *guessable*
secrets; nothing here is guessable), and the edge can check a key in microseconds on every request. Being a policy,
a tenant's keys are versioned and hash-chained with every other policy: who added, rotated or revoked a key, when
and why is `keel policy log`.

Why API keys and not JWTs checked by Envoy's ``jwt_authn``: revocation. A JWT stays valid until it expires unless
every edge consults a deny list; a key is valid exactly while the policy in force holds its hash, and the edge's
configuration follows the policy store within a second — revoking is committing.

Pure: keys, hashes and policy bodies in, values out (keel/cli/tenants.py and the edge use them).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from keel.names import is_tenant_id

KEY_PREFIX = "keel"
KEY_ID = re.compile(r"[0-9a-f]{12}")
KEY_FORMAT = re.compile(r"keel_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
TIERS = ("L1", "L2", "L3")
RISK_LEVELS = (1, 2, 3)
DEFAULT_TIERS = ("L2", "L3")  # a new tenant may not claim L1 unless it is given it
DEFAULT_RISK_LEVELS = (2, 3)  # nor risk level 1 (the strictest lane)


class TenantError(ValueError):
    """A tenant or key that cannot be: the message names what and why."""


@dataclass(frozen=True)
class StoredKey:
    key_id: str
    salt: str  # hex
    sha256: str  # hex of sha256(salt bytes ‖ secret)
    created: str  # ISO 8601, UTC

    def as_body(self) -> dict[str, str]:
        return {"id": self.key_id, "salt": self.salt, "sha256": self.sha256, "created": self.created}


def new_key(created: str) -> tuple[str, StoredKey]:
    """A fresh API key (to show once) and what is stored of it."""
    key_id, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_bytes(16)
    digest = hashlib.sha256(salt + secret.encode()).hexdigest()
    return f"{KEY_PREFIX}_{key_id}_{secret}", StoredKey(key_id, salt.hex(), digest, created)


def parse_key(key: str) -> tuple[str, str]:
    """(key id, secret) of a presented key; TenantError when it is not keel's key format (nothing of it echoed)."""
    m = KEY_FORMAT.fullmatch(key or "")
    if not m:
        raise TenantError("not a keel API key (keel_<12 hex>_<43 characters>)")
    return m.group(1), m.group(2)


def key_matches(stored: StoredKey, secret: str) -> bool:
    digest = hashlib.sha256(bytes.fromhex(stored.salt) + secret.encode()).hexdigest()
    return hmac.compare_digest(digest, stored.sha256)


@dataclass(frozen=True)
class Tenant:
    name: str
    keys: tuple[StoredKey, ...]
    tiers: tuple[str, ...] = DEFAULT_TIERS
    risk_levels: tuple[int, ...] = DEFAULT_RISK_LEVELS
    quota_share: float = 1.0  # the share of the platform's capacity it may hold (its rate limit, its budget's base)

    def as_body(self) -> dict[str, Any]:
        return {
            "keys": [k.as_body() for k in self.keys],
            "tiers": list(self.tiers),
            "risk_levels": list(self.risk_levels),
            "quota_share": self.quota_share,
        }

    @classmethod
    def from_body(cls, name: str, body: dict[str, Any]) -> Tenant:
        problems = body_problems(name, body)
        if problems:
            raise TenantError(f"tenant {name}: {problems[0]}")
        return cls(
            name=name,
            keys=tuple(StoredKey(k["id"], k["salt"], k["sha256"], k["created"]) for k in body.get("keys", [])),
            tiers=tuple(body.get("tiers", DEFAULT_TIERS)),
            risk_levels=tuple(int(r) for r in body.get("risk_levels", DEFAULT_RISK_LEVELS)),
            quota_share=float(body.get("quota_share", 1.0)),
        )

    def authenticates(self, key: str) -> bool:
        """Whether ``key`` is one of this tenant's keys (constant time in the secret)."""
        try:
            key_id, secret = parse_key(key)
        except TenantError:
            return False
        return any(k.key_id == key_id and key_matches(k, secret) for k in self.keys)

    def may_claim(self, tier: str, risk_level: int) -> str | None:
        """Why this tenant may not send a request of ``tier`` at ``risk_level`` (None: it may)."""
        if tier not in self.tiers:
            return f"tenant {self.name} may use tiers {', '.join(self.tiers)}, not {tier}"
        if risk_level not in self.risk_levels:
            return f"tenant {self.name} may use risk levels {', '.join(map(str, self.risk_levels))}, not {risk_level}"
        return None


def body_problems(name: str, body: Any) -> list[str]:
    """Every rule a ``tenant`` policy body breaks, as (rule: message) text; [] when it is valid."""
    out: list[str] = []
    if not is_tenant_id(name):
        out.append(f"tenant_id: {name!r} is not a tenant id")
    if not isinstance(body, dict):
        return [*out, "body_mapping: a tenant's body is a mapping"]
    unknown = sorted(set(body) - {"keys", "tiers", "risk_levels", "quota_share"})
    if unknown:
        out.append(f"known_fields: unknown field {unknown[0]!r}")
    keys = body.get("keys", [])
    if not isinstance(keys, list):
        out.append("keys_list: 'keys' is a list of stored keys")
        keys = []
    seen = set()
    for k in keys:
        if not isinstance(k, dict) or set(k) != {"id", "salt", "sha256", "created"}:
            out.append("key_shape: each key is {id, salt, sha256, created} — never a secret")
            continue
        if not KEY_ID.fullmatch(str(k["id"])) or k["id"] in seen:
            out.append(f"key_id: {k['id']!r} is not a unique 12-hex-digit key id")
        seen.add(k["id"])
        if not re.fullmatch(r"[0-9a-f]{32}", str(k["salt"])) or not re.fullmatch(r"[0-9a-f]{64}", str(k["sha256"])):
            out.append(f"key_hash: key {k['id']}: salt is 16 bytes and sha256 32 bytes, in hex")
    tiers = body.get("tiers", list(DEFAULT_TIERS))
    if not isinstance(tiers, list) or not tiers or any(t not in TIERS for t in tiers):
        out.append(f"tiers: a non-empty list of {', '.join(TIERS)}")
    risks = body.get("risk_levels", list(DEFAULT_RISK_LEVELS))
    if not isinstance(risks, list) or not risks or any(isinstance(r, bool) or r not in RISK_LEVELS for r in risks):
        out.append(f"risk_levels: a non-empty list of {', '.join(map(str, RISK_LEVELS))}")
    share = body.get("quota_share", 1.0)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        out.append(f"quota_share: a number in (0, 1], got {share!r}")
    return out


def authenticate(tenants: dict[str, Tenant], key: str) -> Tenant | None:
    """The tenant ``key`` belongs to, None when none (a malformed, unknown, wrong or revoked key alike)."""
    try:
        key_id, secret = parse_key(key)
    except TenantError:
        return None
    for tenant in tenants.values():
        for k in tenant.keys:
            if k.key_id == key_id:
                return tenant if key_matches(k, secret) else None
    return None


REPLAY_TENANT = "replay"  # the live replay's traffic (gpu_runtime/replay.py's default tenant)


def issue_keys(store, names: list[str], now: str, author: str, reason: str) -> dict[str, str]:
    """A fresh API key for each of ``names``, committed to the policy store ``store`` in one version: each tenant
    added with every tier and risk level (traffic keel itself sends: the live replay, a drill), or its key rotated
    — a key is shown once, so each run takes a new one and the last run's stops working. Returns name → key."""
    keys, changes = {}, {}
    for name in names:
        keys[name], stored = new_key(now)
        changes[name] = ("tenant", Tenant(name, (stored,), TIERS, RISK_LEVELS).as_body())
    store.apply(changes, author=author, reason=reason)
    return keys


def revoke_keys(store, names: list[str], author: str, reason: str) -> None:
    """Every key of ``names`` revoked in one version (the tenants stay, with what they may claim)."""
    changes = {}
    for name in names:
        old = store.get(name)
        if old is not None:
            t = Tenant.from_body(name, old.body)
            changes[name] = ("tenant", Tenant(name, (), t.tiers, t.risk_levels, t.quota_share).as_body())
    if changes:
        store.apply(changes, author=author, reason=reason)


def issue_replay_key(store, now: str) -> str:
    """A fresh API key for the live replay's tenant (``issue_keys``)."""
    rotated = " (rotated)" if store.get(REPLAY_TENANT) is not None else ""
    return issue_keys(
        store, [REPLAY_TENANT], now, "keel live replay", f"the live replay's key for this run{rotated}"
    )[REPLAY_TENANT]
