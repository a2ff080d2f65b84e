"""What a drift decision trains and how the best of it is chosen: ``challenger_model`` (several candidates) and
``challenger_evaluation`` (the gate that picks among them and the champion).

    drift_report ─► challenger_model (rolling, expanding, recency-weighted, committee; recalibrated on label drift)
                 ─► challenger_evaluation (check: challenger_gate) ─► canary: shadow first (policy store)

The candidates (keel.loop.candidates.candidate_specs) are each registered in the registry with their window; the gate
scores all of them and the champion on the newest labelled days none of them trained on, compares each with the
champion paired and clustered by day (keel.loop.shadow), corrects for their number (Holm) and picks among those
surely better — the committee first, else the lowest difference (keel.loop.candidates.choose_candidate) — or none:
the champion stays. Its table, one row per candidate, is in the UI. The chosen one becomes the registry's ``challenger``
(a candidate the gate refused never does: it is not served); the canary sensor starts its canary.
"""

import dagster as dg
import polars as pl

from assets.drift import build_drift_assets
from assets.features import build_feature_assets, feature_code_version
from assets.models import run_id_of, training_config
from assets.usecase import wiring
from keel.faults import fault_metadata, gate_verdict
from keel.home import KeelHome, asset_file
from keel.loop.candidates import candidate_specs, choose_candidate
from keel.loop.estimate import estimator_record
from keel.loop.fit import FitError, candidate_training, fit_candidate, gate_rows, newest_rows
from keel.loop.gate import DEFAULT_GATE
from keel.loop.shadow import ShadowPolicy
from keel.metrics import LOSS_NAMES
from keel.registry import CHALLENGER_GATE_KEY
from keel.training.coarse import coarse_metadata, fit_coarse
from keel.training.model import TrainingConfig, interval_record, labelled_days, predict, train_model
from keel.usecase import UseCase
from resources.home import KeelHomeResource
from resources.registry import ModelRegistryResource

CHALLENGER_GATE = CHALLENGER_GATE_KEY  # the asset check and the registry key of its verdict


class ChallengerConfig(dg.Config):
    """What the drift sensor's plan says (keel.loop.retrain.RetrainPlan): the months the rolling candidate is fitted
    on, the newest labelled month — early-stopped on its days before ``gate_from_day``, judged on the days from it —,
    the drift that asked for it, and whether that drift report found the label itself drifted (then the champion,
    recalibrated, is a candidate too)."""

    train_months: list[str]
    gate_month: str
    gate_from_day: int = 22
    drift_window: str = ""
    drift_event: int = 0
    label_drift: bool = False


def read_months(uc: UseCase, home: KeelHome, months: list[str]) -> pl.DataFrame:
    """The stored partitions of the use case's feature table for ``months``; a missing one is an error naming it."""
    table = build_feature_assets(uc)[0].key
    paths = [asset_file(home.storage, list(table.path), m) for m in months]
    missing = [m for m, p in zip(months, paths, strict=True) if not p.exists()]
    if missing:
        raise dg.Failure(
            f"{table.to_user_string()} has no stored partition for {', '.join(missing)}: materialize it first"
        )
    return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")


def build_challenger_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    w = wiring(uc)
    fs, name, task = uc.features, uc.model.name, uc.task
    loss = LOSS_NAMES[task].replace("_", "-")
    entity = fs.entity.name
    # The gate: the same margin and row count as before, now paired per day (clusters) and across candidates.
    policy = ShadowPolicy(margin=DEFAULT_GATE.margin, alpha=DEFAULT_GATE.alpha, min_labelled=uc.loop.gate_min_rows,
                          min_clusters=5)  # fmt: skip
    drift_report = build_drift_assets(uc)[1].key
    challenger_key, evaluation_key = w.key("challenger_model"), w.key("challenger_evaluation")
    first = training_config(uc)

    @dg.asset(
        key=challenger_key,
        group_name=w.group("loop"),
        kinds={"lightgbm"},
        deps=[drift_report],
        tags={"keel/backfill": "skip"},
        description=f"The candidates to replace the served {name} model, trained when drift asks (the drift sensor's "
        "plan): the rolling window (the three labelled months before the newest), the expanding window (all "
        "labelled history), the expanding window with recency weights, a committee (the mean of the first model "
        "and the expanding refits of this decision and the one before) and — when the label itself drifted — the "
        "champion recalibrated on the newest labelled days; each early-stopped on the newest month's first three "
        "weeks and registered with its window and the drift report that asked for it.",
    )
    def challenger_model(
        context: dg.AssetExecutionContext,
        config: ChallengerConfig,
        registry: ModelRegistryResource,
        keel_home: KeelHomeResource,
    ) -> dg.Output[pl.DataFrame]:
        if not config.train_months:
            raise dg.Failure("train_months is empty: a challenger needs months to be fitted on")
        if config.gate_month in config.train_months:
            raise dg.Failure(f"gate month {config.gate_month} is in the training window: the gate would not be fair")
        if not 2 <= config.gate_from_day <= 28:
            raise dg.Failure(
                f"gate_from_day {config.gate_from_day}: must be 2…28 (early-stop before it, judge from it)"
            )
        specs = candidate_specs(tuple(config.train_months), uc.months, config.label_drift, uc.loop.candidates)
        months = sorted({m for s in specs for m in s.train_months} | {config.gate_month})
        features = read_months(uc, keel_home.layout(), months)
        run_id = run_id_of(context)
        rows, coarse, fitted = [], None, {}
        newest = newest_rows(uc, features, config)  # early stopping's days: each candidate's interval is fitted there
        newest_named = f"{config.gate_month} days 1–{config.gate_from_day - 1}"
        with registry.open() as reg:
            for spec in specs:
                try:
                    text, record = fit_candidate(uc, spec, config, features, reg, first.params, fitted)
                except FitError as exc:  # the run fails with the reason in the UI, not a traceback
                    raise dg.Failure(f"candidate {spec.name}: {exc}") from exc
                fitted[spec] = text
                record |= {
                    "candidate": spec.name,
                    "candidate_of": spec.describe(),
                    "run_id": run_id,
                    "window": "expanding" if spec.expanding else None,
                    "trigger": {"drift_window": config.drift_window, "drift_event": config.drift_event},
                    "gate_month": config.gate_month,
                    "gate_from_day": config.gate_from_day,
                    "feature_code_version": feature_code_version(uc),
                    **interval_record(text, newest, fs, uc.model.interval_coverage, newest_named),
                    **estimator_record(text, newest, fs, newest_named),
                }
                sha = reg.register(name, text, record).sha256
                if coarse is None:  # one coarse model for the decision (the first candidate's), linked to each
                    coarse = fit_coarse(reg, name, uc.model.coarse, features, candidate_training(spec, config, first.params, uc),
                                        fs, sha, {"train_months": list(config.train_months), "run_id": run_id},
                                        uc.model.interval_coverage)  # fmt: skip
                elif coarse[1] is not None:
                    reg.annotate(name, sha, {"coarse_sha256": coarse[0].sha256})
                version = reg.version(name, sha)
                rows.append({"candidate": spec.name, "sha256": sha, "version": version, "of": spec.describe(),
                             "best_iteration": record.get("best_iteration")})  # fmt: skip
                context.log.info(f"candidate {spec.name}: v{version}, {spec.describe()}")
        return dg.Output(
            pl.DataFrame(
                {"model": [name] * len(rows)} | {k: [r[k] for r in rows] for k in ("candidate", "sha256", "version")}
            ),  # fmt: skip
            metadata={
                "candidates": dg.MetadataValue.table(
                    records=[dg.TableRecord({k: r[k] for k in ("candidate", "version", "of")}) for r in rows],
                    schema=dg.TableSchema(
                        columns=[
                            dg.TableColumn("candidate", "string"),
                            dg.TableColumn("version", "int"),
                            dg.TableColumn("of", "string"),
                        ]
                    ),
                ),  # fmt: skip
                "version": rows[0]["version"],
                "fitted_on": ", ".join(config.train_months),
                "early_stopped_on": f"{config.gate_month} days 1–{config.gate_from_day - 1}",
                "gate_month": config.gate_month,
                "drift_window": config.drift_window or dg.MetadataValue.null(),
                "label_drift": config.label_drift,
                "train_rows": features.height,
                **coarse_metadata(coarse),
            },
        )

    @dg.asset(
        key=evaluation_key,
        group_name=w.group("loop"),
        kinds={"lightgbm"},
        ins={"model": dg.AssetIn(challenger_key)},
        tags={"keel/backfill": "skip"},
        check_specs=[
            dg.AssetCheckSpec(
                CHALLENGER_GATE,
                asset=evaluation_key,
                description=f"Some candidate beats the champion on the gate days' labelled {entity}s: mean "
                f"per-{entity} {loss} lower by more than {policy.margin}, paired, with a one-sided "
                f"{1 - policy.alpha:.0%} bound clustered by day and Holm's correction for the number of candidates. "
                "Only the chosen candidate goes to the canary (shadow first).",
            )
        ],
        description="Every candidate against the champion on the newest labelled days none trained on (the gate "
        "month from gate_from_day on): the paired per-day-clustered difference of their losses, Holm-corrected "
        "across candidates (keel.loop.candidates.choose_candidate); the committee is chosen when it is surely better, "
        "else the surely-better one with the lowest difference. The "
        "`candidates` table shows each one's scores; the canary sensor starts a canary for the chosen one.",
    )
    def challenger_evaluation(
        context: dg.AssetExecutionContext,
        config: ChallengerConfig,
        registry: ModelRegistryResource,
        keel_home: KeelHomeResource,
        model: pl.DataFrame,
    ):
        frame = gate_rows(uc, read_months(uc, keel_home.layout(), [config.gate_month]), config)
        days = labelled_days(frame, uc.features)
        candidates = {r["candidate"]: r for r in model.iter_rows(named=True)}
        with registry.open() as reg:
            champion = reg.alias(name, "champion")
            if champion is None:
                raise dg.Failure("no champion to compare with: train and promote the first model first")
            champion_version = reg.version(name, champion)
            champion_scores, labels = predict(reg.load(champion), frame, fs)
            scores = {c: predict(reg.load(r["sha256"]), frame, fs)[0] for c, r in candidates.items()
                      if r["sha256"] != champion}  # fmt: skip
        choice = choose_candidate(labels, champion_scores, scores, days, policy, task)
        rows = {r.name: r for r in choice.rows}
        shown = choice.chosen or (min(rows, key=lambda n: rows[n].verdict.delta or 0.0) if rows else None)
        if shown is None:
            raise dg.Failure(f"every candidate is the champion (v{champion_version}) already: nothing to compare")
        chosen = candidates[shown]
        with registry.open() as reg:
            for c, row in rows.items():
                reg.annotate(name, candidates[c]["sha256"], {CHALLENGER_GATE: row.as_row() | {
                    "gate_month": config.gate_month, "champion_version": champion_version,
                    "run_id": run_id_of(context)}})  # fmt: skip
            passed, reason = gate_verdict(choice.chosen is not None, choice.reason, shown)  # keel/faults.py
            if passed:  # only a candidate its gate passed becomes the challenger: a refused one never answers
                reg.set_alias(
                    name, "challenger", chosen["sha256"], f"{shown}: chosen on drift in {config.drift_window}"
                )
        context.log.info(f"candidates vs champion v{champion_version} on {config.gate_month}: {reason}")
        best = rows[shown].verdict
        yield dg.Output(
            pl.DataFrame(
                {
                    "challenger_version": [chosen["version"]],
                    "champion_version": [champion_version],
                    "gate_month": [config.gate_month],
                    "passed": [passed],
                    "candidate": [shown],
                }
            ),  # fmt: skip
            metadata={
                "passed": passed,
                "reason": reason,
                **fault_metadata(),
                "candidate": shown,
                "challenger_version": int(chosen["version"]),
                "champion_version": champion_version,
                "challenger_sha256": chosen["sha256"],
                "gate_month": config.gate_month,
                "gate_days": f"{config.gate_from_day}–end",
                "drift_window": config.drift_window or dg.MetadataValue.null(),
                "drift_event": config.drift_event,
                "rows": best.labelled,
                "loss": best.loss,
                "delta": dg.MetadataValue.float(round(best.delta, 5))
                if best.delta is not None
                else dg.MetadataValue.null(),  # fmt: skip
                "candidates": dg.MetadataValue.table(
                    records=[
                        dg.TableRecord(_table_row(r.as_row(), candidates[r.name]["version"])) for r in choice.rows
                    ],
                    schema=CANDIDATES_SCHEMA,
                ),  # fmt: skip
            },
        )
        yield dg.AssetCheckResult(
            asset_key=evaluation_key,
            check_name=CHALLENGER_GATE,
            passed=passed,
            # A candidate that is not better is the loop working, not a fault: the champion stays.
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "reason": reason,
                "challenger_version": int(chosen["version"]),
                "champion_version": champion_version,
            },  # fmt: skip
        )

    return [challenger_model, challenger_evaluation]


CANDIDATES_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("candidate", "string"),
        dg.TableColumn("version", "int"),
        dg.TableColumn("labelled", "int", description="gate rows scored by both"),
        dg.TableColumn("days", "int", description="days among them (the clusters)"),
        dg.TableColumn("delta", "float", description="mean per-row loss, candidate − champion (< 0: better)"),
        dg.TableColumn("se", "float", description="its standard error, clustered by day"),
        dg.TableColumn("p_value", "float", description="one-sided: not better by the margin"),
        dg.TableColumn("holm_alpha", "float", description="the level Holm's step-down held it to"),
        dg.TableColumn("surely_better", "bool"),
        dg.TableColumn("chosen", "bool"),
    ]
)


def _table_row(row: dict, version: int) -> dict:
    out = {k: row[k] for k in ("candidate", "labelled", "days", "surely_better", "chosen")} | {"version": version}
    for k in ("delta", "se", "p_value", "holm_alpha"):
        out[k] = None if row[k] is None else round(float(row[k]), 6)
    return out


class Refits:
    """A baseline refitted at the start of each month rows are scored as of (keel.loop.report.month_report calls it
    with that month): the window ``window_of(month)`` gives, fitted once per window and kept for the report."""

    def __init__(self, uc: UseCase, home, window_of, params: dict, none: str):
        self.uc, self.home, self.window_of, self.params, self.none = uc, home, window_of, params, none
        self.fitted: dict[str, tuple[str | None, str]] = {}  # scoring month → (text, how it was fitted)

    def __call__(self, month: str) -> str | None:
        if month not in self.fitted:
            self.fitted[month] = _refit(self.uc, self.home, self.window_of(month), self.params, self.none)
        return self.fitted[month][0]

    def note(self) -> str:
        """How each scoring month's baseline was fitted (one month: just how)."""
        if len(self.fitted) == 1:
            return next(iter(self.fitted.values()))[1]
        return "; ".join(f"scored in {m}: {how}" for m, (_, how) in sorted(self.fitted.items()))


def _refit(uc: UseCase, home, window: tuple[tuple[str, ...], str] | None, params: dict, none: str):
    """A baseline refitted on ``window`` (fit months, early-stopping month): (its text, how it was fitted), or
    (None, why not)."""
    if window is None:
        return None, none
    fit, valid = window
    try:
        frames = read_months(uc, home, [*fit, valid])
    except dg.Failure as exc:
        return None, str(exc)
    config = TrainingConfig(train_months=fit, valid_month=valid, params=params)
    return train_model(frames, config, uc.features).text, f"fitted on {fit[0]}…{fit[-1]}, early-stopped on {valid}"
