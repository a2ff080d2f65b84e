"""The installed ``keel`` entry point, run as a user would: exit codes 0 / 1 / 2 and the files it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests import CONTRACTS

KEEL = str(Path(sys.executable).with_name("keel"))

CONTRACT = """\
contract: demo
version: 1
critical_budget: {max_fraction: 0.3}
schema:
  columns:
    id: {type: int64, nullable: false}
    speed: {type: float64}
    code: {type: string}
rules:
  - {id: speed_range, type: range, column: speed, min: 0, max: 250}
  - {id: code_format, type: regex, column: code, pattern: '^[A-Z]{2}$', severity: warning, action: reject}
"""


def keel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def contract(tmp_path) -> Path:
    path = tmp_path / "demo.yaml"
    path.write_text(CONTRACT)
    return path


def test_entry_point_is_installed():
    result = keel("--version")
    assert result.returncode == 0 and result.stdout.startswith("keel ")


def test_validate_ok_writes_three_sinks_and_report(tmp_path, contract):
    data = tmp_path / "d.csv"
    data.write_text("id,speed,code\n1,10,UA\n2,1048.36,AA\n3,5,bad\n4,7,DL\n")
    out = tmp_path / "out"
    result = keel("contracts", "validate", "--contract", str(contract), "--data", str(data), "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert (report["rows_in"], report["valid"], report["quarantined"], report["rejected"]) == (4, 2, 1, 1)
    assert report["conserved"] and report["contract_hash"] and not report["budget_exceeded"]
    assert {r["id"]: r["failed"] for r in report["rules"]}["speed_range"] == 1
    assert pl.read_parquet(out / "valid.parquet")["id"].to_list() == [1, 4]
    assert pl.read_parquet(out / "quarantine.parquet")["speed"].to_list() == ["1048.36"]
    assert pl.read_parquet(out / "rejected.parquet")["_rule_id"].to_list() == ["code_format"]
    assert "1 quarantined, 1 rejected" in result.stdout


def test_validate_budget_exceeded_exits_1(tmp_path, contract):
    data = tmp_path / "d.parquet"
    pl.DataFrame({"id": [1, 2, 3], "speed": [-1.0, 999.0, 3.0], "code": ["UA", "UA", "UA"]}).write_parquet(data)
    result = keel(
        "contracts", "validate", "--contract", str(contract), "--data", str(data), "--out", str(tmp_path / "o")
    )
    assert result.returncode == 1
    assert "EXCEEDED" in result.stdout
    assert json.loads((tmp_path / "o" / "report.json").read_text())["budget_exceeded"] is True


def test_dry_run_writes_only_the_report(tmp_path, contract):
    data = tmp_path / "d.csv"
    data.write_text("id,speed,code\n1,10,UA\n2,-5,AA\n")
    out = tmp_path / "o"
    result = keel(
        "contracts", "validate", "--contract", str(contract), "--data", str(data), "--out", str(out), "--dry-run"
    )
    assert result.returncode == 1  # 1 of 2 rows critical > 30 %: the verdict is the same, nothing is written
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    report = json.loads((out / "report.json").read_text())
    assert report["dry_run"] and report["planned"]["quarantined"] == 1 and report["valid"] == 2


@pytest.mark.parametrize(
    "bad_contract, message",
    [
        (
            "contract: demo\nversion: 1\nschema: {columns: {a: int64}}\nrules:\n  - {id: r, type: nope, column: a}\n",
            "unknown rule type",
        ),
        ("contract: demo\nversion: [1\n", "YAML syntax error"),
        ("contract: demo\nversion: one\nschema: {columns: {a: int64}}\n", "field 'version'"),
    ],
)
def test_bad_contract_exits_2_with_file_and_line(tmp_path, bad_contract, message):
    path = tmp_path / "bad.yaml"
    path.write_text(bad_contract)
    data = tmp_path / "d.csv"
    data.write_text("a\n1\n")
    for args in (
        ("contracts", "lint", str(path)),
        ("contracts", "validate", "--contract", str(path), "--data", str(data), "--out", str(tmp_path / "o")),
    ):
        result = keel(*args)
        assert result.returncode == 2
        assert str(path) in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    "name, content", [("missing.csv", None), ("d.json", b"{}"), ("d.parquet", b"not parquet at all")]
)
def test_unreadable_data_exits_2(tmp_path, contract, name, content):
    data = tmp_path / name
    if content is not None:
        data.write_bytes(content)
    result = keel(
        "contracts", "validate", "--contract", str(contract), "--data", str(data), "--out", str(tmp_path / "o")
    )
    assert result.returncode == 2 and str(data) in result.stderr


def test_usage_error_exits_2():
    assert keel("contracts", "validate").returncode == 2
    assert keel("nonsense").returncode == 2


def test_lint_reference_contracts():
    for path in CONTRACTS.glob("*.yaml"):
        result = keel("contracts", "lint", str(path))
        assert result.returncode == 0 and "ok" in result.stdout


def test_real_weather_file_with_partition_window(tmp_path):
    from usecases.flights.data import data_dir

    out = tmp_path / "o"
    weather = str(data_dir() / "weather.csv")
    result = keel(
        "contracts", "validate", "--contract", str(CONTRACTS / "weather.yaml"), "--data", weather, "--out", str(out)
    )
    # The whole year against a 32-day freshness window (measured from the newest reading): most rows are too old.
    assert result.returncode == 1
    report = json.loads((out / "report.json").read_text())
    assert report["rows_in"] == 26_115 and report["conserved"]
    assert {r["id"]: r["failed"] for r in report["rules"]}["wind_speed_physical"] == 1


def test_drift_cli_exit_codes(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    ref = tmp_path / "ref.parquet"
    pl.DataFrame({"x": rng.normal(0, 1, 5000), "c": rng.choice(["a", "b"], 5000)}).write_parquet(ref)
    same = tmp_path / "same.csv"
    pl.DataFrame({"x": rng.normal(0, 1, 4000), "c": rng.choice(["a", "b"], 4000)}).write_csv(same)
    moved = tmp_path / "moved.parquet"
    pl.DataFrame({"x": rng.normal(1, 1, 4000), "c": rng.choice(["a", "b"], 4000)}).write_parquet(moved)
    out = tmp_path / "report.json"
    ok = keel("drift", "--reference", str(ref), "--current", str(same), "--out", str(out))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(out.read_text())["verdict"] == "no_drift"
    drifted = keel("drift", "--reference", str(ref), "--current", str(moved), "--features", "x", "--out", str(out))
    assert drifted.returncode == 1
    report = json.loads(out.read_text())
    assert report["drifted_features"] == ["x"] and [f["feature"] for f in report["features"]] == ["x"]
    assert (
        keel("drift", "--reference", str(ref), "--current", str(tmp_path / "nope.csv"), "--out", str(out)).returncode
        == 2
    )
    bad = keel("drift", "--reference", str(ref), "--current", str(moved), "--features", "zzz", "--out", str(out))
    assert bad.returncode == 2 and "zzz" in bad.stderr


def test_a_command_without_model_picks_the_one_served_not_the_ones_installed(tmp_path, monkeypatch):
    """Issue 49: `keel ledger why live` refused because two models were installed though one was served."""
    import argparse

    from keel.cli.common import model_usecase
    from keel.home import KeelHome
    from keel.usecase import UseCaseError, installed

    assert len(installed()) > 1
    monkeypatch.setenv("KEEL_HOME", str(tmp_path))
    monkeypatch.delenv("KEEL_USECASES", raising=False)
    with pytest.raises(UseCaseError, match="none served yet.*flight-delay.*room-rate.*name one with --model"):
        model_usecase(argparse.Namespace(model=None))
    routing = KeelHome(tmp_path).serving.routing_of("room-rate")
    routing.parent.mkdir(parents=True)
    routing.write_text("{}")  # a runtime of this home serves room-rate, and only it
    assert model_usecase(argparse.Namespace(model=None)).model.name == "room-rate"
    assert model_usecase(argparse.Namespace(model="flight-delay")).model.name == "flight-delay"  # named: as asked
