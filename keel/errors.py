"""The one exception hierarchy of keel.

Callers catch ``KeelError`` subclasses, never bare ``Exception``. Every message says what was wrong, where, and
(where it helps) what to do about it.
"""

from __future__ import annotations


class KeelError(Exception):
    """Base class of every error keel raises on purpose."""


class ContractError(KeelError):
    """A data contract is malformed: YAML syntax, an unknown rule, a bad regex, a wrong type.

    ``source`` is the contract file (or ``<string>``), ``line`` its 1-based line, ``field`` the dotted path of the
    offending field (``rules[3].pattern``).
    """

    def __init__(self, message: str, *, source: str = "<string>", line: int | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        where = source if line is None else f"{source}:{line}"
        what = f" field '{field}'" if field else ""
        super().__init__(f"{where}:{what} {message}".replace(": :", ":"))


class FeatureSpecError(KeelError):
    """A feature declaration is inconsistent (names what and where)."""


class DataReadError(KeelError):
    """Input data could not be read at all (missing file, unknown format, not CSV/Parquet)."""


class InvalidNameError(KeelError):
    """A name that would become part of a path does not match ``^[a-z0-9][a-z0-9_-]{0,63}$``."""
