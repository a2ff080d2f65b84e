"""Drift → a challenger, or not: one at a time, trained on a rolling window of the most recent labelled months.

Pure: ``plan_retrain(drifted_window, state, policy)`` looks only at its arguments. A drift report asks for a
challenger; the answer is a ``RetrainPlan`` (train on these months, judge on that one) or a ``NoRetrain`` with the
reason — nothing new to learn from, a challenger already in training or in a canary (coalesced: the drift is still
there when it finishes, and the next report asks again).

Months are ``YYYY-MM`` keys. A month is *labelled* once every flight in it has landed and its arrival delay is
known (the caller decides that from the clock; keel.loop does not read clocks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetrainPolicy:
    # The data window: the most recent labelled months before the gate's month — fitted on all but the last (three
    # months), early-stopped on the last. Measured on 2013 (docs/live.md): two months fitted lose to the first model
    # in June; three win.
    window_months: int = 4
    min_new_months: int = 1  # labelled months beyond the champion's training window needed to train anew


@dataclass(frozen=True)
class LoopState:
    labelled: tuple[str, ...]  # months whose outcomes are all known, as of now
    champion_trained_on: tuple[str, ...]  # the serving model's data window (keel.loop.reference.trained_on)
    challenger_in_training: str | None = None  # run id (or plan id) of a challenger being trained or gated
    canary_running: str | None = None  # the canary in flight, if any


@dataclass(frozen=True)
class RetrainPlan:
    drifted_window: str
    train_months: tuple[str, ...]  # the data window: fitted on all but its last month, early-stopped on that one
    gate_month: str  # the newest labelled month, not trained on: where challenger and champion are compared

    @property
    def fit_months(self) -> tuple[str, ...]:
        return self.train_months[:-1]

    @property
    def valid_month(self) -> str:
        return self.train_months[-1]

    @property
    def key(self) -> str:
        """Identifies the plan: the same drift over the same data asks for the same challenger only once."""
        return f"{self.train_months[0]}..{self.train_months[-1]}|{self.gate_month}"


@dataclass(frozen=True)
class NoRetrain:
    drifted_window: str
    reason: str


DEFAULT_RETRAIN = RetrainPolicy()


def plan_retrain(
    drifted_window: str, state: LoopState, policy: RetrainPolicy = DEFAULT_RETRAIN
) -> RetrainPlan | NoRetrain:
    if state.canary_running:
        return NoRetrain(drifted_window, f"a canary is running ({state.canary_running}): one challenger at a time")
    if state.challenger_in_training:
        return NoRetrain(
            drifted_window, f"a challenger is already in training ({state.challenger_in_training}): coalesced"
        )
    labelled = sorted(set(state.labelled))
    if len(labelled) < policy.window_months + 1:
        return NoRetrain(
            drifted_window,
            f"{len(labelled)} labelled months: need {policy.window_months} to train and 1 to judge on",
        )
    gate_month = labelled[-1]
    train = tuple(labelled[-1 - policy.window_months : -1])
    trained = set(state.champion_trained_on)
    new = [m for m in labelled if m not in trained and m not in (gate_month,)]
    if len(new) < policy.min_new_months:
        return NoRetrain(
            drifted_window,
            f"no labelled month beyond the champion's training window ({', '.join(sorted(trained))}) to learn from",
        )
    if set(train) == trained:
        return NoRetrain(drifted_window, f"the champion was trained on exactly {', '.join(train)} already")
    return RetrainPlan(drifted_window, train, gate_month)
