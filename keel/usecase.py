"""A use case, declared: the one object an engineer writes to put a model on keel.

A use case lives in a package of its own (``usecases/<name>/``) whose ``usecase`` attribute is a ``UseCase``; keel
finds it through the ``keel.usecases`` entry-point group (pyproject.toml), so keel/ and gpu_runtime/ never import a
use case by name. Frozen dataclasses, not a pydantic model or a Dagster Component: the declaration is Python that
an engineer reads and edits beside the functions it names (feature functions, readers), its types are checked when
it is built (``__post_init__``), and it does not move with Dagster's component API. docs/usecases.md walks through
every field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import polars as pl

from keel.drills import Drills
from keel.features.spec import FeatureSet
from keel.intervals import DEFAULT_COVERAGE
from keel.usecase_parts import (  # noqa: F401 - parts of the declaration, imported from here by their users
    USECASE_NAME,
    CausalQuestion,
    Coarse,
    Experiments,
    Loop,
    Monitoring,
    Replay,
    Streaming,
    UseCaseError,
    UseCaseWarning,
    warn_flags_as_numbers,
)

ENTRY_POINTS = "keel.usecases"
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
METRICS = {"binary": ("auc", "log_loss"), "regression": ("rmse", "mae")}


@dataclass(frozen=True, eq=False)
class Source:
    """A raw table of the use case, every column as text with ``_source_row`` (the row in what was delivered).

    ``read()``: the whole table. ``partitioned``: split by the use case's monthly partitions on its local
    ``day_columns`` (year, month, day as text); False: a reference table, read whole. ``landing_after``: in a live
    replay, a local day of it lands at that day's midnight (UTC) plus this — after every outcome of the day is known
    when ``outcomes`` (the table whose complete months are labelled); None: it does not land day by day."""

    name: str
    read: Callable[[], pl.DataFrame]
    partitioned: bool = True
    day_columns: tuple[str, str, str] = ("year", "month", "day")
    landing_after: timedelta | None = None
    outcomes: bool = False
    description: str = ""  # what a row is, for the raw asset's description in the UI
    origin: str = ""  # where it comes from (a package, a URL), shown with each materialization

    def __post_init__(self) -> None:
        if not USECASE_NAME.fullmatch(self.name):
            raise UseCaseError(f"source {self.name!r}: a name is a-z 0-9 _, starting with a letter")
        if self.outcomes and self.landing_after is None:
            raise UseCaseError(f"source {self.name}: the outcomes table must land (give landing_after)")

    def day_rows(self, day: date) -> pl.Expr:
        """The rows of local ``day`` (the day columns are text)."""
        y, m, d = self.day_columns
        return (pl.col(y) == str(day.year)) & (pl.col(m) == str(day.month)) & (pl.col(d) == str(day.day))

    def read_month(self, month_key: str) -> pl.DataFrame:
        """The rows whose local year and month are the partition key ``YYYY-MM``."""
        year, month = (int(x) for x in month_key.split("-"))
        y, m, _ = self.day_columns
        return self.read().filter((pl.col(y) == str(year)) & (pl.col(m) == str(month)))


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """The model a use case trains and serves. ``name``: the served name (Triton's, the gateway route's,
    the registry's); ``asset``: the Dagster asset that trains it. The first model is trained on the feature months
    ``train_months``, early-stopped on ``valid_month`` and judged by the quality gate on it too; ``params`` are
    LightGBM parameters over keel's deterministic defaults (keel/training/model.py; a regression label names its
    objective here, e.g. ``{"objective": "regression"}``); ``coarse`` the small model the gateway answers from when
    this one cannot (keel/usecase_parts.py ``Coarse``); ``interval_coverage`` the coverage of a regression answer's
    prediction interval (keel/intervals.py)."""

    name: str
    asset: str = "model"
    train_months: tuple[str, ...] = ()
    valid_month: str | None = None
    params: dict = field(default_factory=dict)
    coarse: Coarse | None = None  # the coarse fallback, trained and released with the model (None: none)
    # A regression answer's prediction interval covers this share of rows (keel/intervals.py); unused for binary.
    interval_coverage: float = DEFAULT_COVERAGE

    def __post_init__(self) -> None:
        if not MODEL_NAME.fullmatch(self.name):
            raise UseCaseError(f"model name {self.name!r}: 1…64 of a-z 0-9 _ -, starting with a letter or digit")
        if self.coarse is not None and not MODEL_NAME.fullmatch(f"{self.name}-coarse"):
            raise UseCaseError(f"model name {self.name!r}: its coarse model's name {self.name}-coarse is over 64")
        for month in (*self.train_months, *([self.valid_month] if self.valid_month else [])):
            if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
                raise UseCaseError(f"model {self.name}: {month!r} is not a month YYYY-MM")
        if not (isinstance(self.interval_coverage, int | float) and 0.5 <= self.interval_coverage < 1):
            raise UseCaseError(f"model {self.name}: interval_coverage {self.interval_coverage!r} must be in [0.5, 1)")
        if self.valid_month is not None and self.valid_month in self.train_months:
            raise UseCaseError(f"model {self.name}: the validation month {self.valid_month} is also a training month")


@dataclass(frozen=True)
class Serving:
    """How requests reach the model: ``request_contract`` is the contract (in the use case's contracts folder)
    each entity of a request is validated with; ``alias`` the single-entity field of the legacy route, if any;
    ``pool_budget_bytes`` the memory budget of its requests in flight; ``tier`` its service tier (L1 direct revenue …
    L3 best effort; targets in keel/policies/gateway.py). A gateway policy may override either."""

    request_contract: str
    alias: str | None = None
    pool_budget_bytes: int = 64 << 20
    tier: str = "L2"

    def __post_init__(self) -> None:
        if self.pool_budget_bytes <= 0:
            raise UseCaseError(f"serving: pool_budget_bytes must be positive, got {self.pool_budget_bytes}")
        if self.tier not in ("L1", "L2", "L3"):
            raise UseCaseError(f"serving: tier must be L1, L2 or L3, got {self.tier!r}")


@dataclass(frozen=True, eq=False)
class UseCase:
    name: str
    title: str
    contracts: Path
    features: FeatureSet
    model: ModelSpec
    serving: Serving
    sources: tuple[Source, ...] = ()
    period: tuple[date, date] | None = None  # the first and last local day of its data (monthly partitions)
    metrics: tuple[str, ...] = field(default=())
    segments: tuple[str, ...] = ()  # columns evaluations break results down by (feature-table columns)
    feature_table: str = "features"  # the asset (and storage folder) of its feature table
    causal_data: Callable[[], pl.DataFrame] | None = None  # the rows its shipped causal specs read, if any
    drills: Drills = field(default_factory=Drills)  # what its delivery drills break (keel/drills.py)
    replay: Replay | None = None  # its live traffic (None: no traffic is replayed)
    monitoring: Monitoring = field(default_factory=Monitoring)  # what its drift reports watch
    loop: Loop = field(default_factory=Loop)  # the retraining loop at its scale: gate days and rows, label delay
    experiments: Experiments = field(default_factory=Experiments)  # impact predictor, causal questions
    streaming: tuple[Streaming, ...] = ()  # contracts it also runs on Flink

    def __post_init__(self) -> None:
        if not USECASE_NAME.fullmatch(self.name):
            raise UseCaseError(f"use case name {self.name!r}: 1…31 of a-z 0-9 _, starting with a letter")
        if not self.contracts.is_dir():
            raise UseCaseError(f"use case {self.name}: contracts folder {self.contracts} does not exist")
        if not (self.contracts / f"{self.serving.request_contract}.yaml").is_file():
            raise UseCaseError(
                f"use case {self.name}: request contract {self.serving.request_contract}.yaml is not in {self.contracts}"
            )
        names = [src.name for src in self.sources]
        if len(set(names)) != len(names):
            raise UseCaseError(f"use case {self.name}: two sources share a name")
        if sum(src.outcomes for src in self.sources) > 1:
            raise UseCaseError(f"use case {self.name}: at most one source holds the outcomes")
        if self.period is not None and self.period[0] > self.period[1]:
            raise UseCaseError(f"use case {self.name}: period starts after it ends ({self.period})")
        unknown_segments = [c for c in self.segments if c not in self.features.table_columns]
        if unknown_segments:
            raise UseCaseError(f"use case {self.name}: segments {unknown_segments} are not feature-table columns")
        for month in (*self.model.train_months, *([self.model.valid_month] if self.model.valid_month else [])):
            if self.period is not None and month not in self.months:
                raise UseCaseError(f"use case {self.name}: model month {month} is outside its period")
        self._check_monitoring()
        partitioned = {src.name for src in self.sources if src.partitioned}
        read = [
            *(q_t for q in self.experiments.causal for q_t in q.tables),
            self.experiments.units_table,
            *(st.table for st in self.streaming),
        ]
        validated = {t for t in partitioned if self.contract_path(t).is_file()}
        unknown_tables = [t for t in read if t is not None and t not in validated]
        if unknown_tables:
            raise UseCaseError(
                f"use case {self.name}: experiments or streaming read {unknown_tables}, not among its validated monthly "
                f"sources ({', '.join(sorted(validated)) or 'none'}: a monthly source with a contract of its name)"
            )
        if "robust" in self.loop.candidates and self.features.label.task != "regression":
            raise UseCaseError(
                f"use case {self.name}: loop candidate 'robust' fits the median of a regression label; "
                f"{self.features.label.column} is {self.features.label.task}"
            )
        allowed = METRICS[self.features.label.task]
        if not self.metrics:
            object.__setattr__(self, "metrics", allowed)
        unknown = [m for m in self.metrics if m not in allowed]
        if unknown:
            raise UseCaseError(
                f"use case {self.name}: metrics {unknown} do not judge a {self.features.label.task} model "
                f"(one of {', '.join(allowed)})"
            )

    def _check_monitoring(self) -> None:
        mon = self.monitoring
        if not mon.reference_months:
            first = (*self.model.train_months, *([self.model.valid_month] if self.model.valid_month else []))
            object.__setattr__(self, "monitoring", replace(mon, reference_months=tuple(sorted(first))))
        bad = [m for m in self.monitoring.reference_months if self.period is not None and m not in self.months]
        if bad:
            raise UseCaseError(f"use case {self.name}: drift reference months {bad} are outside its period")
        for what, names, known in (
            ("unmonitored", mon.unmonitored, self.features.names),
            ("categorical", mon.categorical, self.features.table_columns),
            ("thresholds", tuple(mon.thresholds), (*self.features.names, self.features.label.column)),
        ):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise UseCaseError(f"use case {self.name}: monitoring.{what} names unknown columns {unknown}")
        warn_flags_as_numbers(self.name, self.features.features, self.monitored[0])

    @property
    def monitored(self) -> tuple[list[str], list[str]]:
        """(numeric, categorical) columns its drift reports compare: the features but the unmonitored, the label."""
        skip = (*self.monitoring.unmonitored, *self.monitoring.categorical)  # a categorical feature: as categories
        numeric = [f for f in self.features.names if f not in skip]
        return [*numeric, self.features.label.column], list(self.monitoring.categorical)

    @property
    def task(self) -> str:
        return self.features.label.task

    def contract_path(self, name: str) -> Path:
        """The YAML file of data contract ``name`` (a validated name: it becomes a path)."""
        from keel.names import validate_name

        return self.contracts / f"{validate_name(name, what='contract name')}.yaml"

    def compiled_contract(self, name: str):
        """Data contract ``name``, loaded and compiled (``keel.contracts.engine.CompiledContract``)."""
        from keel.contracts import engine, spec

        return engine.CompiledContract(spec.load_contract(self.contract_path(name)))

    def source(self, name: str) -> Source:
        for src in self.sources:
            if src.name == name:
                return src
        raise UseCaseError(
            f"use case {self.name} has no source {name!r} (its sources: {', '.join(self.source_names)})"
        )

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(src.name for src in self.sources)

    @property
    def landed(self) -> tuple[Source, ...]:
        """The sources that land day by day in a live replay, the outcomes table first."""
        landing = [src for src in self.sources if src.landing_after is not None]
        return tuple(sorted(landing, key=lambda s: not s.outcomes))

    @property
    def months(self) -> tuple[str, ...]:
        """The monthly partition keys ``YYYY-MM`` of its period."""
        if self.period is None:
            return ()
        first, last = self.period
        out, y, m = [], first.year, first.month
        while (y, m) <= (last.year, last.month):
            out.append(f"{y}-{m:02d}")
            y, m = (y + 1, 1) if m == 12 else (y, m + 1)
        return tuple(out)

    @property
    def training_asset(self) -> str:
        """``<use case>/<model asset>``: what a release's model part names (the ledger's line of this model)."""
        return f"{self.name}/{self.model.asset}"

    @property
    def history_months(self) -> tuple[str, ...]:
        """What a live replay lands at once, as history: the first model's months and any before them."""
        first_model = (*self.model.train_months, self.model.valid_month or "")
        return tuple(m for m in self.months if m <= max(first_model)) if any(first_model) else ()


# The first day of the platform's daily partitions when no use case declares a period (wall-clock production days).
WALL_CLOCK_START = date(2020, 1, 1)


def served_spans(ucs) -> dict[str, tuple[date, date]] | None:
    """The days on which ``ucs`` can log traffic, per use case: a live replay's span of it (keel/clock.py
    ``shared_spans``), from the day its history has landed (the months before are built at once, nothing is served
    in them) to the day its period's last day has landed, where the clock stops it — what is served after the replay
    is stamped with that instant. None when a use case declares no period (production: wall-clock days, open-ended).
    """
    ucs = list(ucs)
    if not ucs or any(uc.period is None for uc in ucs):
        return None

    def landed(uc: UseCase, day: date) -> date:  # as keel/data/landing.py LandingZone.landed_by, to the day
        lags = [src.landing_after for src in uc.landed if src.landing_after is not None]
        return (datetime.combine(day, time(0), UTC) + max(lags, default=timedelta(0))).date()

    out = {}
    for uc in ucs:
        if uc.history_months:
            year, month = (int(x) for x in uc.history_months[-1].split("-"))
            first = landed(uc, date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1))
        else:
            first = uc.period[0]
        out[uc.name] = (first, landed(uc, uc.period[1]))
    return out


def first_day(ucs) -> date:
    """Where the platform's daily partitions (metering, each use case's experiment lake) start: the earliest first
    day of ``ucs``' declared periods — a live replay's days are its use cases' days, whatever their calendar."""
    starts = [uc.period[0] for uc in ucs if uc.period is not None]
    return min(starts) if starts else WALL_CLOCK_START


@cache
def installed() -> dict[str, UseCase]:
    """Every use case the ``keel.usecases`` entry points name, loaded and validated, by name."""
    out: dict[str, UseCase] = {}
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            uc = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken package is named, not a traceback from importlib
            raise UseCaseError(f"use case entry point {ep.name} ({ep.value}) failed to load: {exc}") from exc
        if not isinstance(uc, UseCase):
            raise UseCaseError(f"use case entry point {ep.name} ({ep.value}) is a {type(uc).__name__}, not a UseCase")
        if uc.name != ep.name:
            raise UseCaseError(f"use case entry point {ep.name} names a use case called {uc.name}")
        out[uc.name] = uc
    return out


def limited_to(environ: Mapping[str, str] | None = None) -> list[str]:
    """The use cases ``$KEEL_USECASES`` limits the platform to (scripts/up's setting), in order; [] for all."""
    raw = (os.environ if environ is None else environ).get("KEEL_USECASES", "")
    return [n.strip() for n in raw.split(",") if n.strip()]


def plays(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the platform plays use case ``name``: its sensors and schedules tick (every installed one unless
    ``$KEEL_USECASES`` names some; the others' stay defined — visible in the UI — but stopped)."""
    listed = limited_to(environ)
    return not listed or name in listed


def from_module(module: str) -> UseCase:
    """The ``usecase`` of a package by its import path (``usecases.flights``): for processes that run without
    keel's installed metadata (the Flink environment imports keel from PYTHONPATH)."""
    import importlib

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        raise UseCaseError(f"{module!r} is not a module path")
    uc = getattr(importlib.import_module(module), "usecase", None)
    if not isinstance(uc, UseCase):
        raise UseCaseError(f"module {module} has no `usecase` declaration (a keel.usecase.UseCase)")
    return uc


def get(name: str) -> UseCase:
    """The installed use case ``name``; an unknown name lists the installed ones."""
    found = installed()
    if name not in found:
        raise UseCaseError(f"no use case {name!r} is installed; installed: {', '.join(sorted(found)) or 'none'}")
    return found[name]


def by_model(model: str) -> UseCase:
    """The installed use case that serves ``model``."""
    for uc in installed().values():
        if uc.model.name == model:
            return uc
    served = sorted(uc.model.name for uc in installed().values())
    raise UseCaseError(f"no installed use case serves model {model!r}; served: {', '.join(served) or 'none'}")


def only() -> UseCase:
    """The one installed use case, for commands that take none; with several installed, the caller must name one."""
    found = installed()
    if len(found) != 1:
        raise UseCaseError(f"{len(found)} use cases are installed ({', '.join(sorted(found))}): name one")
    return next(iter(found.values()))


def resolve(ref: str) -> UseCase:
    """A use case by its installed name (``flights``) or by the module that declares it (``tests.usecases.rooms``:
    a declaration that is not installed, for a runtime started with ``--usecase <module>``)."""
    if USECASE_NAME.fullmatch(ref):
        return get(ref)
    return from_module(ref)
