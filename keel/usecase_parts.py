"""Parts of a use case's declaration (keel/usecase.py) that stand on their own: what its drift reports watch, its
experiments and causal questions, its streaming contract, how its loop fits its scale — and the error every declaration raises. Imported through
keel.usecase, where the whole declaration is documented."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import polars as pl

from keel.errors import KeelError

USECASE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")  # an asset-key prefix and a path part


class UseCaseError(KeelError):
    """A use case declaration is invalid, or none of that name is installed."""


class UseCaseWarning(UserWarning):
    """A use case declaration that loads but will not do what its author most likely means (said at load, with
    the fix)."""


@dataclass(frozen=True, eq=False)
class CausalQuestion:
    """An observational question the use case answers on its whole period with DoWhy: the asset
    ``<use case>/<name>`` reads its validated ``tables`` (every month), ``frame(*tables)`` turns them into the rows
    the causal ``spec`` (YAML, keel/experiments/causal.py) names."""

    name: str
    spec: Path
    tables: tuple[str, ...]
    frame: Callable[..., pl.DataFrame]
    description: str = ""

    def __post_init__(self) -> None:
        if not USECASE_NAME.fullmatch(self.name):
            raise UseCaseError(f"causal question {self.name!r}: a name is a-z 0-9 _, starting with a letter")
        if not Path(self.spec).is_file():
            raise UseCaseError(f"causal question {self.name}: spec {self.spec} does not exist")
        if not self.tables:
            raise UseCaseError(f"causal question {self.name}: name the validated tables it reads")


@dataclass(frozen=True, eq=False)
class Experiments:
    """What the use case's experiments learn from besides live traffic: ``units(rows)`` turns its validated
    ``units_table`` into past experiment units (id, segments, the real outcome; keel/experiments/impact.py) for the
    impact predictor — None: no predictor; ``causal``: its observational questions."""

    units: Callable[[pl.DataFrame], pl.DataFrame] | None = None
    units_table: str | None = None
    causal: tuple[CausalQuestion, ...] = ()

    def __post_init__(self) -> None:
        if (self.units is None) != (self.units_table is None):
            raise UseCaseError("experiments: units and units_table go together (the function and the table it reads)")
        names = [q.name for q in self.causal]
        if len(set(names)) != len(names):
            raise UseCaseError(f"experiments: two causal questions share a name ({names})")


@dataclass(frozen=True)
class Streaming:
    """A contract the use case also runs as a Flink streaming job beside its batch path (keel/streaming): the
    validated monthly source ``table`` read as a stream in ``event_time`` order, without the contract's ``skip``
    rules (partition-wide rules have no streaming form), and windowed drift (``window_s``) of ``drift_features``
    against the batch path's month."""

    table: str
    event_time: str
    skip: tuple[str, ...] = ()
    drift_features: tuple[str, ...] = ()
    window_s: int = 86400

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise UseCaseError(f"streaming {self.table}: window_s must be positive, got {self.window_s}")


@dataclass(frozen=True)
class Monitoring:
    """What its drift reports watch. Every feature and the label are compared as numbers, except ``unmonitored``
    ones (a calendar month differs in every window by construction); ``categorical`` feature-table columns are
    compared as categories. ``thresholds`` override the default per feature (docs/drift.md). The reference is what
    the serving model was trained on: ``reference_months`` for the first model (default: its training and
    validation months), a promoted model's own training months after that."""

    reference_months: tuple[str, ...] = ()
    unmonitored: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    thresholds: dict[str, float] = field(default_factory=dict)


def warn_flags_as_numbers(usecase: str, features, numeric) -> None:
    """Say at load (a ``UseCaseWarning``) which 0/1 flags (``int`` features on [0, 1]) drift reports would compare as
    numbers (``numeric``), with the fix."""
    for f in features:
        if f.dtype == "int" and (f.lo, f.hi) == (0, 1) and f.name in numeric:
            warnings.warn(
                f"use case {usecase}: feature {f.name} is a 0/1 flag monitored as a number — its drift is the change "
                "in its share of 1s over the reference's spread, large for a rare flag in any month that has more or "
                "fewer of them; declare it in monitoring.categorical (the shares of 0 and 1 compared) or, when its "
                "share moves by construction (a holiday, a season), monitoring.unmonitored",
                UseCaseWarning,
                stacklevel=5,
            )


# The names of the candidate recipes a drift decision can train (keel/loop/candidates.py builds them): the words a
# declaration's ``Loop.candidates`` is checked against here, without the statistics (scipy) the recipes import — the
# Flink environment imports use cases and has none.
RECIPES = ("rolling", "expanding", "recency", "committee", "recalibrated", "robust")
# what a use case trains unless it lists its own: every recipe a label of either task can have (``robust`` fits the
# median: a regression's only)
DEFAULT_RECIPES = ("rolling", "expanding", "recency", "committee", "recalibrated")


@dataclass(frozen=True)
class Loop:
    """How the self-retraining loop (keel/loop, docs/live.md) fits the use case's volume and label delay — the same
    rules for every use case, at its scale:

    - ``gate_from_day``: the newest labelled month's days before it early-stop a challenger, the days from it judge
      it (flights: 22, ~8,000 flights judged; a hotel with ~40 arrivals a day needs half the month);
    - ``gate_min_rows``: fewer labelled rows than this in the gate's days fail the gate closed;
    - ``label_delay``: how long after a request its label may still be on its way — the loop's canary gives realized
      labels this much time beyond its progress deadline (flights: none, its labels land the next day; a rate
      quote's price only once its stay is over and landed, weeks on);
    - ``candidates``: the recipes a drift decision trains (``RECIPES`` below; keel/loop/candidates.py builds them): all of them by
      default; a use case leaves out those that cannot serve it — hotels, whose quotes are for stays up to a year
      ahead, leaves out the windows of recent months only (a rolling window of three winter months prices next
      summer from winter) and the recalibration (one month's bias applied to quotes of every season), and adds
      ``robust`` (a regression's only: the expanding window fitted to the median, LightGBM's L1 loss — a few very
      dear stays pull every answer of a squared-error fit towards them);
    - ``early_stopping_rounds``: a candidate fits up to 200 trees and keeps the best number on the newest labelled
      month's days before ``gate_from_day``, stopping once this many rounds brought no improvement. Flights judges
      on ~10,000 flights: 20 rounds. On a small hotel's ~400 bookings the validation loss is noisy and 20 rounds
      stop at a local minimum (May 2017's expanding refit: 3 trees; January's 26 where the best of 200 is 123):
      hotels looks at all 200;
    - ``committee_previous``: the committee averages the first model, this decision's expanding refit and — when
      True — the previous decision's, which may be months old (hotels: False; the first model keeps last summer's
      prices, the newest refit the rest — scripts/hotel_policies.py);
    - ``shadow``: the loop's canary begins in shadow — the challenger scores the champion's requests, unserved, until
      their realized labels say it is surely better (flights: labels the next day, one to three weeks). False for a
      use case whose labels take longer than a decision may wait (hotels: a quote's price lands weeks to months
      later — a shadow would wait weeks for them): the canary starts at its first served step, its quality the
      gate's (realized labels of the newest month, never trained on) and the paired guard's on the steps' requests as
      their labels land; a decision then comes days after the gate month's labels, not months."""

    gate_from_day: int = 22
    gate_min_rows: int = 1000
    label_delay: timedelta = timedelta(0)
    candidates: tuple[str, ...] = DEFAULT_RECIPES
    early_stopping_rounds: int = 20
    committee_previous: bool = True
    shadow: bool = True

    def __post_init__(self) -> None:
        if not 2 <= self.gate_from_day <= 28:
            raise UseCaseError(f"loop: gate_from_day must be 2…28 (days of a month), got {self.gate_from_day}")
        if self.gate_min_rows < 30:
            raise UseCaseError(f"loop: gate_min_rows below 30 judges on noise, got {self.gate_min_rows}")
        if self.label_delay < timedelta(0):
            raise UseCaseError(f"loop: label_delay must not be negative, got {self.label_delay}")
        unknown = sorted(set(self.candidates) - set(RECIPES))
        if unknown or not self.candidates:
            raise UseCaseError(f"loop: candidates {unknown or '()'} — each must be one of {', '.join(RECIPES)}")
        if not 1 <= self.early_stopping_rounds <= 200:
            raise UseCaseError(
                f"loop: early_stopping_rounds must be 1…200 (a candidate fits at most 200 trees), "
                f"got {self.early_stopping_rounds}"
            )
        if "committee" in self.candidates and "expanding" not in self.candidates:
            raise UseCaseError("loop: the committee averages the expanding refits — list 'expanding' with it")


@dataclass(frozen=True)
class Coarse:
    """The coarse model a use case serves when its main model cannot answer (its breakers open, its retries spent,
    the model runtime down): a small LightGBM on the same features — ``num_leaves`` leaves, at most ``rounds``
    trees — trained with every main model on the same months, registered as ``<model>-coarse``, and released with
    it only when it beats the constant a quote could know (the training window's label mean) on the main model's
    validation rows. The gateway scores it in its own process (no model runtime), so it answers while Triton does
    not; the answer says ``degraded: ["coarse_fallback"]``."""

    num_leaves: int = 7
    rounds: int = 40

    def __post_init__(self) -> None:
        if not 2 <= self.num_leaves <= 31:
            raise UseCaseError(f"coarse model: num_leaves must be 2…31 (small is the point), got {self.num_leaves}")
        if not 1 <= self.rounds <= 200:
            raise UseCaseError(f"coarse model: rounds must be 1…200, got {self.rounds}")


@dataclass(frozen=True, eq=False)
class Replay:
    """How a simulated day's live traffic is produced (gpu_runtime/replay.py sends it): ``requests(month)`` the
    month's request entities in the order they would be asked, ``day_of(entity)`` its local day ``YYYY-MM-DD``,
    ``unit_of(entity)`` the unit id it is sent with (sticky routing, experiments); ``rps`` the live replay's requests
    per second, to fit the use case's volume (None: ``DEFAULT_RPS``; ``scripts/materialize.py --rps`` overrides
    every use case's)."""

    requests: Callable[[str], list[dict]]
    day_of: Callable[[dict], str]
    unit_of: Callable[[dict], str]
    rps: float | None = None

    DEFAULT_RPS = 40.0

    def __post_init__(self) -> None:
        if self.rps is not None and not (isinstance(self.rps, int | float) and 0 < self.rps <= 10_000):
            raise UseCaseError(f"replay: rps must be a number of requests per second in (0, 10000], got {self.rps!r}")

    def rate(self, override: float | None = None) -> float:
        """The requests per second the live replay sends: ``override`` (the command line's) if given, else its own."""
        return override or self.rps or self.DEFAULT_RPS
