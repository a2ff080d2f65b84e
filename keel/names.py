"""Names that become paths (datasets, models, experiments) are validated here, once."""

from __future__ import annotations

import re

from keel.errors import InvalidNameError

# A fixed, keel-owned pattern (never user-supplied), so Python's re is safe here.
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def validate_name(name: str, *, what: str = "name") -> str:
    """Return ``name`` if it is safe to use as a path component, else raise ``InvalidNameError``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid {what} {name!r}: must match ^[a-z0-9][a-z0-9_-]{{0,63}}$ "
            "(lowercase letters, digits, '_' and '-', starting with a letter or digit)"
        )
    return name


# Tenant ids: what callers send as ``tenant_id`` and what policies (rate limits, prices, budgets) name. Narrower than
# the other identifiers of a request: no '.', '/' or ':' — a tenant id appears in file-backed reports, metric labels
# and policy keys, and with this alphabet it can never name a path (no separators, no '..').
TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
TENANT_ID_RULE = "1…64 characters from A–Z a–z 0–9 _ -, starting with a letter or digit"


def is_tenant_id(value: object) -> bool:
    return isinstance(value, str) and TENANT_ID.fullmatch(value) is not None


def column_identifier(name: str) -> str:
    """A column name as a keel identifier: lower case, ``_`` for anything not a letter or digit (``Water flow
    [l/s]`` → ``water_flow_l_s``), a letter first — how ``keel new`` names a table's columns in its contracts."""
    out = re.sub(r"[^0-9a-z]+", "_", name.strip().lower()).strip("_") or "column"
    return out if out[0].isalpha() else f"c_{out}"
