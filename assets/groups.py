"""What every asset of a group carries in the UI: its owner, where the group's documentation is, and — for groups
the set-up does not build — why they are grey and how to run them.

Dagster has no page for a group, so each asset's definition metadata says it (``group_docs``, ``how_to_run``), and
its owner shows in the asset's header and the catalog's owner filter. ``with_group_metadata`` applies this to every
asset in definitions.py, so no asset module repeats it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import dagster as dg

from keel.usecase import UseCase


@dataclass(frozen=True)
class Group:
    owner: str
    docs: str
    about: str
    how_to_run: str | None = None  # only for groups the set-up does not materialize
    live: bool = False  # with how_to_run: a live replay (the default set-up) builds it, a backfill does not


GROUPS = {
    "raw": Group(
        "team:data-platform", "docs/contracts.md", "{title}: the source tables as delivered ({origins}), read as text"
    ),
    "contracts": Group(
        "team:data-platform",
        "docs/contracts.md",
        "data contracts: validated rows and the quarantine, one check per rule, per month",
    ),
    "features": Group(
        "team:ml-platform",
        "docs/features.md",
        "point-in-time features (offline table) and the online store, with skew, distribution and health checks; "
        "what is served frozen",
    ),
    "drift": Group(
        "team:ml-platform",
        "docs/drift.md",
        "each month's features against what the serving model was trained on; the drift sensor acts on it",
    ),
    "models": Group(
        "team:ml-platform",
        "docs/models.md",
        "the {model} model: trained, evaluated behind a quality gate, promoted in the registry",
    ),
    "loop": Group(
        "team:ml-platform",
        "docs/live.md",
        "what drift leads to: a challenger on the most recent labelled months, gated against the champion",
        how_to_run="Built by the loop in a live replay (scripts/up, or `keel live run`): the drift sensor launches "
        "{uc}_challenger with the months its plan names. By hand: launch {uc}_challenger from the Launchpad with "
        "train_months and gate_month as config.",
        live=True,
    ),
    "operations": Group(
        "team:ml-serving",
        "docs/alerts.md",
        "incidents: faults the platform detected and undid by itself, and chaos drills, with their timelines",
        how_to_run="Refreshed by watchdog_sensor whenever the incident log changes (job keel_incidents); empty until "
        "something happened. By hand: launch keel_incidents from the Launchpad, or run `keel incidents`.",
        live=True,
    ),
    "metering": Group(
        "team:ml-serving",
        "docs/metering.md",
        "who used what and what it cost: usage per tenant, model version and day (requests from the exposure log, "
        "compute from Triton's statistics) and its cost under the versioned price table",
        how_to_run="Materialized by metering_sensor for each finished day of the gateway's clock (job keel_metering) "
        "once traffic has been served; empty before. By hand: materialize a day of usage and cost_report from the "
        "UI, or run `keel usage` / `keel cost`.",
        live=True,
    ),
    "deployments": Group(
        "team:ml-serving",
        "docs/serving.md",
        "the champion live in Triton behind the gateway, canaries and rollbacks",
    ),
    "experiments": Group(
        "team:experimentation",
        "docs/experiments.md",
        "A/B tests on live traffic, their analysis and guardrails; causal questions on the period's data",
        how_to_run="The exposure log, wide table and analysis follow live gateway traffic, by UTC day of the "
        "gateway's clock (days, from the period's first): start an experiment with `keel experiment start "
        "<spec.yaml>`, send traffic, then materialize the day from the UI or let the guardrail sensor do it. The "
        "causal questions and the impact predictor are built by the set-up (job {uc}_causal).",
    ),
    "streaming": Group(
        "team:data-platform",
        "docs/streaming.md",
        "the weather contract run as a Flink streaming job, with parity against the batch path",
        how_to_run="It needs the Flink mini-cluster (~1 min a month): materialize a "
        "month of stream_validated_weather from the UI (select it, Materialize, pick the month), or run the Flink "
        "job by hand (docs/streaming.md).",
    ),
}


def _base(group: str, uc: UseCase | None = None) -> str:
    """A use case's group (``flights_raw``) is documented as its kind (``raw``); platform groups as they are. A use
    case's name may hold ``_`` itself (``on_time_raw``): its prefix is cut when it is known."""
    if group in GROUPS:
        return group
    if uc is not None and group.startswith(f"{uc.name}_"):
        return group[len(uc.name) + 1 :]
    return group.split("_", 1)[-1]


def _filled(text: str, uc: UseCase | None) -> str:
    """A group's text in the words of the use case whose group it is (its name, title, model, data's origins)."""
    if uc is None:
        return text
    origins = ", ".join(sorted({s.origin for s in uc.sources if s.origin})) or "its sources"
    return text.format(uc=uc.name, title=uc.title, model=uc.model.name, origins=origins)


def group_metadata(group: str, uc: UseCase | None = None) -> dict[str, str]:
    g = GROUPS[_base(group, uc)]
    out = {"group_docs": f"{g.docs} — {_filled(g.about, uc)}"}
    if g.how_to_run:
        out["how_to_run"] = _filled(g.how_to_run, uc)
    return out


def _with_group(spec: dg.AssetSpec, uc: UseCase | None) -> dg.AssetSpec:
    g = GROUPS[_base(spec.group_name, uc)]
    spec = spec.merge_attributes(
        owners=[g.owner] if not spec.owners else [], metadata=group_metadata(spec.group_name, uc)
    )
    if g.how_to_run and spec.tags.get("keel/backfill") == "skip":  # grey until something builds it: say what does
        built = (
            "**Not built by the backfill** (`KEEL_LIVE=0 scripts/up`); a live replay (`scripts/up`) builds it"
            if g.live
            else "**Not built by the set-up**"
        )
        spec = spec.replace_attributes(
            description=f"{spec.description}\n\n{built} (its checks show no result until it runs). "
            f"{_filled(g.how_to_run, uc)}"
        )
    return spec


def with_group_metadata(assets: Iterable[dg.AssetsDefinition | dg.AssetSpec], uc: UseCase | None = None) -> list:
    """Every asset with its group's owner (unless it names its own) and documentation pointer, in the words of
    ``uc`` — the use case the assets are of (None: the platform's own groups)."""
    out = []
    for a in assets:
        with_group = lambda spec: _with_group(spec, uc)  # noqa: E731
        out.append(with_group(a) if isinstance(a, dg.AssetSpec) else a.map_asset_specs(with_group))
    return out
