"""The process's adaptive limits (gpu_runtime/gateway/concurrency.py, overload.py), driven by hand with an injected
clock: what each does as latency grows, stays or recovers — no timing of this machine involved."""

from __future__ import annotations

import pytest

from gpu_runtime.gateway.concurrency import WINDOW_S, WINDOW_SAMPLES, GradientLimit, TopTierGuard
from gpu_runtime.gateway.overload import StandingQueue


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def windows(limit: GradientLimit, clock: Clock, rtt: float, in_flight: int, n: int) -> float:
    """``n`` full windows of answers of latency ``rtt`` with ``in_flight`` requests in flight."""
    for _ in range(n):
        clock.t += WINDOW_S
        for _ in range(WINDOW_SAMPLES):
            limit.update(rtt, in_flight)
    return limit.limit


def test_the_limit_shrinks_when_latency_grows_under_load_and_never_below_its_floor():
    clock = Clock()
    limit = GradientLimit(initial=32, min_limit=8, clock=clock)
    windows(limit, clock, 0.002, 30, 20)  # no-load latency at full use: the limit grows a little
    grown = limit.limit
    assert grown > 32
    assert windows(limit, clock, 0.020, int(grown), 5) < 0.8 * grown  # 10× the latency in use: it shrinks at once
    floor = GradientLimit(initial=12, min_limit=10, clock=clock)
    windows(floor, clock, 0.002, 2, 100)  # its no-load latency, learnt while app-limited (the limit unchanged)
    assert floor.limit == 12
    assert windows(floor, clock, 0.050, 64, 10) == 10  # however bad, never below the floor


def test_a_lasting_change_of_latency_becomes_the_new_normal():
    """Gradient2's long average follows a latency that lasts (a slower model, a bigger batch): the limit is not held
    down for ever by a no-load latency of the past."""
    clock = Clock()
    limit = GradientLimit(initial=32, min_limit=8, clock=clock)
    windows(limit, clock, 0.002, 30, 20)
    low = windows(limit, clock, 0.020, 64, 5)
    assert windows(limit, clock, 0.020, 256, 600) > low


def test_an_app_limited_service_does_not_grow_its_limit():
    clock = Clock()
    limit = GradientLimit(initial=32, clock=clock)
    assert windows(limit, clock, 0.002, 3, 50) == 32  # 3 in flight of 32: no evidence that more would be served


def test_the_limit_recovers_once_latency_is_back_to_normal():
    clock = Clock()
    limit = GradientLimit(initial=32, min_limit=8, clock=clock)
    windows(limit, clock, 0.002, 30, 20)
    low = windows(limit, clock, 0.030, 64, 5)
    assert windows(limit, clock, 0.002, 64, 20) > 1.5 * low


def guard_windows(guard: TopTierGuard, clock: Clock, rtt: float, n: int) -> float:
    for _ in range(n):  # each window closes on its count of answers
        for _ in range(TopTierGuard.WINDOW_SAMPLES):
            guard.update(rtt)
        clock.t += TopTierGuard.WINDOW_S / 10
    return guard.lower_share()


def test_the_lower_tiers_give_way_while_the_top_tiers_latency_grows_and_come_back_after():
    clock = Clock()
    guard = TopTierGuard(clock=clock)
    assert guard_windows(guard, clock, 0.002, 10) == 1.0  # the top tier at its no-load latency: no cut
    cut = guard_windows(guard, clock, 0.010, 5)  # 5× its no-load latency
    assert cut == pytest.approx(0.7**5)
    assert guard_windows(guard, clock, 0.010, 50) == guard.min_share  # never below the floor
    assert guard_windows(guard, clock, 0.002, 10) > guard.min_share  # latency back: the share grows again
    assert guard_windows(guard, clock, 0.002, 40) == 1.0


def test_a_top_tier_slowed_by_a_starved_machine_does_not_cut_the_lower_tiers():
    """Other processes have the CPU, the event loop is mostly idle: refusing L2 would not make L1 faster."""
    clock = Clock()
    guard = TopTierGuard(clock=clock)
    guard_windows(guard, clock, 0.002, 10)
    for _ in range(10):
        for _ in range(TopTierGuard.WINDOW_SAMPLES):
            guard.update(0.050, busy=0.2)
        clock.t += 0.01
    assert guard.lower_share() == 1.0


@pytest.mark.parametrize(("lower_per_top", "cut"), [(1, False), (3, False), (4, True), (50, True)])
def test_a_flood_of_the_lower_tiers_cuts_their_share_even_when_the_loop_is_starved_of_cpu(lower_per_top, cut):
    """The flood's senders and Triton share the cores, so the loop's thread is off the CPU much of the time (busy
    0.4): still, it is the lower tiers' traffic that slows the top tier — unlike ordinary traffic on a starved machine
    (the same latency and busy, lower tiers at the top tier's rate or a few times it: the share holds)."""
    clock = Clock()
    guard = TopTierGuard(clock=clock)
    guard_windows(guard, clock, 0.002, 10)
    for _ in range(5):
        for _ in range(TopTierGuard.WINDOW_SAMPLES):
            guard.arrive(0)
            for _ in range(lower_per_top):
                guard.arrive(1)
            guard.update(0.050, busy=0.4)
        clock.t += 0.01
    assert (guard.lower_share() < 0.2) is cut


def test_a_process_that_starts_under_a_flood_still_gives_way_and_an_idle_spread_of_latencies_cuts_nothing():
    """No quiet window ever: the window means are all flooded (5 ms), but some single answers still come back at the
    unloaded 1.6 ms — the guard's reference. The same spread without a flood or a busy loop cuts nothing."""

    def run(lower_per_top: int, busy: float) -> float:
        clock = Clock()
        guard = TopTierGuard(clock=clock)
        for _ in range(10):
            for k in range(TopTierGuard.WINDOW_SAMPLES):
                guard.arrive(0)
                for _ in range(lower_per_top):
                    guard.arrive(1)
                guard.update(0.0016 if k == 0 else 0.0050, busy=busy)
            clock.t += 0.01
        return guard.lower_share()

    assert run(lower_per_top=40, busy=0.4) == TopTierGuard().min_share  # flooded from the start: cut
    assert run(lower_per_top=1, busy=0.2) == 1.0  # ordinary traffic, a quiet loop: the spread alone cuts nothing


def test_without_top_tier_traffic_there_is_nothing_to_protect():
    clock = Clock()
    guard = TopTierGuard(clock=clock)
    guard_windows(guard, clock, 0.002, 10)
    guard_windows(guard, clock, 0.050, 10)
    assert guard.lower_share() < 0.1
    clock.t += TopTierGuard.IDLE_S + 1  # the top tier stopped sending: lower tiers get their whole share
    assert guard.lower_share() == 1.0


@pytest.mark.parametrize(
    ("least_lag", "seen", "rank", "shed"),
    [
        (0.005, {0: 0.0}, 1, True),  # a standing queue while L1 is served: L2 is shed at the door
        (0.005, {0: 0.0}, 0, False),  # …never L1 itself
        (0.005, {1: 0.0}, 1, False),  # L2 alone: nothing higher to protect
        (0.0002, {0: 0.0}, 1, False),  # the loop catches up within the interval: no standing queue
        (None, {0: 0.0}, 1, False),  # no sample yet
        (0.005, {0: -10.0}, 1, False),  # L1 last seen 10 s ago
    ],
)
def test_a_standing_queue_sheds_lower_tiers_only_while_a_higher_one_is_served(least_lag, seen, rank, shed):
    clock = Clock()
    queue = StandingQueue(lambda window: least_lag, lambda: 0.95, clock=clock)
    for r, ago in seen.items():
        clock.t += ago
        queue.observe(r)
        clock.t -= ago
    assert queue.shed(rank) is shed


def test_a_late_loop_that_is_not_busy_is_a_starved_one_not_a_queue():
    """The loop's timer is late because other processes have the CPU (its thread barely ran): no queue of the
    gateway's own work, nothing to shed."""
    queue = StandingQueue(lambda window: 0.005, lambda: 0.15, clock=Clock())
    queue.observe(0)
    assert not queue.standing and not queue.shed(1)


def test_a_cut_made_by_a_passing_burst_does_not_outlive_it_on_a_starved_machine():
    """The busy year: the top tier's traffic dipped, ordinary L2 traffic counted as a flood for a moment and cut the
    lower tiers to the floor; the machine stayed starved (L1 slow, the loop mostly idle), so the share held at 2 %
    and ordinary L2 requests were shed all year. Without a flood or a busy loop the share comes back."""
    clock = Clock()
    guard = TopTierGuard(clock=clock)
    guard_windows(guard, clock, 0.002, 10)
    for _ in range(TopTierGuard.WINDOW_SAMPLES):  # a burst: lower tiers at many times the top tier's rate
        guard.arrive(0)
        for _ in range(20):
            guard.arrive(1)
        guard.update(0.050, busy=0.2)
    assert guard.lower_share() == guard.min_share
    clock.t += 5 * TopTierGuard.RATE_TAU_S  # the burst is over: ordinary traffic, the machine still starved
    for _ in range(40):
        for _ in range(TopTierGuard.WINDOW_SAMPLES):
            guard.arrive(0)
            guard.arrive(1)
            guard.update(0.050, busy=0.2)
        clock.t += 0.01
    assert guard.lower_share() == 1.0
