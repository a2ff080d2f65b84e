"""The delivery gate: each day an upstream system delivers is checked on its own before it joins its month.

A month's validation (assets/validated.py) judges rows; it cannot tell that *one delivery* is wrong as a whole — a
day of weather in °C instead of °F passes every range, and a day with a renamed column cannot even be
read together with the other days. So the landing sensor checks each new day file against its table's contract
(``check_delivery``) and holds back a day whose defect is *systematic*:

- a column of the contract is missing (the schema broke: ``schema_columns`` fails on every row); or
- a rule of severity warning or critical fails on at least ``SYSTEMATIC_SHARE`` (50 %) of the day's rows, and on at
  least ``SYSTEMATIC_MIN_ROWS`` (5) of them — noise breaks a rule on a few rows, a changed unit or encoding breaks it
  on nearly all of them (°C temperatures put the dew point above the temperature in every reading); one row of a
  two-row day is no evidence of either.

A few bad rows (2013-02-12's 1,048 mph wind) are the month's validation's business: its quarantine keeps them.

Info rules describe real events (a cancelled order) and never hold a day back. A held-back day is moved, whole,
to ``<landing>/_quarantine/<table>/<day>.parquet`` with a ``.json`` verdict beside it (every row in exactly one
place), so its month is built without it and nothing downstream runs for it; the rest of the month keeps flowing
and serving continues. Every day of the shipped 2013 data passes (tests/test_delivery.py checks all 730 files).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from keel.contracts.results import PartitionWindow
from keel.storage import write_json_atomic, write_parquet_atomic, write_text_atomic

SYSTEMATIC_SHARE = 0.5  # a rule failing on at least this share of a delivery's rows is a defect of the delivery
SYSTEMATIC_MIN_ROWS = 5  # … and on at least this many of them (a small day's one bad row is noise)
QUARANTINE_DIR = "_quarantine"


@dataclass(frozen=True)
class Breach:
    rule: str
    severity: str
    failed: int
    rows: int
    columns: tuple[str, ...]
    reason: str

    @property
    def share(self) -> float:
        return self.failed / self.rows if self.rows else 0.0


@dataclass(frozen=True)
class DeliveryVerdict:
    table: str
    day: str
    rows: int
    contract: str
    contract_version: int
    breaches: tuple[Breach, ...] = ()
    missing_columns: tuple[str, ...] = ()
    unexpected_columns: tuple[str, ...] = ()
    checked_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def ok(self) -> bool:
        return not self.breaches and not self.missing_columns

    @property
    def columns(self) -> tuple[str, ...]:
        """The contract columns the defect is in (what the lineage query starts from)."""
        out: list[str] = list(self.missing_columns)
        for b in self.breaches:
            out += [c for c in b.columns if c not in out]
        return tuple(out)

    def summary(self) -> str:
        if self.ok:
            return f"{self.table} {self.day}: {self.rows} rows, no systematic breach"
        parts = []
        if self.missing_columns:
            parts.append(f"columns missing: {', '.join(self.missing_columns)}")
        if self.unexpected_columns:
            parts.append(f"unexpected columns: {', '.join(self.unexpected_columns)}")
        parts += [
            f"rule {b.rule} ({b.severity}) failed on {b.failed}/{b.rows} rows ({b.share:.0%}): {b.reason}"
            for b in self.breaches
            if b.rule != "schema_columns"
        ]
        return f"{self.table} {self.day} (contract {self.contract} v{self.contract_version}): " + "; ".join(parts)

    @classmethod
    def from_dict(cls, d: dict) -> DeliveryVerdict:
        """A verdict as ``to_dict`` wrote it (the .json beside a held-back delivery)."""
        breaches = tuple(
            Breach(b["rule"], b["severity"], b["failed"], b["rows"], tuple(b["columns"]), b["reason"])
            for b in d.get("breaches", ())
        )
        return cls(d["table"], d["day"], d["rows"], d["contract"], d["contract_version"], breaches,
                   tuple(d.get("missing_columns", ())), tuple(d.get("unexpected_columns", ())),
                   d.get("checked_at", ""))  # fmt: skip

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok, "summary": self.summary(), "columns": list(self.columns)}


def month_window(day: date) -> PartitionWindow:
    return PartitionWindow.month(f"{day.year}-{day.month:02d}")


def check_delivery(table: str, day: date, frame: pl.DataFrame, compiled, references=None) -> DeliveryVerdict:
    """Judge one delivered day of ``table`` against its compiled contract (``keel.contracts.engine``)."""
    spec = compiled.spec
    result = compiled.validate(frame, month_window(day), dry_run=True, references=references or {})
    rep = result.report
    breaches = []
    missing = set(rep.missing_columns)
    for r in rep.rules:
        if not r.failed or r.severity == "info":
            continue
        if r.id != "schema_columns" and missing & set(r.columns):
            continue  # a rule on a missing column fails because the column is missing: the schema says it already
        systematic = r.failed / max(rep.rows_in, 1) >= SYSTEMATIC_SHARE and r.failed >= SYSTEMATIC_MIN_ROWS
        if r.id == "schema_columns" or systematic:
            breaches.append(Breach(r.id, r.severity, r.failed, rep.rows_in, tuple(r.columns), r.reason))
    return DeliveryVerdict(
        table,
        day.isoformat(),
        rep.rows_in,
        spec.name,
        spec.version,
        tuple(breaches),
        tuple(rep.missing_columns),
        tuple(rep.unexpected_columns),
    )


def quarantine_path(root: Path, table: str, day: date) -> Path:
    return Path(root) / QUARANTINE_DIR / table / f"{day.isoformat()}.parquet"


def held_back(root: Path) -> list[dict]:
    """Every verdict of a held-back delivery, oldest first."""
    folder = Path(root) / QUARANTINE_DIR
    if not folder.exists():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/*.json"))]


class DeliveryGate:
    """Admits the landing zone's day files one by one. A day is *admitted* once it passed ``check_delivery``; the
    marker (``<landing>/_admitted/<table>/<day>``) remembers the file's size and mtime, so a file replaced after its
    admission is checked again. The landing sensor runs the gate every tick (detection within one tick) and the raw
    assets run it before they read a month (a run never reads a day nobody checked) — whichever comes first checks,
    the other finds the marker or the held-back verdict."""

    def __init__(self, zone, contracts: dict | None = None, references: dict | None = None):
        self.zone = zone
        self.root = Path(zone.root)
        self._contracts = contracts
        self._references = references

    def _contract(self, table: str):
        from keel.contracts.engine import CompiledContract
        from keel.contracts.spec import load_contract

        if self._contracts is None:
            self._contracts = {}
        if table not in self._contracts:
            self._contracts[table] = CompiledContract(load_contract(self.zone.usecase.contract_path(table)))
        return self._contracts[table]

    def _refs(self, compiled) -> dict:
        if self._references is None:
            self._references = {}
        for ref in compiled.spec.references:
            if ref not in self._references:
                dataset, column = ref.split(".", 1)
                self._references[ref] = self.zone.usecase.source(dataset).read()[column]
        return {r: self._references[r] for r in compiled.spec.references}

    def _marker(self, table: str, day: date) -> Path:
        return self.root / "_admitted" / table / day.isoformat()

    @staticmethod
    def _stamp(path: Path) -> str:
        st = path.stat()
        return f"{st.st_size}:{st.st_mtime_ns}"

    def admitted(self, table: str, day: date) -> bool:
        try:
            return self._marker(table, day).read_text() == self._stamp(self.zone.path(table, day))
        except FileNotFoundError:
            return False

    def check(self, table: str, day: date) -> DeliveryVerdict | None:
        """Check one delivered day unless admitted already: admit it, or hold it back. The verdict, or None when
        there was nothing to check (admitted before, or gone: another checker held it back first)."""
        path = self.zone.path(table, day)
        if self.admitted(table, day):
            return None
        try:
            stamp = self._stamp(path)
            frame = pl.read_parquet(path)
        except FileNotFoundError:
            return None
        compiled = self._contract(table)
        verdict = check_delivery(table, day, frame, compiled, self._refs(compiled))
        if verdict.ok:
            marker = self._marker(table, day)
            marker.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(stamp, marker)
        else:
            self._hold_back(path, verdict)
        return verdict

    def _hold_back(self, source: Path, verdict: DeliveryVerdict) -> Path | None:
        """Move a failed delivery out of its month, whole, with its verdict beside it. A day held back twice (a
        second bad delivery of it) keeps both, numbered."""
        day = date.fromisoformat(verdict.day)
        target = quarantine_path(self.root, verdict.table, day)
        target.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while target.exists():
            n += 1
            target = target.with_name(f"{day.isoformat()}.{n}.parquet")
        try:
            os.replace(source, target)  # same filesystem: atomic, the rows are in exactly one place at every moment
        except FileNotFoundError:
            return None  # another checker moved it first
        write_json_atomic(verdict.to_dict() | {"held_at": str(target)}, target.with_suffix(".json"))
        return target

    def check_new(self, tables=None, month: str | None = None) -> list[DeliveryVerdict]:
        """Check every delivered, not yet admitted day (of ``month`` ``YYYY-MM`` when given)."""
        out = []
        for table in tables or self.zone.tables:
            for day in self.zone.delivered(table):
                if month is not None and f"{day.year}-{day.month:02d}" != month:
                    continue
                verdict = self.check(table, day)
                if verdict is not None:
                    out.append(verdict)
        return out

    def screen_month(self, table: str, frame: pl.DataFrame) -> tuple[pl.DataFrame, list[DeliveryVerdict]]:
        """A backfill's month of ``table`` as shipped, screened day by day the way the live replay's gate screens
        each delivery, so a backfill and a live replay build the same months (a ``flag`` rule that fails on most of
        one day's rows holds that day back in both). A held-back day's rows go, whole, to the same quarantine as a
        live delivery's, with its verdict (``held_by: backfill``; a rebuild overwrites them: idempotent). Rows whose
        day columns are not a date stay: the month's validation quarantines them. The kept rows and the verdicts of
        the days held back."""
        src = self.zone.usecase.source(table)
        compiled = self._contract(table)
        refs = self._refs(compiled)
        held: list[DeliveryVerdict] = []
        held_days: list[tuple[str, str, str]] = []
        for key, rows in frame.group_by(list(src.day_columns), maintain_order=True):
            try:
                day = date(int(key[0]), int(key[1]), int(key[2]))
            except (TypeError, ValueError):
                continue
            verdict = check_delivery(table, day, rows, compiled, refs)
            if verdict.ok:
                continue
            target = quarantine_path(self.root, table, day)
            write_parquet_atomic(rows, target)
            write_json_atomic(verdict.to_dict() | {"held_at": str(target), "held_by": "backfill"},
                              target.with_suffix(".json"))  # fmt: skip
            held.append(verdict)
            held_days.append(tuple(str(k) for k in key))
        if not held:
            return frame, held
        y, m, d = src.day_columns
        day_of = pl.concat_str([pl.col(y), pl.col(m), pl.col(d)], separator="-")
        return frame.filter(~day_of.is_in(["-".join(k) for k in held_days])), held


def next_due_day(zone, table: str, now: datetime, margin: timedelta = timedelta(hours=12)) -> date:
    """The first day of ``table`` that has not landed and is not due within ``margin`` of ``now`` — what a drill
    delivers early: a day about to be delivered by the replay could overwrite the drill's file in the same instant."""
    have = set(zone.delivered(table))
    d = zone.first_day
    while (d in have or zone.due(table, d) <= now + margin) and d < zone.last_day:
        d += timedelta(days=1)
    return d
