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
