"""A committee as a cheap, robust candidate (issue 32): the mean raw score of several LightGBM models, as one model.

Measured offline on 2013's flights (scripts/loop_policies.py, docs/live.md "The bar, measured offline"): a refit on
all labelled history ranks better than the first model but is worse calibrated in the months that differ from what
it learned (December's late share jumps from 0.13 to 0.33); the first model, fitted on January–February, still knows
winter. Their mean raw score beats either alone in most months — averaging cuts the variance of refits that each saw
one more month, and keeps what the first model learned.

``committee_model_text`` writes the mean into one ordinary LightGBM text model: the trees of every member, each
member's leaf values times its weight. A row's raw score is then Σ wᵢ · rawᵢ exactly (each tree adds one leaf value),
and so are its TreeSHAP contributions (linear in the leaf values), so the committee is registered, served, explained,
gated and canaried like any challenger — a new sha256, no new runtime path. Pure: texts in, text out.
"""

from __future__ import annotations

import math
import re

TREE = re.compile(r"^Tree=(\d+)$")  # a tree's first line in a LightGBM text model


def scaled_leaves(line: str, factor: float, shift: float = 0.0) -> str:
    """A ``leaf_value=`` line with every value × ``factor`` + ``shift`` (what an affine map of a tree's output is)."""
    return "leaf_value=" + " ".join(repr(float(v) * factor + shift) for v in line[len("leaf_value=") :].split())


# Header lines that must agree between members: a committee of models that read other features (or predict another
# thing) would be nonsense, not an average.
_MUST_AGREE = ("num_class=", "num_tree_per_iteration=", "max_feature_idx=", "objective=", "feature_names=")


def _split(text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """(header lines, one list of lines per tree, the lines from ``end of trees`` on)."""
    lines = text.split("\n")
    try:
        end = lines.index("end of trees")
    except ValueError:
        raise ValueError("not a LightGBM text model (no 'end of trees' line)") from None
    header, trees = [], []
    for line in lines[:end]:
        if TREE.match(line):
            trees.append([line])
        elif trees:
            trees[-1].append(line)
        else:
            header.append(line)
    if not trees:
        raise ValueError("not a LightGBM text model (no trees)")
    return header, trees, lines[end:]


def _field(header: list[str], prefix: str) -> str | None:
    return next((line for line in header if line.startswith(prefix)), None)


def committee_model_text(texts: list[str], weights: list[float] | None = None) -> str:
    """One LightGBM text model whose raw score is Σ weights[i] · raw score of ``texts[i]`` (default: the mean).

    The header (feature names, objective, …) is the first member's; the members must agree on it. Raises ValueError
    naming the member and field that differ, a linear-tree member, or weights that are not finite and positive."""
    if len(texts) < 2:
        raise ValueError(f"a committee needs at least two members, got {len(texts)}")
    weights = [1.0 / len(texts)] * len(texts) if weights is None else [float(w) for w in weights]
    if len(weights) != len(texts) or not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"weights must be one finite positive number per member, got {weights}")
    parts = [_split(t) for t in texts]
    header, _, tail = parts[0]
    for i, (other, trees, _) in enumerate(parts):
        for prefix in _MUST_AGREE:
            if _field(other, prefix) != _field(header, prefix):
                raise ValueError(
                    f"committee member {i}: {prefix.rstrip('=')} differs from member 0's "
                    f"({_field(other, prefix)!r} vs {_field(header, prefix)!r})"
                )
        if any(line == "is_linear=1" for tree in trees for line in tree):
            raise ValueError(f"committee member {i} has linear trees: their leaf models cannot be scaled here")
    out = [line for line in header if not line.startswith("tree_sizes=")]  # sizes changed: parsed tree by tree
    n = 0
    for (_, trees, _), w in zip(parts, weights, strict=True):
        for tree in trees:
            for line in tree:
                if TREE.match(line):
                    line = f"Tree={n}"
                    n += 1
                elif line.startswith("leaf_value="):
                    line = scaled_leaves(line, w)
                out.append(line)
    return "\n".join(out + tail)
