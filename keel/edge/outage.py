"""The edge and a policy store it cannot read: what it serves meanwhile, and when it says so (issue 61 item 3).

The trade-off, decided: while the store cannot be read the edge **keeps serving on the last configuration it applied**
(availability: every tenant in force keeps working, nothing is let in that was not in force) — the cost is that a key
revoked *during* the outage keeps working until the store can be read again. So the outage is made loud: after
``bound_s`` (30 s by default, ``KEEL_EDGE_STORE_OUTAGE_S``) of failed reads it is a critical incident and a critical
alert, and recovered when a read succeeds. And a key revoked in any commit the edge has seen is refused for good
(``RevokedKeys``): a store that comes back older, or a restored copy that still holds the key, never lets it in again.

Pure values; ``gpu_runtime/edge_follower.py`` (``EdgeFollower``) acts on them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

OUTAGE_BOUND_S = 30.0


def outage_bound_s() -> float:
    """``KEEL_EDGE_STORE_OUTAGE_S``, else ``OUTAGE_BOUND_S``."""
    return float(os.environ.get("KEEL_EDGE_STORE_OUTAGE_S") or OUTAGE_BOUND_S)


@dataclass
class StoreOutage:
    """Failed reads of the policy store, as the edge's follower sees them."""

    bound_s: float = OUTAGE_BOUND_S
    since: float | None = None  # the first failed read of this outage (monotonic seconds)
    raised: bool = False  # the incident and the alert are out
    error: str = ""  # the latest failure

    def failed(self, now: float, error: str) -> bool:
        """A read failed at ``now``: True exactly once per outage — when it has lasted ``bound_s`` (raise it now)."""
        if self.since is None:
            self.since = now
        self.error = error
        if not self.raised and now - self.since >= self.bound_s:
            self.raised = True
            return True
        return False

    def read(self, now: float) -> float | None:
        """A read succeeded at ``now``: the outage's length when it had been raised (recover it), else None."""
        lasted = now - self.since if self.since is not None and self.raised else None
        self.since, self.raised, self.error = None, False, ""
        return lasted


class RevokedKeys:
    """Every key id the edge has seen in force and then gone: refused whatever a later state holds. Kept in a file
    beside the edge's configuration, so a restarted edge remembers."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ids: set[str] = set(json.loads(self.path.read_text())) if self.path.exists() else set()
        self.in_force: set[str] | None = None  # the key ids of the state applied last (None: none yet)

    def update(self, key_ids: Iterable[str]) -> set[str]:
        """The key ids of a new state; returns those of them to refuse (revoked in a state seen before)."""
        now = set(key_ids)
        if self.in_force is not None and (gone := self.in_force - now - self.ids):
            self.ids |= gone
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(json.dumps(sorted(self.ids)))
            os.replace(tmp, self.path)
        self.in_force = now - self.ids
        return now & self.ids
