"""What a request is scored on: the [batch, n_features] matrix from the entities (the use case's request contract — on
the record path for one entity, columnar for a batch —, the online store's features, frozen ones flagged) or from
feature values sent directly, range-checked. The validate and features stages of the request path (stages.py):
``InputBuilder`` holds what one served model needs for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from gpu_runtime.gateway.limits import RequestError
from keel.contracts.columnar import CheckedRecords, check_records
from keel.contracts.engine import CompiledContract
from keel.features.spec import Entity
from keel.usecase import UseCase

MAX_BATCH = 1024


def _calendar(entity: Entity, y: Any, m: Any, d: Any) -> tuple[date | None, tuple[str, str] | None]:
    """(the day, None), or (None, (field, why)) when integer date parts name no calendar day (each part in range,
    the date impossible: 2013-02-31); parts that are not all integers are the contract's to judge: (None, None)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (y, m, d)):
        return None, None
    try:
        return date(y, m, d), None
    except ValueError as exc:
        day = entity.date_parts[2]
        return None, (day, f"{entity.name}.{day} {d} of {y}-{m:02d}: {exc}")


def _dates(entity: Entity, checked: CheckedRecords) -> tuple[list[Any], dict[int, tuple[str, str]]]:
    """Each record's entity date (a valid record's from its typed values, another's from what was sent), and
    {index: (field, why)} for those whose date parts name no calendar day. A date not built from parts is the
    record's own."""
    if entity.date_parts is None:
        return checked.columns[entity.date], {}
    parts = [checked.columns[p] for p in entity.date_parts]
    dates: list[Any] = []
    impossible: dict[int, tuple[str, str]] = {}
    for i, ymd in enumerate(zip(*parts, strict=True)):
        if i in checked.verdicts and checked.verdicts[i].sink != "valid":
            ymd = tuple(checked.verdicts[i].record.get(p) for p in entity.date_parts)  # as sent
        day, why = _calendar(entity, *ymd)
        dates.append(day)
        if why is not None:
            impossible[i] = why
    return dates, impossible


@dataclass(frozen=True)
class Validated:
    """A request's entities after the request contract: their columns, dates, which are good, and the violations
    (index, rules) of the others. ``direct``: feature values sent with the request, already range-checked."""

    direct: np.ndarray | None = None
    checked: CheckedRecords | None = None
    dates: list[Any] = field(default_factory=list)
    good: list[int] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)
    entity_key: str | None = None

    @property
    def rows(self) -> int:
        return len(self.direct) if self.direct is not None else self.checked.n


class InputBuilder:
    """The validate and features stages of one served model: its use case's request contract, features, ranges and
    defaults, and its online store (``store()``: opened on first use)."""

    def __init__(self, usecase: UseCase, contract: CompiledContract, store: Callable[[], Any]):
        self.usecase = usecase
        self.features = usecase.features
        self.contract = contract
        self.reasons = {rule.id: rule.reason for rule in contract.rules}  # what a 422 says of each failed rule
        self.store = store
        self.defaults = self.features.defaults.astype(np.float32)
        self.lo = np.array([f.lo for f in self.features.features])
        self.hi = np.array([f.hi for f in self.features.features])

    def entities_of(self, req: dict[str, Any], generic: bool) -> list[Any] | None:
        """The entities a request scores: ``entities`` on the generic route, the use case's alias fields on
        ``/v1/predict``; None when the request gives ``features`` directly."""
        if "features" in req:
            return None
        if generic:
            entities, what = req.get("entities"), "'entities' must be a list of 1…{n} objects"
        else:
            alias = self.usecase.serving.alias
            if alias is None:
                raise RequestError(
                    422, "invalid_input", "this use case has no alias route: use /v1/models/{model}/predict"
                )
            plural = f"{alias}s"
            entities = req.get(plural) if plural in req else [req.get(alias)]
            what = f"'{plural}' must be a list of 1…{{n}} {alias} objects"
        if not isinstance(entities, list) or not entities or len(entities) > MAX_BATCH:
            raise RequestError(422, "invalid_input", what.format(n=MAX_BATCH))
        return entities

    def validate(self, req: dict[str, Any], entities: list[Any] | None, invalid_input: str) -> Validated:
        """The request contract over the entities (one entity: the record path; a batch: the contract's columnar
        form, the same verdicts) — 422 ``invalid_input`` naming each bad entity's rules, unless the policy's
        ``invalid_input`` is ``default`` (they are then scored on the reference defaults, flagged)."""
        if entities is None:
            return Validated(direct=self.direct_features(req["features"]))
        entity = self.features.entity
        for i, row in enumerate(entities):
            if not isinstance(row, dict):
                raise RequestError(422, "invalid_input", f"each {entity.name} must be a JSON object", index=i)
        contract = self.contract
        checked = CheckedRecords.of(contract.spec.column_names, [contract.validate_record(entities[0])]) \
            if len(entities) == 1 else check_records(contract, entities)  # fmt: skip
        dates, impossible = _dates(entity, checked)
        invalid, good = [], []
        for i in range(checked.n):
            verdict = checked.verdicts.get(i)
            if i not in impossible and (verdict is None or verdict.sink == "valid"):
                good.append(i)
                continue
            violation = {"index": i, "rules": list(verdict.failed_rules if verdict else ())}
            if i in impossible:  # each field in range, the date impossible (2013-02-31): say which field
                violation |= {"field": impossible[i][0], "message": impossible[i][1]}
                violation["rules"].append("calendar_date")
            # each rule's reason, as the contract states it (`hour outside [0, 23]`), beside its id
            violation["reasons"] = [impossible[i][1] if rule == "calendar_date" else self.reasons.get(rule, rule)
                                    for rule in violation["rules"]]  # fmt: skip
            invalid.append(violation)
        if invalid and invalid_input == "reject":
            raise RequestError(
                422, "invalid_input", f"the request breaks contract {contract.spec.name}", violations=invalid
            )
        key = None
        if good == [0] and entity.key is not None:  # one entity: its key, so outcomes can be joined later
            key = entity.key.of(checked.verdict(0).record | {entity.date: dates[0]})
        return Validated(checked=checked, dates=dates, good=good, invalid=invalid, entity_key=key)

    def matrix(self, checked: Validated) -> tuple[np.ndarray, list[str]]:
        """The [batch, n_features] float32 matrix (the online store's features of the good entities, the
        reference defaults for the others), and degraded flags."""
        if checked.direct is not None:
            return checked.direct, []
        degraded: list[str] = []
        entity = self.features.entity
        x = np.tile(self.defaults, (checked.rows, 1))
        if checked.invalid:
            degraded.append("invalid_input_defaults")
        good = checked.good
        if good:
            store = self.store()
            if store is None:
                degraded.append("no_online_store")
            else:
                from keel.features.online import get_online_columns

                cols = checked.checked.columns
                columns = {c: cols[c] for c in entity.request_columns if c in cols}
                columns[entity.date] = checked.dates
                if len(good) < checked.rows:
                    columns = {c: [v[i] for i in good] for c, v in columns.items()}
                batch = get_online_columns(store, columns, len(good))
                m = batch.matrix.T  # entities × features
                missing = np.isnan(m)
                if missing.any():
                    degraded.append("missing_features_defaulted")
                    m = np.where(missing, self.defaults, m)
                x[good] = m
                degraded += [f"frozen:{name}" for name in batch.degraded]
        return x.astype(np.float32), degraded

    def direct_features(self, given: Any) -> np.ndarray:
        """Feature values sent with the request: one object {name: value}, a list of them, or the columnar form
        {"columns": [names], "rows": [[values], …]} (the cheapest to send and to parse for big batches)."""
        names = self.features.names
        if isinstance(given, dict) and "rows" in given:
            columns, rows = given.get("columns"), given.get("rows")
            if not isinstance(rows, list) or not isinstance(columns, list):
                raise RequestError(422, "invalid_input", "columnar features need 'columns' and 'rows' lists")
            absent = [n for n in names if n not in columns]
            if absent:
                raise RequestError(422, "missing_input", f"features missing: {', '.join(absent)}", missing=absent)
            order = [columns.index(n) for n in names]
        else:
            rows = given if isinstance(given, list) else [given]
            order = None
        if not rows or len(rows) > MAX_BATCH:
            raise RequestError(422, "invalid_input", f"'features' must hold 1…{MAX_BATCH} rows")
        try:
            if order is None:
                x = np.array([[row[n] for n in names] for row in rows], dtype=np.float64)
            else:
                x = np.array(rows, dtype=np.float64)
                if x.ndim != 2 or x.shape[1] != len(columns):
                    raise ValueError("ragged rows")
                x = x[:, order]
        except (KeyError, TypeError, ValueError, IndexError):
            raise explain_bad_features(names, rows, order) from None
        bad = (x < self.lo) | (x > self.hi) | ~np.isfinite(x)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise RequestError(
                422,
                "out_of_range",
                f"feature {names[j]} = {x[i, j]} is outside [{self.lo[j]:g}, {self.hi[j]:g}]",
                index=int(i),
                feature=names[j],
            )
        return x.astype(np.float32)


def explain_bad_features(names: tuple[str, ...], rows: list[Any], order: list[int] | None) -> RequestError:
    """The slow path, only for a bad request: which row, and what is wrong with it."""
    for i, row in enumerate(rows):
        if order is None:
            if not isinstance(row, dict):
                return RequestError(422, "invalid_input", "each features entry must be a JSON object", index=i)
            absent = [n for n in names if n not in row]
            if absent:
                return RequestError(
                    422, "missing_input", f"features missing: {', '.join(absent)}", index=i, missing=absent
                )
            values = [row[n] for n in names]
        else:
            if not isinstance(row, list) or len(row) <= max(order):
                return RequestError(422, "invalid_input", "each row must list a value per column", index=i)
            values = [row[j] for j in order]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return RequestError(422, "invalid_input", "feature values must be numbers", index=i)
    return RequestError(422, "invalid_input", "features must be numbers")
