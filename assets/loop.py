"""The loop's monthly ``loop_report`` — the year, measured — beside its challenger assets (assets/challengers.py):

    drift_report ─► challenger_model ─► challenger_evaluation (check: challenger_gate) ─► canary (policy store)
                                                                                          ─► model_deployment
    features + drift_report (month) + ledger ─► loop_report: served vs static vs naive vs the expanding-window
    reference (its only dependencies are its month's: the ledger and the instance say what served and what the loop did)

The drift sensor decides *whether* and *on which months* (keel.loop.retrain.plan_retrain) and launches
``<use case>_challenger`` with those months as run config; the canary sensor starts a canary (shadow first) for the
candidate the gate chose.
"""

from calendar import monthrange
from datetime import UTC
from functools import cache

import dagster as dg
import polars as pl

from assets.challengers import Refits, build_challenger_assets
from assets.deployment import canary_decision
from assets.drift import build_drift_assets
from assets.estimates import estimate_check, estimate_check_spec, estimates_table
from assets.features import build_feature_assets
from assets.models import training_config
from assets.usecase import wiring
from keel.exposure_log import scan_exposures
from keel.factories.checks import partitioned_check
from keel.home import asset_file
from keel.intervals import COVERAGE_TOLERANCE, Interval, coverage_held
from keel.loop.estimate import Estimator
from keel.loop.report import Promotion, Release, days_after, expanding_window, month_report, naive_window
from keel.loop.year import on_the_months, shorten, step_words, year_rows, year_so_far
from keel.plots import lines_svg, svg_markdown
from keel.serving_health import DayHealth, answered_words, combined, day_health
from keel.usecase import UseCase
from resources.home import KeelHomeResource
from resources.ledger import LedgerResource
from resources.policy import PolicyStoreResource
from resources.registry import ModelRegistryResource

COVERAGE_CHECK = "interval_coverage_held"


@cache
def build_loop_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """The use case's ``challenger_model``, ``challenger_evaluation`` (its gate) and monthly ``loop_report``, in its
    ``loop`` group; judged by the metrics of its label's task."""
    w = wiring(uc)
    fs, name = uc.features, uc.model.name
    entity = fs.entity.name
    table = build_feature_assets(uc)[0].key
    drift_report = build_drift_assets(uc)[1].key
    challenger_key, report_key = w.key("challenger_model"), w.key("loop_report")
    metrics = uc.metrics
    first = training_config(uc)

    @dg.asset(
        key=report_key,
        partitions_def=w.monthly,
        group_name=w.group("loop"),
        kinds={"lightgbm", "polars"},
        ins={"features": dg.AssetIn(table)},
        # Only its month's inputs: the releases come from the ledger and the loop's actions from the instance, so an
        # unpartitioned deployment or gate built later never marks a past month's report out of date (Unsynced).
        deps=[drift_report],
        check_specs=[estimate_check_spec(report_key, w.monthly, fs.label.task)]
        + (
            [
                partitioned_check(
                    COVERAGE_CHECK,
                    asset=report_key,
                    partitions_def=w.monthly,
                    description=f"the month's served intervals covered their labels within {COVERAGE_TOLERANCE:.0%} "
                    f"of the declared {uc.model.interval_coverage:.0%} (a WARN: drift breaks it)",
                )
            ]
            if fs.label.task == "regression"
            else []
        ),
        description=f"The year, measured: on the month's realized labels, the {' and '.join(metrics)} of what was "
        f"served (the model of the release live each day, from the ledger), of the static first model "
        f"({', '.join(first.train_months)}), of a naive "
        "baseline retrained every month without a gate and of the expanding-window reference (all labelled history, "
        "refitted at the month's start with no delay: what the best simple policy would have done) — both refitted at the "
        "start of the month each row was scored as of (when it was asked about, not when its label came); the releases "
        "that went live in the month with their delay from the end of the drift month that caused them; and the "
        "loop's actions with their simulated and wall times and their reasons; what actually answered the month's "
        "requests (the model, its coarse fallback, the last resort, failures: `answered`); for a regression, the "
        "share of served answers whose label fell inside the interval they carried (interval_coverage) against the "
        "declared coverage. `year`: every month so far at a glance — a table and a chart of the headline metric with the "
        "releases and the canaries' decisions on their months. Built with each month's drift report.",
    )
    def loop_report(
        context: dg.AssetExecutionContext,
        features: pl.DataFrame,
        registry: ModelRegistryResource,
        ledger: LedgerResource,
        keel_home: KeelHomeResource,
        policies: PolicyStoreResource,
    ):
        month = context.partition_key
        with ledger.open() as led:
            entries = led.of_line(uc.training_asset)  # this model's releases (the ledger holds every model's)
        releases = [
            Release(e.live_from, e.release_id, e.manifest["model"]["parts"]["sha256"])
            for e in entries
            if e.manifest.get("model", {}).get("parts", {}).get("sha256")
        ]
        if not releases:
            raise dg.Failure("the ledger has no release: nothing has served yet (deploy the first model)")
        home = keel_home.layout()
        naive = Refits(
            uc,
            home,
            lambda m: naive_window(m, months=uc.months),
            first.params,
            "the year does not go back two months: the static model",
        )
        expanding = Refits(
            uc,
            home,
            lambda m: expanding_window(m, uc.months),
            first.params,
            "fewer than two months before it: the static model",
        )
        with registry.open() as reg:
            static_text = reg.load(releases[0].model_sha)

            def half_width(sha: str) -> float | None:
                interval = Interval.from_metadata(reg.get(name, sha).metadata)
                return interval.half_width if interval else None

            def estimator(sha: str) -> Estimator | None:
                return Estimator.from_metadata(reg.get(name, sha).metadata)

            report = month_report(
                month, features, releases, reg.load, static_text, naive, fs, expanding, half_width, estimator
            )
            versions = {sha: reg.version(name, sha) for sha in report.served_by}
            estimates = [(versions[sha], e) for sha, e in report.estimates.items()]
            changes = [
                Promotion(
                    e.live_from,
                    e.release_id,
                    reg.version(name, sha),
                    (reg.get(name, sha).metadata.get("trigger") or {}).get("drift_window"),
                )
                for e, sha in model_changes(entries)
            ]
        promotions = [p for p in changes if p.live_from.strftime("%Y-%m") == month]
        naive_note, expanding_note = naive.note(), expanding.note()
        last = month == uc.months[-1]  # the span's last month also shows what the loop did after it
        with policies.open() as store:
            year_actions = _loop_actions(context.instance, month, challenger_key, name, store, after=last)
        actions = [a for a in year_actions if a["simulated"][:7] == month or (last and a["simulated"][:7] > month)]
        rows = [
            ("served", report.served),
            ("static", report.static),
            ("naive", report.naive),
            ("expanding", report.expanding),
        ]
        frame = pl.DataFrame(
            {"month": [month] * len(rows), "model": [r[0] for r in rows]}
            | {m: [r[1].metrics[m] for r in rows] for m in metrics},
            schema={"month": pl.String, "model": pl.String} | dict.fromkeys(metrics, pl.Float64),
        )
        head = metrics[0]  # the headline metric: AUC, RMSE
        served, static = report.served.metrics[head], report.static.metrics[head]
        year = year_at_a_glance(home, report_key, uc.months, month, frame, head, changes, year_actions)
        answered = what_answered(home, name, month)

        def num(x: float | None) -> dg.MetadataValue:
            return dg.MetadataValue.float(_round(x)) if x is not None else dg.MetadataValue.null()

        yield dg.Output(
            frame,
            metadata={
                **{f"{who}_{m}": num(score.metrics[m]) for m in metrics for who, score in rows},
                f"served_minus_static_{head}": num(
                    served - static if served is not None and static is not None else None
                ),
                f"labelled_{entity}s": report.rows,
                # what answered the month's requests (the exposure log), beside what the ledger says was served
                "answered": answered_words(answered),
                "answered_by_model_share": num(answered.share(answered.scored) if answered.requests else None),
                "served_by": ", ".join(f"v{versions[s]}: {n:,} {entity}s" for s, n in report.served_by.items())
                or "none",
                "naive": naive_note,
                "expanding": f"the reference (all labelled history, no delay): {expanding_note}",
                "promotions": dg.MetadataValue.table(
                    records=[
                        dg.TableRecord(
                            {
                                "release": p.release_id,
                                "live_from": p.live_from.isoformat(timespec="minutes"),
                                "version": p.version,
                                "drift_window": p.drift_window or "",
                                "delay_days": _round(p.delay_days),
                            }
                        )
                        for p in promotions
                    ],
                    schema=PROMOTIONS_SCHEMA,
                ),
                "promotion_delay_days": num(
                    max(p.delay_days for p in promotions if p.delay_days is not None)
                    if any(p.delay_days is not None for p in promotions)
                    else None
                ),
                "scores": dg.MetadataValue.table(
                    records=[
                        dg.TableRecord({"model": n} | {m: _round(sc.metrics[m]) for m in metrics}) for n, sc in rows
                    ],
                    schema=report_schema(metrics),
                ),
                "actions": dg.MetadataValue.table(
                    records=[dg.TableRecord(a) for a in actions], schema=ACTIONS_SCHEMA
                ),
                "action_count": len(actions),
                "estimates": estimates_table(estimates),
                **year,
                **(
                    {
                        "interval_coverage": num(report.interval_coverage),
                        "interval_declared_coverage": uc.model.interval_coverage,
                    }
                    if fs.label.task == "regression"
                    else {}
                ),
            },
        )
        yield estimate_check(report_key, estimates)
        if fs.label.task == "regression":
            held, why = coverage_held(report.interval_coverage, uc.model.interval_coverage)
            yield dg.AssetCheckResult(
                asset_key=report_key,
                check_name=COVERAGE_CHECK,
                passed=held,
                severity=dg.AssetCheckSeverity.WARN,
                description=why,
                metadata={"interval_coverage": num(report.interval_coverage)},
            )

    return [*build_challenger_assets(uc), loop_report]


def model_changes(entries) -> list[tuple]:
    """(ledger entry, model sha) of each release that put another model live than the one before it — a promotion;
    not the releases that redeployed the same model (a canary step, a policy change)."""
    out, before = [], None
    for e in entries:
        sha = e.manifest.get("model", {}).get("parts", {}).get("sha256")
        if sha and sha != before:
            out.append((e, sha))
        before = sha or before
    return out


def report_schema(metrics: tuple[str, ...]) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                "model",
                "string",
                description="served (what the ledger says served each day), static, naive, and "
                "expanding (the reference: all labelled history, refitted with no delay)",
            ),
            *(dg.TableColumn(m, "float") for m in metrics),
        ]
    )


PROMOTIONS_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("release", "string"),
        dg.TableColumn("live_from", "string", description="simulated time the release went live"),
        dg.TableColumn("version", "int", description="the model version it serves"),
        dg.TableColumn("drift_window", "string", description="the month whose drift report asked for the model"),
        dg.TableColumn("delay_days", "float", description="days from that month's end to the release"),
    ]
)

ACTIONS_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("simulated", "string", description="simulated time of the decision"),
        dg.TableColumn("wall", "string", description="wall time the run was created (UTC)"),
        dg.TableColumn("action", "string"),
        dg.TableColumn("detail", "string"),
        dg.TableColumn(
            "reason", "string", description="why: the drift decision's, or the canary decision's evidence"
        ),
        dg.TableColumn("status", "string"),
        dg.TableColumn(
            "days_after_labels",
            "float",
            description="days from the end of the month whose labels it rests on (the gate month) to the decision",
        ),
    ]
)


def commit_reasons(store, version: str | None) -> str:
    """The reasons a policy commit (a canary decision) carried, joined; "" when there is none to read."""
    return "; ".join((canary_decision(store, version) or {}).get("reasons") or [])


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def what_answered(home, model: str, month: str) -> DayHealth:
    """How the month's requests to ``model`` ended (keel/serving_health.py), from every runtime's exposure log."""
    days = [f"{month}-{d:02d}" for d in range(1, monthrange(int(month[:4]), int(month[5:]))[1] + 1)]
    records = [r for rt in home.serving_dirs() for day in days for r in scan_exposures(rt.exposures, day=day).records]
    return combined(day_health(records), model, month)


def year_at_a_glance(
    home,
    key: dg.AssetKey,
    months,
    month: str,
    frame: pl.DataFrame,
    head: str,
    changes: list[Promotion],
    actions: list[dict],
) -> dict:
    """The year so far (keel/loop/year.py): every built month's report up to ``month`` (this one's ``frame``) as a
    table and a chart of ``head``, with the model changes and the canaries' decisions on their months."""
    earlier = [
        pl.read_parquet(p)
        for m in months
        if m < month and (p := asset_file(home.storage, list(key.path), m)).exists()
    ]
    xs, series = year_so_far(pl.concat([*earlier, frame], how="vertical_relaxed"), head)
    marks = [(p.live_from.strftime("%Y-%m"), f"v{p.version} live {p.live_from:%m-%d}") for p in changes]
    marks += [
        (a["simulated"][:7], f"{a['action']} {a['simulated'][5:10]}")
        for a in actions
        if a["action"] in ("canary rollback", "canary promote")
    ]
    marks = on_the_months(marks, xs)
    notes: dict[str, list[str]] = {}
    for x, text in marks:
        notes.setdefault(x, []).append(text)
    rows = year_rows(xs, series, head, {m: "; ".join(t) for m, t in notes.items()})
    chart = lines_svg(f"{head} by month, {xs[0]} … {xs[-1]}: served vs the references", xs, series, marks)
    columns = [dg.TableColumn("month", "string")]
    columns += [dg.TableColumn(f"{m}_{head}", "float") for m in series]
    columns += [dg.TableColumn("what_happened", "string", description="releases live, canary decisions")]
    return {  # the table shown inline on the partition's page, the chart one click away
        "year": dg.MetadataValue.table([dg.TableRecord(r) for r in rows], dg.TableSchema(columns=columns)),
        "year_chart": dg.MetadataValue.md(svg_markdown(chart)),
        "year_months": len(xs),
    }


def _loop_actions(
    instance: dg.DagsterInstance, month: str, challenger: dg.AssetKey, model: str, store, after: bool = False
) -> list[dict]:
    """The loop's runs whose simulated time falls in ``month`` or before it (``after``: or after it): challengers trained (runs configuring
    the ``challenger`` asset's op), canary decisions deployed (of canaries of ``model``: ``<model>.<tag>-v<version>``),
    each with its reason (a canary's from the policy commit it carried out, in ``store``)."""
    out, policies = [], store.state()
    for run in instance.get_runs(limit=5000):
        sim = run.tags.get("keel/sim_now", "")
        if not sim or (sim[:7] > month and not after):
            continue
        if challenger.to_python_identifier() in (run.run_config or {}).get("ops", {}):  # its config is required
            action, detail = "challenger", f"plan {run.tags.get('keel/plan')}"
            reason, gate = run.tags.get("keel/reason", ""), run.tags.get("keel/plan", "").rpartition("|")[2]
        elif "keel/canary_action" in run.tags and run.tags.get("keel/canary", "").startswith(f"{model}."):
            action = f"canary {run.tags['keel/canary_action']}"
            detail = f"{run.tags.get('keel/canary')}: " + step_words(
                run.tags["keel/canary_action"], run.tags.get("keel/canary_percent")
            )
            reason = commit_reasons(store, run.tags.get("keel/policy_version"))
            canary = policies.get(run.tags.get("keel/canary", ""))
            gate = ((canary.body.get("origin") or {}) if canary else {}).get("gate_month")
        else:
            continue
        wall = instance.get_run_record_by_id(run.run_id).create_timestamp
        out.append(
            {
                "simulated": sim,
                "wall": wall.astimezone(UTC).isoformat(timespec="seconds"),
                "action": action,
                "detail": detail,
                "reason": shorten(reason),
                "status": run.status.value,
                "days_after_labels": days_after(gate, sim),
            }
        )
    return sorted(out, key=lambda a: a["simulated"])
