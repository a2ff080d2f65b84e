"""Policy files: the YAML an operator commits with ``keel policy apply``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keel.policies.errors import PolicyError


def load_policy_file(path: str | Path) -> tuple[dict[str, tuple[str, dict[str, Any]]], int | None]:
    """A YAML policy file: ``policies: [{name, type, body}, …]`` (or one ``{name, type, body}``), optional
    ``version`` (the version this commit must become). Returns (changes, expected_version)."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path}: not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: expected a mapping with 'policies' (or name, type, body)")
    items = raw.get("policies", [raw] if "name" in raw else None)
    if not isinstance(items, list) or not items:
        raise PolicyError(f"{path}: expected 'policies': a list of {{name, type, body}}")
    changes = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not {"name", "type", "body"} <= set(item):
            raise PolicyError(f"{path}: policies[{i}] needs name, type and body")
        changes[item["name"]] = (item["type"], item["body"])
    expected = raw.get("version")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
        raise PolicyError(f"{path}: 'version' must be a whole number")
    return changes, expected
