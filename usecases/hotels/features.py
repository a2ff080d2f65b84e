"""The room-rate features, declared once; keel computes them offline (the training table) and online (the
gateway's lookups) from this declaration (keel/features/spec.py says what each part means).

A row is a booking, scored **as of the day it was made** (``quoted_on``): that is when the rate is quoted.

- **stay** (request): lead time, nights (and weekend nights), party, arrival month, the guest's history with the
  hotel, parking and special requests, and the hotel's calendar facts for the arrival date (its historical average
  daily rate, the holiday flags) — all in the quote request;
- **price histories**: the smoothed mean nightly price by room type, by market segment, by country, by meal
  package, and by room type × arrival month, over bookings whose stay was over before the quote — a stay's price
  is known at check-out, so a booking counts from 14 days after its arrival on (the longest quoted stay), the day
  its arrival day's bookings land (``History.known_on``).
"""

from __future__ import annotations

import polars as pl

from keel.entity_key import EntityKey
from keel.features.spec import Entity, Feature, FeatureSet, History, Label, LabelDomain, RequestFeatures

MAX_NIGHTS = 14  # the longest stay the model quotes (the contracts hold it)
PRIOR_PRICE = 105.0  # smoothing prior: the table's mean nightly price, EUR
PRIOR_WEIGHT = 20.0  # pseudo-bookings of the prior: a group with few bookings stays near it

BOOKING = Entity(
    name="booking",
    source="validated_bookings",
    id_column="booking_id",
    id_parts=("booking_ref",),  # unique per the bookings contract
    date="quoted_on",
    request_columns=(
        "quoted_on",
        "month",
        "lead_time",
        "stays_in_weekend_nights",
        "stays_in_week_nights",
        "adults",
        "children",
        "babies",
        "is_repeated_guest",
        "previous_cancellations",
        "required_car_parking_spaces",
        "total_of_special_requests",
        "historical_adr",
        "near_christmas",
        "near_new_years",
        "reserved_room_type",
        "market_segment",
        "country",
        "meal",
    ),
    carried=("quoted_on", "arrival_date", "reserved_room_type", "market_segment", "country", "meal"),
    key=EntityKey(("booking_ref",), time="arrival_date"),  # e.g. 8123-2017-03-14T00:00:00Z
    partition_date="arrival_date",  # partitioned, trained and gated by arrival month; scored as of the quote
)


def stay(col, ops):
    """Features of the stay being quoted, from the request alone."""
    weekend, week = col("stays_in_weekend_nights"), col("stays_in_week_nights")
    return {
        "lead_time": ops.as_int(col("lead_time")),
        "nights": ops.as_int(weekend + week),
        "weekend_nights": ops.as_int(weekend),
        "adults": ops.as_int(col("adults")),
        "kids": ops.as_int(col("children") + col("babies")),
        "arrival_month": ops.as_int(col("month")),
        "historical_adr": ops.as_float(col("historical_adr")),
        "near_holiday": ops.as_int(col("near_christmas") + col("near_new_years") >= 1),
        "repeated_guest": ops.as_int(col("is_repeated_guest")),
        "previous_cancellations": ops.as_int(col("previous_cancellations")),
        "parking_spaces": ops.as_int(col("required_car_parking_spaces")),
        "special_requests": ops.as_int(col("total_of_special_requests")),
    }


PRICE = pl.col("avg_price_per_room")
KNOWN_ON = pl.col("arrival_date").dt.date() + pl.duration(days=MAX_NIGHTS)  # every quoted stay is over by then


def price_history(feature: str, *keys: str) -> History:
    return History(feature, keys, PRICE, PRIOR_PRICE, PRIOR_WEIGHT, known_on=KNOWN_ON)


RATE_FEATURES = FeatureSet(
    entity=BOOKING,
    features=(
        Feature("lead_time", "int", 0, 1000, 45, "days between booking and arrival"),
        Feature("nights", "int", 1, MAX_NIGHTS, 3, "nights of the stay"),
        Feature("weekend_nights", "int", 0, MAX_NIGHTS, 1, "Saturday and Sunday nights"),
        Feature("adults", "int", 0, 10, 2, "adults in the room"),
        Feature("kids", "int", 0, 20, 0, "children and babies in the room"),
        Feature("arrival_month", "int", 1, 12, 6, "month of arrival"),
        Feature("historical_adr", "float", 0, 1000, 86, "the hotel's historical average daily rate for the arrival"),
        Feature("near_holiday", "int", 0, 1, 0, "1 when the arrival is near Christmas or New Year"),
        Feature("repeated_guest", "int", 0, 1, 0, "1 when the guest stayed before"),
        Feature("previous_cancellations", "int", 0, 100, 0, "the guest's earlier cancellations"),
        Feature("parking_spaces", "int", 0, 10, 0, "car parking spaces asked for"),
        Feature("special_requests", "int", 0, 10, 0, "special requests made"),
        Feature("room_type_price", "float", 0, 1000, PRIOR_PRICE, "room type's mean price, stays over"),
        Feature("segment_price", "float", 0, 1000, PRIOR_PRICE, "market segment's mean price, stays over"),
        Feature("country_price", "float", 0, 1000, PRIOR_PRICE, "guest country's mean price, stays over"),
        Feature("meal_price", "float", 0, 1000, PRIOR_PRICE, "meal package's mean price, stays over"),
        Feature(
            "room_month_price", "float", 0, 1000, PRIOR_PRICE, "room type × arrival month mean price, stays over"
        ),
    ),
    label=Label(
        "label_price",
        PRICE,
        task="regression",
        known_after=f"the stay is over (check-out, at most {MAX_NIGHTS} nights after arrival)",
        description="average nightly price paid, EUR",
        domain=LabelDomain(lower=0.0),  # a price is never negative (a complimentary stay is 0)
    ),
    request=(RequestFeatures("stay", stay),),
    histories=(
        price_history("room_type_price", "reserved_room_type"),
        price_history("segment_price", "market_segment"),
        price_history("country_price", "country"),
        price_history("meal_price", "meal"),
        price_history("room_month_price", "reserved_room_type", "month"),
    ),
)
