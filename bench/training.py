"""Training overhead: keel's delay_model asset vs a bare ``lightgbm.train`` on the same data, in one run.

Same data for all: real 2013 flight features (the contracts, then ``offline_features``), one Parquet file per month
where the pipeline's IO manager keeps them. Same params, seed and early stopping. Three ways to train, interleaved,
``--repeats`` times each, medians reported:

- bare: what a hand-written script does — read the months' Parquet files with polars, drop unlabelled rows, sort,
  ``lightgbm.train``, ``model_to_string``;
- keel asset: the delay_model asset's body invoked directly (the IO manager's load, ``train_model``, the sha256,
  registering the text model in a SQLite registry, data versions and metadata) — keel's own code;
- keel run: ``dagster.materialize`` of delay_model — the above plus Dagster's run machinery (run record, event log,
  step launch), which costs a fixed second or so whatever the model.

The bare and keel models must be byte-identical (same sha256): that is the check that they trained on the same data.

    .venv/bin/python bench/training.py                                  # the pipeline's window: 2013-01…03 (+04)
    .venv/bin/python bench/training.py --train-months 2013-01..2013-09 --valid-month 2013-10 --rounds 400
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")  # Dagster's beta/preview warnings; not what this measures

import dagster as dg  # noqa: E402
import lightgbm as lgb  # noqa: E402
import polars as pl  # noqa: E402

import assets.models as models  # noqa: E402
from assets.usecase import wiring  # noqa: E402
from keel.training.model import TrainingConfig  # noqa: E402
from resources import LedgerResource, ModelRegistryResource, ParquetIOManager  # noqa: E402
from usecases.flights import usecase as FLIGHTS  # noqa: E402
from usecases.flights.data import MONTHS, read_raw, read_raw_month  # noqa: E402
from usecases.flights.features import (  # noqa: E402
    FEATURE_NAMES,  # noqa: E402
    LABEL,
    offline_features,
)

FLIGHT_FEATURES = wiring(FLIGHTS).key(FLIGHTS.feature_table)  # flights/flight_features

REPO = Path(__file__).resolve().parent.parent


def month_range(text: str) -> tuple[str, ...]:
    first, _, last = text.partition("..")
    last = last or first
    if first not in MONTHS or last not in MONTHS:
        raise SystemExit(f"--train-months: months are 2013-01…2013-12, got {text!r}")
    return tuple(MONTHS[MONTHS.index(first) : MONTHS.index(last) + 1])


def build_features(months: list[str], io: ParquetIOManager) -> int:
    """Validate and featurize the real months; store each as the IO manager would. Returns the row count."""
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    validated = {}
    for table in ("flights", "weather"):
        compiled = FLIGHTS.compiled_contract(table)
        upto = MONTHS[: MONTHS.index(max(months)) + 1]  # delay rates need every earlier month
        validated[table] = pl.concat(
            [compiled.validate(read_raw_month(table, m), references=refs).valid for m in upto]
        )
    rows = 0
    for month in months:
        year, mon = (int(x) for x in month.split("-"))
        flights = validated["flights"].filter((pl.col("year") == year) & (pl.col("month") == mon))
        feats = offline_features(flights, validated["weather"], read_raw("planes"), validated["flights"])
        path = io.path_for(FLIGHT_FEATURES, month)
        path.parent.mkdir(parents=True, exist_ok=True)
        feats.write_parquet(path)
        rows += feats.height
    return rows


def bare(paths: list[Path], config: TrainingConfig) -> str:
    """A hand-written training script on the same files."""
    frames = {p.stem: pl.read_parquet(p) for p in paths}

    def xy(frame: pl.DataFrame):
        labelled = frame.filter(pl.col(LABEL).is_not_null()).sort("flight_id")
        return labelled.select(pl.col(list(FEATURE_NAMES)).cast(pl.Float64)).to_numpy(), labelled[LABEL].to_numpy()

    xt, yt = xy(pl.concat([frames[m] for m in config.train_months]))
    xv, yv = xy(frames[config.valid_month])
    dtrain = lgb.Dataset(xt, yt.astype(float), feature_name=list(FEATURE_NAMES), params={"verbose": -1})
    booster = lgb.train(
        config.params,
        dtrain,
        num_boost_round=config.num_boost_round,
        valid_sets=[lgb.Dataset(xv, yv.astype(float), reference=dtrain)],
        callbacks=[lgb.early_stopping(config.early_stopping_rounds, verbose=False)],
    )
    return booster.model_to_string(num_iteration=booster.best_iteration)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-months", default="2013-01..2013-03", help="FIRST..LAST (default 2013-01..2013-03)")
    parser.add_argument("--valid-month", default="2013-04")
    parser.add_argument("--rounds", type=int, default=TrainingConfig().num_boost_round, help="num_boost_round")
    parser.add_argument(
        "--early-stopping", type=int, default=TrainingConfig().early_stopping_rounds, help="early_stopping_rounds"
    )
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    config = TrainingConfig(
        train_months=month_range(args.train_months),
        valid_month=args.valid_month,
        num_boost_round=args.rounds,
        early_stopping_rounds=args.early_stopping,
    )
    months = [*config.train_months, config.valid_month]

    with tempfile.TemporaryDirectory(prefix="keel-bench-training-") as tmp:
        io = ParquetIOManager(base_dir=str(Path(tmp) / "storage"))
        t0 = time.perf_counter()
        rows = build_features(months, io)
        print(f"features for {months[0]}…{months[-1]}: {rows:,} rows ({time.perf_counter() - t0:.0f} s to build)")
        paths = [io.path_for(FLIGHT_FEATURES, m) for m in months]

        @dg.asset(key=FLIGHT_FEATURES, partitions_def=wiring(FLIGHTS).monthly)
        def flight_features() -> pl.DataFrame:  # stored above; never executed here
            raise RuntimeError("the benchmark reads the stored partitions")

        [delay_model, *_] = models.build_model_assets(FLIGHTS, config=config)
        resources = {
            "io_manager": io,
            "registry": ModelRegistryResource(root=str(Path(tmp) / "registry")),
            "ledger": LedgerResource(path=str(Path(tmp) / "ledger.sqlite")),
        }
        instance = dg.DagsterInstance.ephemeral()

        def run_bare() -> str:
            return hashlib.sha256(bare(paths, config).encode()).hexdigest()

        def run_asset() -> str:
            frame = pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")  # the IO manager's load
            context = dg.build_asset_context(instance=instance, resources={"registry": resources["registry"]})
            out = delay_model(context, features=frame)
            return out.value["sha256"][0]

        def run_dagster() -> str:
            result = dg.materialize(
                [flight_features, delay_model],
                selection=[delay_model],
                resources=resources,
                instance=instance,
                run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
            )
            [mat] = result.asset_materializations_for_node(delay_model.op.name)
            return mat.metadata["sha256"].value

        ways = {"bare lightgbm.train": run_bare, "keel asset": run_asset, "keel dagster run": run_dagster}
        times: dict[str, list[float]] = {name: [] for name in ways}
        shas: dict[str, set[str]] = {name: set() for name in ways}
        for fn in ways.values():
            fn()  # warm-up: imports, first Dagster run
        for i in range(args.repeats):
            for name, fn in ways.items():
                t0 = time.perf_counter()
                shas[name].add(fn())
                times[name].append(time.perf_counter() - t0)
            print(f"  repeat {i + 1}/{args.repeats}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in ways))

    all_shas = set().union(*shas.values())
    print(f"\nmodel sha256: {'identical across all ways and repeats' if len(all_shas) == 1 else 'DIFFERENT'}")
    if len(all_shas) != 1:
        raise SystemExit(f"the ways trained different models: {shas}")
    base = statistics.median(times["bare lightgbm.train"])
    print(f"{'way':<22} {'median s':>9} {'ratio':>7} {'overhead s':>11}")
    for name in ways:
        med = statistics.median(times[name])
        print(f"{name:<22} {med:>9.3f} {med / base:>6.3f}x {med - base:>+11.3f}")


if __name__ == "__main__":
    main()
