"""Load YAML into plain Python values while remembering the line of every field.

Contract errors must name the file, the line and the field. PyYAML's composed node tree carries the positions; we
turn it into dicts/lists/scalars ourselves (safe constructors only) and keep a side table ``path -> line``.
"""

from __future__ import annotations

from typing import Any

import yaml

from keel.errors import ContractError

Path = tuple[str | int, ...]


def dotted(path: Path) -> str:
    """``("rules", 3, "pattern")`` -> ``rules[3].pattern``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


class PositionedYaml:
    """A YAML document as plain data plus the 1-based line of each field path."""

    def __init__(self, data: Any, lines: dict[Path, int], source: str):
        self.data = data
        self.lines = lines
        self.source = source

    def line_of(self, path: Path) -> int | None:
        # Walk up until a path with a known position: an error on a missing key points at its parent mapping.
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def error(self, path: Path, message: str) -> ContractError:
        return ContractError(message, source=self.source, line=self.line_of(path), field=dotted(path) or None)


def load_positioned(text: str, source: str = "<string>") -> PositionedYaml:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ContractError(f"YAML syntax error: {problem}", source=source, line=line) from None
    if node is None:
        raise ContractError("the contract file is empty", source=source, line=1)
    lines: dict[Path, int] = {}
    constructor = yaml.SafeLoader("")

    def convert(n: yaml.Node, path: Path) -> Any:
        lines[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in n.value:
                key = constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise ContractError(
                        f"mapping keys must be strings, got {key!r}",
                        source=source,
                        line=key_node.start_mark.line + 1,
                        field=dotted(path) or None,
                    )
                if key in out:
                    raise ContractError(
                        f"duplicate key '{key}'",
                        source=source,
                        line=key_node.start_mark.line + 1,
                        field=dotted(path + (key,)),
                    )
                out[key] = convert(value_node, path + (key,))
                lines[path + (key,)] = key_node.start_mark.line + 1
            return out
        if isinstance(n, yaml.SequenceNode):
            return [convert(item, path + (i,)) for i, item in enumerate(n.value)]
        try:
            return constructor.construct_object(n, deep=True)
        except yaml.YAMLError as exc:
            raise ContractError(
                f"cannot read value: {exc}", source=source, line=n.start_mark.line + 1, field=dotted(path)
            ) from None

    return PositionedYaml(convert(node, ()), lines, source)
