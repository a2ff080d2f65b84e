"""A use case's experiments in the asset graph, generated from its declaration (``build_experiment_assets``): its
model's exposures → wide table → analysis (with guardrail and SRM checks), the impact predictor learned from its
past experiment units, and its causal questions on the real data (``UseCase.experiments``).

The daily experiment assets follow the gateway's exposure log (one file per UTC day); they are materialized on
demand — by the guardrail sensor's runs or from the UI — not by the backfill (tag ``keel/backfill: skip``). The
impact predictor and the causal analyses need the whole period: tagged ``keel/stage: after``, the use case's
``<use case>_causal`` job builds them (assets/jobs.py).
"""

import json
from functools import cache

import dagster as dg
import polars as pl

from assets.usecase import wiring
from keel.experiments.analysis import analyze, decision_p_values, report_markdown, with_decision
from keel.experiments.causal import load_causal_spec, run_causal
from keel.experiments.control import RUNNING, experiments, guardrail_decision, rolled_back_days, stored_spec
from keel.experiments.impact import (
    predict_experiment,
    prediction_path,
    predictor_path,
    realized_vs_predicted,
    record_prediction,
    train_predictor,
)
from keel.experiments.lake import key_segments, wide_columns, wide_rows
from keel.exposures import read_exposure_scan, realized_labels
from keel.factories.markdown import frame_to_markdown
from keel.storage import write_json_atomic
from keel.usecase import CausalQuestion, UseCase, first_day
from resources import simulated
from resources.home import KeelHomeResource
from resources.parquet_io import ALLOW_MISSING_PARTITIONS
from resources.policy import PolicyStoreResource

ON_DEMAND = {"keel/backfill": "skip"}
WHOLE_PERIOD = {"keel/stage": "after"}  # the use case's <name>_causal job builds it once its period is in


def _of_model(known: dict[str, dict], home, model: str) -> dict[str, dict]:
    """The experiments (id → meta) whose spec runs on ``model``; one whose spec cannot be read is left out here
    (the guardrail sensor reports it)."""
    out = {}
    for exp_id, meta in known.items():
        try:
            if stored_spec(home, exp_id).model == model:
                out[exp_id] = meta
        except Exception:  # noqa: BLE001, S112 - a missing or bad spec: not this lake's to judge
            continue
    return out


@cache
def build_experiment_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """``<use case>/experiment_exposures``, ``…/experiment_wide_table``, ``…/experiment_analysis`` (its model's
    experiments); ``…/impact_predictor`` when it declares experiment units; one asset per causal question."""
    w = wiring(uc)
    model, entity = uc.model.name, uc.features.entity.name
    group = w.group("experiments")
    # a UTC day of the gateway's clock: the use case's own days in a live replay (its declared period on)
    daily = dg.DailyPartitionsDefinition(start_date=first_day([uc]).isoformat(), end_offset=1)
    exposures_key, wide_key, analysis_key = (
        w.key("experiment_exposures"), w.key("experiment_wide_table"), w.key("experiment_analysis")
    )  # fmt: skip
    predictor_key = w.key("impact_predictor") if uc.experiments.units is not None else None
    wide_glob = f"$KEEL_HOME/storage/{uc.name}/experiment_wide_table/*.parquet"

    @dg.asset(
        key=exposures_key,
        partitions_def=daily,
        group_name=group,
        kinds={"parquet"},
        tags=ON_DEMAND,
        description=f"The gateway's exposure log of one UTC day for {model} (one row per answered request: unit, "
        f"variant, routed and answering model version, score, latency, {entity} key) as Parquet.",
    )
    def experiment_exposures(context: dg.AssetExecutionContext, keel_home: KeelHomeResource) -> pl.DataFrame:
        frame, scan = read_exposure_scan(keel_home.layout().exposure_dirs(), day=context.partition_key)
        if scan.skipped:
            context.log.warning(
                f"{scan.skipped} exposure-log lines were not whole records and were skipped: {scan.examples}"
            )
        frame = frame.filter((pl.col("model") == model) & (pl.col("status") == 200))  # the answered requests
        by_version = frame.group_by("routed_version").len().sort("routed_version")
        context.add_output_metadata(
            {
                "exposures": frame.height,
                "skipped_lines": scan.skipped,
                "by_routed_version": dg.MetadataValue.json(dict(by_version.iter_rows())),
            }
        )
        return frame

    @dg.asset(
        key=wide_key,
        partitions_def=daily,
        group_name=group,
        kinds={"parquet", "duckdb"},
        tags=ON_DEMAND,
        ins={"exposures": dg.AssetIn(exposures_key)},
        description=f"One wide row per exposure of each {model} experiment's window: variant, versions, score, "
        f"segments, the real outcome (the realized label, from the validated {entity} rows) and its loss, simulated "
        "business outcomes where the spec asks (known true effects), and the rolled-back mark. Query it with "
        f"DuckDB: read_parquet('{wide_glob}').",
    )
    def experiment_wide_table(
        context: dg.AssetExecutionContext,
        exposures: pl.DataFrame,
        policies: PolicyStoreResource,
        keel_home: KeelHomeResource,
    ) -> pl.DataFrame:
        layout = keel_home.layout()
        home = layout.root
        with policies.open() as store:
            known = _of_model(experiments(store), home, model)
        labels = realized_labels(uc.features, exposures["entity_key"], layout.storage / uc.name)
        frames = []
        for exp_id, meta in sorted(known.items()):
            spec = stored_spec(home, exp_id)
            frames.append(
                wide_rows(exposures, spec, meta, labels=labels, rolled_back_days=rolled_back_days(home, exp_id))
            )
        wide = (
            pl.concat(frames, how="vertical_relaxed")
            if frames
            else pl.DataFrame(schema=dict.fromkeys(wide_columns(key_segments(model))))
        )
        counts = wide.group_by("experiment_id", "variant").len().sort("experiment_id", "variant") if frames else None
        context.add_output_metadata(
            {
                "rows": wide.height,
                "with_real_outcome": int(wide["late"].is_not_null().sum()) if wide.height else 0,
                "by_experiment": dg.MetadataValue.md(
                    frame_to_markdown(counts, max_rows=50) if counts is not None else "no experiment"
                ),
                "duckdb_example": dg.MetadataValue.md(
                    "```sql\nSELECT floor(score * 10) / 10 AS bucket, variant, avg(offer_accepted) AS accept_rate, "
                    f"count(*) AS n\nFROM read_parquet('{wide_glob}')\nGROUP BY ALL ORDER BY ALL;\n```"
                ),
            }
        )
        return wide

    @dg.asset(
        key=analysis_key,
        group_name=group,
        kinds={"scipy", "polars"},
        tags=ON_DEMAND,
        ins={
            "wide": dg.AssetIn(
                wide_key,
                partition_mapping=dg.AllPartitionMapping(),
                metadata={ALLOW_MISSING_PARTITIONS: True},  # the days with experiment traffic
            )
        },
        deps=[predictor_key] if predictor_key else [],
        check_specs=[
            dg.AssetCheckSpec("guardrails", asset=analysis_key, description="no experiment breaches a guardrail"),
            dg.AssetCheckSpec(
                "sample_ratio", asset=analysis_key, description="every experiment's split matches its plan (SRM)"
            ),
        ],
        description=f"Per {model} experiment, from the wide table: arm counts and the SRM check, each metric's "
        "difference, lift and interval (Welch / Newcombe / delta method, CUPED), Benjamini–Hochberg, guardrails on "
        "the sequential test, the root-cause drill-down. Reports also go to "
        f"`$KEEL_HOME/storage/{uc.name}/experiment_analysis/<experiment id>.json`.",
    )
    def experiment_analysis(
        context: dg.AssetExecutionContext,
        wide: pl.DataFrame,
        policies: PolicyStoreResource,
        keel_home: KeelHomeResource,
    ):
        layout = keel_home.layout()
        home = layout.root
        with policies.open() as store:
            known = _of_model(experiments(store), home, model)
            decisions = {exp_id: guardrail_decision(store, exp_id, meta) for exp_id, meta in known.items()}
        wide = wide if "experiment_id" in wide.columns else None  # no day with experiment traffic yet
        reports, breached, flagged = {}, [], []
        for exp_id, meta in sorted(known.items()):
            rows = wide.filter(pl.col("experiment_id") == exp_id) if wide is not None else None
            if rows is None or rows.is_empty():
                continue
            decision = decisions[exp_id]
            try:
                # The sequential test continues from the looks the guardrail sensor made (its p-values only go down).
                report = analyze(
                    rows,
                    stored_spec(home, exp_id),
                    where=f"experiment_wide_table[{exp_id}]",
                    previous_p=decision_p_values(decision),
                )
            except Exception as exc:  # noqa: BLE001 - one experiment's bad data must not hide the others
                context.log.exception(f"{exp_id}: not analyzed: {type(exc).__name__}: {exc}")
                continue
            report = with_decision(report, decision) | {"status": meta["status"]}
            report["impact"] = realized_vs_predicted(_recorded_prediction(home, exp_id), report)
            reports[exp_id] = report
            write_json_atomic(report, layout.storage / uc.name / "experiment_analysis" / f"{exp_id}.json")
            breached += _breaches(exp_id, report, meta["status"])
            if report["srm"]["flagged"]:
                flagged.append(f"{exp_id}: {report['withheld_because'][0]}")
        yield dg.MaterializeResult(
            metadata={
                **simulated.of_run(context),
                "experiments": len(reports),
                "report": dg.MetadataValue.md(
                    "\n\n".join(report_markdown(i, r) for i, r in reports.items()) or "no data yet"
                ),
                "reports": dg.MetadataValue.json(
                    {
                        i: {k: r[k] for k in ("arms", "status", "guardrail_breached", "conclusions_withheld")}
                        | {"decision_version": (r["guardrail_decision"] or {}).get("version")}
                        for i, r in reports.items()
                    }
                ),
            }
        )
        yield dg.AssetCheckResult(
            check_name="guardrails", passed=not breached, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"breached": dg.MetadataValue.md("\n".join(f"- {b}" for b in breached) or "none")},
        )  # fmt: skip
        yield dg.AssetCheckResult(
            check_name="sample_ratio", passed=not flagged, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"flagged": dg.MetadataValue.md("\n".join(f"- {f}" for f in flagged) or "none")},
        )  # fmt: skip

    out = [experiment_exposures, experiment_wide_table, experiment_analysis]
    if predictor_key is not None:
        out.append(_impact_predictor(uc, predictor_key))
    out += [_causal_asset(uc, q) for q in uc.experiments.causal]
    return out


def _impact_predictor(uc: UseCase, key: dg.AssetKey) -> dg.AssetsDefinition:
    w = wiring(uc)
    table, units = uc.experiments.units_table, uc.experiments.units

    @dg.asset(
        key=key,
        group_name=w.group("experiments"),
        kinds={"lightgbm"},
        tags=WHOLE_PERIOD,
        ins={"rows": dg.AssetIn(w.key(f"validated_{table}"), partition_mapping=dg.AllPartitionMapping())},
        description="Predicts an experiment's lift before it runs: LightGBM quantile models (stored as text) with a "
        "conformalized 80 % interval, learned from a history of past experiments simulated on the real "
        f"{table} (keel.experiments.impact). `keel experiment start` records each new experiment's prediction "
        "with it; experiment_analysis compares prediction and realized lift. Running experiments that started "
        "before it existed get a prediction now, marked as made after the start.",
    )
    def impact_predictor(
        context: dg.AssetExecutionContext,
        rows: pl.DataFrame,
        policies: PolicyStoreResource,
        keel_home: KeelHomeResource,
    ):
        home = keel_home.layout().root
        predictor, check = train_predictor(units(rows))
        predictor.save(predictor_path(home, uc.model.name), check=check)
        with policies.open() as store:
            known = _of_model(experiments(store), home, uc.model.name)
        late = []
        for exp_id, meta in sorted(known.items()):
            if meta["status"] != RUNNING or prediction_path(home, exp_id).exists():
                continue
            spec = stored_spec(home, exp_id)
            if spec.impact:
                record_prediction(home, predict_experiment(predictor, spec) | {"made_after_start": True},
                                  started_at=meta.get("started_at"))  # fmt: skip
                late.append(exp_id)
        context.log.info(
            f"impact predictor: held-out coverage {check['coverage_80']:.0%}, error {check['median_abs_error']:.3f}"
        )
        return dg.MaterializeResult(
            metadata={
                **simulated.of_run(context),
                "held_out_coverage_80": round(check["coverage_80"], 3),
                "median_abs_error": round(check["median_abs_error"], 4),
                "always_the_mean_error": round(check["always_the_mean_error"], 4),
                "past_experiments": check["history"],
                "predictor_sha256": predictor.sha256,
                "predicted_after_start": dg.MetadataValue.json(late),
            }
        )

    return impact_predictor


def _causal_asset(uc: UseCase, q: CausalQuestion) -> dg.AssetsDefinition:
    w = wiring(uc)
    ins = {t: dg.AssetIn(w.key(f"validated_{t}"), partition_mapping=dg.AllPartitionMapping()) for t in q.tables}
    where = " × ".join(f"validated_{t}" for t in q.tables)

    @dg.asset(
        key=w.key(q.name),
        group_name=w.group("experiments"),
        kinds={"dowhy"},
        tags=WHOLE_PERIOD,
        ins=ins,
        description=f"{q.description or 'An observational question on the real data'}, answered with DoWhy "
        f"({q.spec.name}): backdoor identification, the spec's estimators, refuters and assumptions.",
    )
    def causal_analysis(context: dg.AssetExecutionContext, keel_home: KeelHomeResource, **tables: pl.DataFrame):
        spec = load_causal_spec(q.spec)
        report = run_causal(spec, q.frame(*(tables[t] for t in q.tables)), where=where)
        write_json_atomic(report, keel_home.layout().storage / uc.name / "causal" / f"{spec.id}.json")
        lines = [
            f"| {e['method']} | {e['value']:.4g} | [{e['ci'][0]:.4g}, {e['ci'][1]:.4g}] |"
            for e in report["estimates"]
        ]
        refs = [
            f"| {r['method']} | {r['new_effect']:.3f} | {'passed' if r['passed'] else 'FAILED'} — {r['rule']} |"
            for r in report["refutations"]
        ]
        context.log.info(f"{spec.id}: {report['estimate']:.4g} {report['ci']}")
        return dg.MaterializeResult(
            metadata={
                **simulated.of_run(context),
                "estimate": report["estimate"],
                "ci": dg.MetadataValue.json(report["ci"]),
                "rows": report["rows"],
                "backdoor_set": dg.MetadataValue.json(report["backdoor_set"]),
                "estimates": dg.MetadataValue.md(
                    "| estimator | effect | 95 % CI |\n|---|---:|---|\n" + "\n".join(lines)
                ),
                "refutations": dg.MetadataValue.md(
                    "| refuter | new effect | result |\n|---|---:|---|\n" + "\n".join(refs)
                ),
                "assumptions": dg.MetadataValue.md("\n".join(f"- {a}" for a in report["assumptions"])),
            }
        )

    return causal_analysis


def _recorded_prediction(home, exp_id: str) -> dict | None:
    path = prediction_path(home, exp_id)
    return json.loads(path.read_text()) if path.exists() else None


def _breaches(exp_id: str, report: dict, status: str) -> list[str]:
    """What the guardrails check says about one experiment: the decision that acted, with the evidence it acted on,
    then any breach this look finds on its own."""
    out = []
    decision = report.get("guardrail_decision")
    if decision:
        for g in decision["evidence"].get("guardrails", []):
            out.append(
                f"{exp_id}: {decision['action']} by the guardrail sensor at {decision['at']} (policy version "
                f"{decision['version']}): {g['reason']}"
            )
    acted_on = {g["metric"] for g in (decision or {}).get("evidence", {}).get("guardrails", [])}
    out += [
        f"{exp_id}: {g['reason']} → {status}"
        for g in report["guardrails"]
        if g["breached"] and g["metric"] not in acted_on
    ]
    return out
