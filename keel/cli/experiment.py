"""``keel experiment``: experiments: start, analyze, predict, causal questions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keel.cli.common import EXIT_OK, EXIT_PROBLEM, author_of, home_layout, home_root, open_policies
from keel.errors import DataReadError
from keel.sqldb import location_of


def register(sub) -> None:
    experiment = sub.add_parser("experiment", help="experiment analysis: statistics, guardrails, drill-down")
    esub = experiment.add_subparsers(dest="experiment_command", required=True, metavar="COMMAND")
    analyze = esub.add_parser(
        "analyze",
        help="analyze any Parquet/CSV with a variant column, outcomes and covariates against a spec "
        "(exit 1: sample-ratio mismatch or a guardrail breached)",
    )
    analyze.add_argument("--spec", required=True, type=Path, help="experiment spec (YAML)")
    analyze.add_argument("--data", required=True, type=Path, help="rows: one per unit (Parquet or CSV)")
    analyze.add_argument("--out", required=True, type=Path, help="where to write the report (JSON)")
    analyze.add_argument("--min-support", type=int, default=200, help="smallest segment the drill-down descends into")
    analyze.set_defaults(func=_experiment_analyze)
    for name, help_ in (
        ("start", "start an experiment from its spec: its split goes into the policy store; gateways follow"),
        ("status", "an experiment's status, split and history"),
        ("stop", "end an experiment: every unit back to the control"),
        ("pause", "pause an experiment: every unit to the control until resumed"),
        ("resume", "resume a paused experiment"),
        ("rollback", "end an experiment as failed: control only, data partitions marked, ledger entry"),
    ):
        cmd = esub.add_parser(name, help=help_)
        if name == "start":
            cmd.add_argument("--spec", required=True, type=Path, help="experiment spec (YAML)")
        else:
            cmd.add_argument("id", help="experiment id")
        if name != "status":
            cmd.add_argument("--reason", required=name != "start", help="why (goes into the policy commit)")
            cmd.add_argument("--author", help="default: the current user")
        cmd.add_argument(
            "--store",
            type=location_of,
            help="policy store: a file or a postgresql:// URL (default: $KEEL_HOME/policies.sqlite, or $KEEL_CONTROL_PLANE)",
        )
        cmd.add_argument("--registry", type=Path, help="model registry (default: $KEEL_HOME/registry)")
        cmd.set_defaults(func=_experiment_control, experiment_action=name)
    predict = esub.add_parser(
        "predict",
        help="predict an experiment's lift (with its 80 %% interval) from its spec's impact block, before it runs",
    )
    predict.add_argument("--spec", required=True, type=Path, help="experiment spec (YAML) with an impact block")
    predict.add_argument(
        "--predictor",
        type=Path,
        help="default: the spec's model's use case's, $KEEL_HOME/storage/<use case>/impact_predictor/predictor.json",
    )
    predict.set_defaults(func=_experiment_predict)
    causal = esub.add_parser(
        "causal",
        help="a causal analysis with DoWhy: graph, identification, estimates, refuters (exit 1: a refuter failed)",
    )
    causal.add_argument("--spec", required=True, type=Path, help="causal analysis spec (YAML)")
    causal.add_argument(
        "--data",
        type=Path,
        help="rows (Parquet/CSV); default: the installed use case's causal data (its causal_data)",
    )
    causal.add_argument("--out", required=True, type=Path, help="where to write the report (JSON)")
    causal.add_argument(
        "--usecase", help="whose shipped causal data to read without --data (default: the one installed)"
    )
    causal.set_defaults(func=_experiment_causal)


def _experiment_control(args: argparse.Namespace) -> int:
    from keel.experiments import control

    store = open_policies(args, must_exist=args.experiment_action != "start")
    home, action = home_root(), args.experiment_action
    if action == "start":
        c = control.start(store, args.spec, home=home, author=author_of(args), reason=args.reason)
        print(f"started: policy version {c.version} ({', '.join(c.changes)})")
        _print_recorded_prediction(home, c)
        return EXIT_OK
    if action == "status":
        print(json.dumps(control.describe(store, home, args.id), indent=2, default=str))
        return EXIT_OK
    if action == "rollback":
        from keel.experiments.lake import wide_rows
        from keel.exposures import read_exposure_frame
        from keel.ledger import Ledger
        from keel.registry import ModelRegistry

        meta = control.experiments(store).get(args.id) or {}
        log = read_exposure_frame(home_layout().exposure_dirs(), since=meta.get("started_at"))
        rows = wide_rows(log, control.stored_spec(home, args.id), meta)
        days = sorted(set(rows["day"].to_list()))
        with (
            Ledger(home_layout().ledger) as ledger,
            ModelRegistry(args.registry or home_layout().registry) as registry,
        ):
            c, entry = control.rollback(
                store, home, args.id, author=author_of(args), reason=args.reason, ledger=ledger, registry=registry,
                exposure_days=days,
            )  # fmt: skip
        print(f"rolled back: policy version {c.version}; ledger entry {entry.seq} ({entry.release_id})")
        return EXIT_OK
    move = {"stop": control.stop, "pause": control.pause, "resume": control.resume}[action]
    c = move(store, home, args.id, author=author_of(args), reason=args.reason)
    print(f"{action}: policy version {c.version}")
    return EXIT_OK


def _print_recorded_prediction(home: Path, commit) -> None:
    from keel.experiments.impact import prediction_path

    exp_id = next(iter(commit.changes.values()))["body"]["experiment"]["id"]
    path = prediction_path(home, exp_id)
    if path.exists():
        p = json.loads(path.read_text())
        lo, hi = p["interval_80"]
        print(f"predicted lift of {p['metric']}: {p['predicted_lift']:+.1%} (80 % interval {lo:+.1%} … {hi:+.1%}), "
              f"recorded in {path}")  # fmt: skip
    else:
        print("no lift predicted (the spec has no impact block, or no impact predictor is trained yet)")


def _experiment_predict(args: argparse.Namespace) -> int:
    from keel.experiments.impact import ImpactPredictor, predict_experiment, predictor_path
    from keel.experiments.spec import load_spec

    spec = load_spec(args.spec)
    predictor = ImpactPredictor.load(args.predictor or predictor_path(home_root(), spec.model))
    print(json.dumps(predict_experiment(predictor, spec), indent=2))
    return EXIT_OK


def _experiment_causal(args: argparse.Namespace) -> int:
    from keel.experiments.causal import load_causal_spec, run_causal
    from keel.storage import write_json_atomic

    spec = load_causal_spec(args.spec)
    if args.data:
        from keel.contracts.io import read_typed_data_file

        data, where = read_typed_data_file(args.data), str(args.data)
    else:
        from keel.cli.common import usecase_of

        uc = usecase_of(args)
        if uc.causal_data is None:
            raise DataReadError(f"the {uc.name} use case ships no causal data: pass --data")
        data, where = uc.causal_data(), f"the {uc.name} use case's causal data ({uc.title})"
    report = run_causal(spec, data, where=where)
    write_json_atomic(report, args.out)
    print(
        f"{spec.id}: effect of {spec.treatment} on {spec.outcome}, adjusting for {', '.join(report['backdoor_set'])}"
    )
    for e in report["estimates"]:
        print(f"  {e['method']}: {e['value']:.4g} [{e['ci'][0]:.4g}, {e['ci'][1]:.4g}]")
    for r in report["refutations"]:
        print(f"  {r['method']}: {'passed' if r['passed'] else 'FAILED'} ({r['rule']})")
    print(f"wrote {args.out}")
    return EXIT_OK if report["refutations_passed"] else EXIT_PROBLEM


def _experiment_analyze(args: argparse.Namespace) -> int:
    from keel.experiments.analysis import analyze, scan_data
    from keel.experiments.spec import load_spec
    from keel.storage import write_json_atomic

    spec = load_spec(args.spec)
    report = analyze(scan_data(args.data), spec, where=str(args.data), min_support=args.min_support)
    write_json_atomic(report, args.out)
    n = report["arms"]
    print(f"experiment {spec.id}: {n[spec.control_label]:,} control / {n[spec.treatment_label]:,} treatment units")
    for why in report["withheld_because"]:
        print(f"  conclusions withheld: {why}")
    for m in report["metrics"]:
        if "error" in m:
            print(f"  {m['name']}: {m['error']}")
            continue
        print(
            f"  {m['name']}: {m['control']:.4g} → {m['treatment']:.4g}, lift {m['lift']:+.2%} "
            f"[{m['lift_ci'][0]:+.2%}, {m['lift_ci'][1]:+.2%}], p_adj {m['p_adjusted']:.3g} ({m['method']}): "
            f"{m['verdict']}"
        )
    for g in report["guardrails"]:
        print(f"  guardrail {'BREACHED' if g['breached'] else 'ok'} ({g['action']}): {g['reason']}")
    for d in report["drilldown"].values():
        print(f"  drill-down: {d['explanation']}")
    print(f"wrote {args.out}")
    problem = report["srm"]["flagged"] or report["guardrail_breached"]
    return EXIT_PROBLEM if problem else EXIT_OK
