"""Drift → a challenger, or not: one at a time, trained on the most recent labelled data.

Pure: ``plan_retrain(drifted_window, state, policy)`` looks only at its arguments. A drift report asks for a
challenger; the answer is a ``RetrainPlan`` or a ``NoRetrain`` with the reason — nothing new to learn from, a
challenger already in training or in a canary (coalesced: the drift is still there when it finishes, and the next
report asks again).

The plan uses the newest labelled month twice, split by day, so that the challenger is as fresh as the data allows
and is still judged on rows it never saw: it is fitted on the ``window_months`` months before the newest,
early-stopped on the newest month's days before ``gate_from_day``, and gated against the champion on the days from
``gate_from_day`` on (about ten days: ~8,000 flights of 2013). Measured on 2013 (docs/live.md): a model that has seen the
month before the one it serves is worth up to 0.04 AUC in summer; gating on a whole month instead would keep every
challenger a month staler than that.

Months are ``YYYY-MM`` keys. A month is *labelled* once every row of its outcomes table has landed and its label is
known (the caller decides that from the clock; keel.loop does not read clocks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetrainPolicy:
    window_months: int = 3  # fitted on these many labelled months before the newest
    gate_from_day: int = 22  # the newest month's days before it early-stop, the days from it judge
    min_new_months: int = 1  # labelled months beyond the champion's data window needed to train anew


@dataclass(frozen=True)
class LoopState:
    labelled: tuple[str, ...]  # months whose outcomes are all known, as of now
    champion_trained_on: tuple[str, ...]  # the serving model's data window (keel.loop.reference.trained_on)
    challenger_in_training: str | None = None  # run id (or plan id) of a challenger being trained or gated
    canary_running: str | None = None  # the canary in flight, if any


@dataclass(frozen=True)
class RetrainPlan:
    drifted_window: str
    train_months: tuple[str, ...]  # fitted on these
    gate_month: str  # the newest labelled month: early-stopped on its head, judged on its tail
    gate_from_day: int = RetrainPolicy.gate_from_day

    @property
    def data_months(self) -> tuple[str, ...]:
        """Every month the challenger learns from (its early-stopping month included)."""
        return (*self.train_months, self.gate_month)

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
            f"{len(labelled)} labelled months: need {policy.window_months} to fit on and 1 to early-stop and judge on",
        )
    gate_month = labelled[-1]
    train = tuple(labelled[-1 - policy.window_months : -1])
    trained = set(state.champion_trained_on)
    new = [m for m in labelled if m not in trained]
    if len(new) < policy.min_new_months:
        return NoRetrain(
            drifted_window,
            f"no labelled month beyond the champion's data window ({', '.join(sorted(trained))}) to learn from",
        )
    if {*train, gate_month} == trained:
        return NoRetrain(drifted_window, f"the champion learned from exactly {', '.join(sorted(trained))} already")
    return RetrainPlan(drifted_window, train, gate_month, policy.gate_from_day)
