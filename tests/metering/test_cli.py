"""``keel usage`` and ``keel cost`` on a KEEL_HOME with a gateway's logs and a price table; bad input is exit 2."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from keel.cli import main
from keel.exposure_log import ExposureLog
from keel.metering.compute import ComputeSample
from keel.policies import PolicyStore

DAY = datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()
PRICES = {"currency": "USD", "per_1000_requests": 1.0, "per_cpu_second": 0.5, "per_gpu_second": 2.0}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        store.apply({"prices": ("cost", PRICES)}, author="finance", reason="prices")
    log = ExposureLog(tmp_path / "serving" / "exposures")
    for i in range(300):
        tenant = "ops" if i % 3 else "pricing"
        log.append({"ts": DAY + i, "tenant_id": tenant, "model_version": 1, "status": 200, "rows": 2,
                    "latency_ms": 3.0, "policy_version": 1})  # fmt: skip
    log.append({"ts": DAY + 86_400, "tenant_id": "ops", "model_version": 1, "status": 200, "policy_version": 1})
    log.close()
    compute = ExposureLog(tmp_path / "serving" / "compute", prefix="compute")
    compute.append(ComputeSample(DAY + 400, "flight-delay", 1, 6_000_000_000, 1, 300).as_record())
    compute.close()
    return tmp_path


def test_usage_by_tenant_as_json(home, capsys):
    assert main(["usage", "--from", "2013-06-01", "--by", "tenant_id", "--format", "json"]) == 0
    rows = {r["tenant_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ops"]["requests"] == 200 and rows["pricing"]["requests"] == 100
    assert rows["ops"]["rows_scored"] == 400 and rows["ops"]["compute_s"] == pytest.approx(4.0)


def test_cost_of_one_tenant_over_two_days_as_csv(home, capsys):
    assert main(["cost", "--from", "2013-06-01", "--to", "2013-06-02", "--tenant", "ops", "--by", "day",
                 "--format", "csv"]) == 0  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    by_day = {r["day"]: float(r["cost"]) for r in rows}
    assert by_day["2013-06-01"] == pytest.approx(200 / 1000 * 1.0 + 4.0 * 0.5)
    assert by_day["2013-06-02"] == pytest.approx(1 / 1000 * 1.0)  # no compute sampled that day


def test_the_table_ends_with_the_total(home, capsys):
    assert main(["cost", "--from", "2013-06-01"]) == 0
    out = capsys.readouterr().out
    assert "cost, 2013-06-01 … 2013-06-01" in out and "total 3.300000 USD" in out


def test_a_day_without_traffic_says_so(home, capsys):
    assert main(["usage", "--from", "2013-07-01"]) == 0
    assert "no usage between 2013-07-01 and 2013-07-01" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["usage", "--from", "June"], "--from must be a day as YYYY-MM-DD"),
        (["cost", "--from", "2013-06-02", "--to", "2013-06-01"], "--to 2013-06-01 is before --from 2013-06-02"),
        (["usage", "--from", "2013-06-01", "--by", "carrier"], "--by 'carrier' is not one of"),
    ],
)
def test_bad_input_is_exit_2_naming_the_flag(home, capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_out_writes_the_file(home, tmp_path, capsys):
    out = tmp_path / "report" / "june.json"
    out.parent.mkdir()
    assert main(["usage", "--from", "2013-06-01", "--format", "json", "--out", str(out)]) == 0
    assert sum(r["requests"] for r in json.loads(out.read_text())) == 300
