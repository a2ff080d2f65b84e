"""``keel tenant add | list | rotate | revoke``: tenants that authenticate (keel/tenants.py), each a ``tenant``
policy in the policy store — its keys stored as salted hashes, every change a hash-chained commit.

    keel tenant add ops --tiers L1,L2 --risk-levels 1,2 --quota-share 0.5 --reason "ops dashboards"
    keel tenant list
    keel tenant rotate ops --reason "quarterly"          # a new key; the old ones stop working
    keel tenant revoke ops [--key KEY_ID] --reason "laptop lost"

A new key is printed once, on stdout alone (so that ``KEY=$(keel tenant add …)`` takes it); what is stored cannot give
it back. Refused with exit 2 and the reason: a name that is not a tenant id, a tenant that exists (add) or does not
(rotate, revoke), a key id the tenant does not hold.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from keel.cli.common import EXIT_BAD_INPUT, EXIT_OK, Parser, author_of, open_policies
from keel.tenants import DEFAULT_RISK_LEVELS, DEFAULT_TIERS, Tenant, TenantError, new_key


def _csv(kind):
    def parse(text: str):
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None

    return parse


def register(sub) -> None:
    tenant = sub.add_parser("tenant", help="tenants that authenticate: add, list, rotate and revoke their API keys")
    tenant.add_argument("--store", help="policy store: a file or a postgresql:// URL (default: $KEEL_HOME's)")
    tenant.add_argument("--registry", type=Path, help=argparse.SUPPRESS)
    tsub = tenant.add_subparsers(dest="action", required=True, parser_class=Parser)
    add = tsub.add_parser("add", help="a new tenant and its first API key (printed once)")
    add.add_argument("name")
    add.add_argument("--tiers", type=_csv(str), default=DEFAULT_TIERS, help="tiers it may claim (default L2,L3)")
    add.add_argument("--risk-levels", type=_csv(int), default=DEFAULT_RISK_LEVELS,
                     help="risk levels it may claim (default 2,3)")  # fmt: skip
    add.add_argument("--quota-share", type=float, default=1.0, help="its share of the capacity, in (0, 1]")
    rotate = tsub.add_parser("rotate", help="a new API key (printed once); the tenant's other keys stop working")
    rotate.add_argument("name")
    revoke = tsub.add_parser("revoke", help="stop a tenant's keys working (all, or --key KEY_ID)")
    revoke.add_argument("name")
    revoke.add_argument("--key", help="the key id (keel_<key id>_…) to revoke; default: every key")
    for p in (add, rotate, revoke):
        p.add_argument("--reason", required=True)
        p.add_argument("--author", help="default: $USER")
    add.set_defaults(func=_add)
    rotate.set_defaults(func=_rotate)
    revoke.set_defaults(func=_revoke)
    tsub.add_parser("list", help="every tenant: its tiers, risk levels, quota share and key ids").set_defaults(
        func=_list
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _tenants(store) -> dict[str, Tenant]:
    return {p.name: Tenant.from_body(p.name, p.body) for p in store.state().values() if p.type == "tenant"}


def _commit(args, tenant: Tenant) -> int:
    store = open_policies(args, must_exist=False)
    with store:
        commit = store.apply({tenant.name: ("tenant", tenant.as_body())}, author=author_of(args), reason=args.reason)
    print(f"keel: tenant {tenant.name} committed as policy version {commit.version}", file=sys.stderr)
    return EXIT_OK


def _refuse(message: str) -> int:
    print(f"keel: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _add(args: argparse.Namespace) -> int:
    with open_policies(args, must_exist=False) as store:
        if args.name in _tenants(store):
            return _refuse(f"tenant {args.name} exists: `keel tenant rotate {args.name}` gives it a new key")
    key, stored = new_key(_now())
    try:
        tenant = Tenant.from_body(args.name, Tenant(args.name, (stored,), tuple(args.tiers), tuple(args.risk_levels),
                                                    args.quota_share).as_body())  # fmt: skip
    except TenantError as exc:
        return _refuse(str(exc))
    _commit(args, tenant)
    print(key)  # once, on stdout alone
    print(f"keel: that is {args.name}'s API key (id {stored.key_id}); it is not stored and cannot be shown again",
          file=sys.stderr)  # fmt: skip
    return EXIT_OK


def _existing(args) -> Tenant | None:
    with open_policies(args, must_exist=False) as store:
        return _tenants(store).get(args.name)


def _rotate(args: argparse.Namespace) -> int:
    tenant = _existing(args)
    if tenant is None:
        return _refuse(f"no tenant {args.name} (`keel tenant list`)")
    key, stored = new_key(_now())
    _commit(args, Tenant(tenant.name, (stored,), tenant.tiers, tenant.risk_levels, tenant.quota_share))
    print(key)
    old = ", ".join(k.key_id for k in tenant.keys) or "none"
    print(f"keel: {args.name}'s new API key (id {stored.key_id}); its keys {old} no longer work", file=sys.stderr)
    return EXIT_OK


def _revoke(args: argparse.Namespace) -> int:
    tenant = _existing(args)
    if tenant is None:
        return _refuse(f"no tenant {args.name} (`keel tenant list`)")
    if args.key and args.key not in {k.key_id for k in tenant.keys}:
        return _refuse(f"tenant {args.name} holds no key {args.key} (its keys: "
                       f"{', '.join(k.key_id for k in tenant.keys) or 'none'})")  # fmt: skip
    kept = tuple(k for k in tenant.keys if args.key and k.key_id != args.key)
    return _commit(args, Tenant(tenant.name, kept, tenant.tiers, tenant.risk_levels, tenant.quota_share))


def _list(args: argparse.Namespace) -> int:
    with open_policies(args, must_exist=False) as store:
        tenants = _tenants(store)
    if not tenants:
        print("no tenants (`keel tenant add NAME --reason …`)")
    for t in sorted(tenants.values(), key=lambda t: t.name):
        keys = ", ".join(f"{k.key_id} (since {k.created})" for k in t.keys) or "none: every key revoked"
        print(f"{t.name}: tiers {','.join(t.tiers)}; risk levels {','.join(map(str, t.risk_levels))}; "
              f"quota share {t.quota_share:g}; keys {keys}")  # fmt: skip
    return EXIT_OK
