from __future__ import annotations

import polars as pl
import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from keel.data.nycflights import read_raw, read_raw_month
from tests.conftest import CONTRACTS


@pytest.fixture(scope="session")
def validated():
    """Validated flights and weather for 2013-01 and 2013-02, as the pipeline produces them."""
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    out = {}
    for table in ("flights", "weather"):
        compiled = CompiledContract(load_contract(CONTRACTS / f"{table}.yaml"))
        out[table] = pl.concat(
            [compiled.validate(read_raw_month(table, m), references=refs).valid for m in ("2013-01", "2013-02")]
        )
    out["planes"] = read_raw("planes")
    return out
