"""The columnar verdicts (keel/contracts/columnar.py) are the record path's: on real requests of both use cases and
on batches that break the contract in every way a client can — a rule, a type, a null, a missing or extra field, a
column of mixed JSON types — each record gets the sink, the failed rules and the typed values ``validate_record``
gives it."""

from __future__ import annotations

import pytest

from keel.contracts.columnar import _frame, check_records, validate_records
from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from keel.usecase import get


def contract_of(name: str) -> CompiledContract:
    uc = get(name)
    return CompiledContract(load_contract(uc.contract_path(uc.serving.request_contract)))


@pytest.fixture(scope="module")
def flights():
    from usecases.flights.replay import held_out_flights

    return contract_of("flights"), held_out_flights("2013-05", 300)


def same(contract: CompiledContract, records: list) -> list:
    got = validate_records(contract, records)
    want = [contract.validate_record(dict(r)) for r in records]
    assert got == want
    return got


def test_real_requests_of_both_use_cases_get_the_record_paths_verdicts(flights):
    contract, rows = flights
    assert _frame(rows) is not None  # the columnar path, not the fallback
    verdicts = same(contract, rows)
    assert {v.sink for v in verdicts} == {"valid"} and len(verdicts) == 300
    from usecases.hotels.replay import quotes

    hotels = quotes("2017-03", 300)
    assert _frame(hotels) is not None
    assert {v.sink for v in same(contract_of("hotels"), hotels)} == {"valid"}


BROKEN = {
    "a rule": {"origin": "BOS"},
    "two rules": {"origin": "BOS", "hour": 24},
    "a null in a required column": {"carrier": None},
    "a null where allowed": {"tailnum": None},
    "an unparseable time": {"time_hour": "yesterday"},
    "a float in an int column": {"hour": 5.5},
    "an int in a float column": {"distance": 1000},
    "text in an int column": {"flight": "12"},
    "a nested value": {"dest": {"code": "MIA"}},
    "a bool in an int column": {"month": True},
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_a_batch_with_a_broken_record_gives_every_record_its_own_verdict(flights, what):
    contract, rows = flights
    batch = [dict(r) for r in rows[:20]]
    batch[7] |= BROKEN[what]
    verdicts = same(contract, batch)
    assert all(v.sink == "valid" for i, v in enumerate(verdicts) if i != 7)  # the others are not held back


def test_missing_and_unexpected_fields_fall_back_to_the_record_path_with_the_same_verdicts(flights):
    contract, rows = flights
    batch = [dict(r) for r in rows[:10]]
    del batch[3]["distance"]
    batch[5]["gate"] = "B12"  # unexpected: dropped by this contract
    assert _frame(batch) is None
    verdicts = same(contract, batch)
    assert verdicts[3].sink == "rejected" and "schema_columns" in verdicts[3].failed_rules
    assert verdicts[5].sink == "valid" and "gate" not in verdicts[5].record


@pytest.mark.parametrize("fallback", [False, True], ids=["columnar", "record path"])
def test_a_checked_batch_keeps_valid_records_in_columns_and_an_object_only_for_the_others(flights, fallback):
    """What the gateway reads: the broken records by index, every other record's typed values in the columns —
    equal to what its verdict carries, on the columnar path and on the fallback alike."""
    contract, rows = flights
    batch = [dict(r) for r in rows[:30]]
    batch[4] |= {"origin": "BOS"}
    batch[11] |= {"hour": 24}
    if fallback:
        batch[20]["gate"] = "B12"  # an unexpected field: no columns can be formed
    checked = check_records(contract, batch)
    assert sorted(checked.verdicts) == [4, 11] and checked.n == 30
    assert all(checked.verdicts[i].sink != "valid" for i in (4, 11))
    want = [contract.validate_record(dict(r)) for r in batch]
    assert [checked.verdict(i) for i in range(30)] == want
    for c, values in checked.columns.items():
        assert [values[i] for i in range(30) if i not in (4, 11)] == [
            want[i].record[c] for i in range(30) if i not in (4, 11)
        ]
