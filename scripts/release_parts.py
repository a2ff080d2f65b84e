"""What a KEEL_HOME's pipeline built, as comparable facts: the registered models (sha256), the champion, and each
ledger entry's release id and part hashes (data, model, infra, policy). Used to show that a refactoring changed
nothing that the main job builds: run ``KEEL_NO_SERVE=1 scripts/up`` on a clean clone before and after, then

    .venv/bin/python scripts/release_parts.py BEFORE_HOME AFTER_HOME

prints both and exits 1 when they differ (timestamps and host-specific values are left out).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from keel.home import KeelHome  # noqa: E402
from keel.ledger import Ledger  # noqa: E402
from keel.registry import ModelRegistry  # noqa: E402

MODEL = "flight-delay"


def facts(root: Path) -> dict:
    home = KeelHome(root)
    with ModelRegistry(home.registry) as registry, Ledger(home.ledger) as ledger:
        versions = {}
        v = 1
        while True:
            try:
                versions[v] = registry.sha_of_version(MODEL, v)
            except Exception:  # noqa: BLE001 - past the last version
                break
            v += 1
        entries = [
            {
                "release_id": e.release_id,
                "reverts": e.reverts,
                "parts": {name: e.manifest[name]["hash"] for name in ("data", "model", "infra", "policy")},
                "model_sha256": e.manifest["model"]["parts"].get("sha256"),
            }
            for e in ledger.log()
        ]
        return {
            "registered": versions,
            "champion": registry.alias(MODEL, "champion"),
            "ledger": entries,
            "ledger_verified": ledger.verify().ok,
        }


def main(argv: list[str]) -> int:
    homes = [Path(a) for a in argv[1:]]
    if not homes:
        print(__doc__)
        return 2
    found = [facts(h) for h in homes]
    for h, f in zip(homes, found, strict=True):
        print(f"== {h}")
        print(json.dumps(f, indent=2, default=str))
    if len(found) > 1:
        same = all(f == found[0] for f in found[1:])
        print("same: champion, registered models and every release's parts" if same else "DIFFERENT")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
