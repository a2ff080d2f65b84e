"""What ``keel new`` declares for a profiled table — every choice a value with its reason, before a file is written.

The choices, in the order the generated contract states them (``Plan.rules``; each rule says how many of the table's
rows it fails and why it exists):

- **rows in time**: the reader adds ``event_year``/``event_month``/``event_day`` (the monthly partition and the day a
  row lands) and ``event_date`` from the time column; ``event_parts`` holds them to it (``timestamp_parts``).
- **one row once**: ``unique`` over the entity columns and the day (``--entity``), else over every column (an exact
  duplicate row): quarantined.
- **ranges**, from the column's nature (``keel.new.rules.numeric_range``): an integer of few values (hours,
  weekdays) holds the values it holds; a share is [0, 1]; a column never negative runs from 0 to twice its 99.9th
  percentile; a signed one is its 1st–99th percentile widened by that spread — a value past it is an entry or unit
  error: quarantined (critical for the label, which would teach the model; warning otherwise).
- **categories**: a text column with few values (≤ ``MAX_CATEGORIES``) is held to the values the first model's months
  show; a value first seen later is flagged, not dropped (the model answers it from the prior) and counted.
- **nulls**: a column with no null is ``nullable: false`` (a null later is quarantined); a feature column with nulls
  keeps them (LightGBM learns a missing value; the gateway serves the default) and its ``<col>_present`` rule counts
  them; the label and the time column are never null (a row without them can be neither trained on nor placed).
- **gaps**: days with no row are no row's defect — no rule can see them; they are named in the contract, and the first
  model's validation month is a month without one.

Features: every numeric or boolean column (not the label) as a request feature, the month and weekday of the row's
day, and per category column a smoothed mean of the label over the rows of **earlier days** with the same category
(``History``: point-in-time correct). The first model trains on the first quarter of the months (at least two with
rows) and is validated on the next full month; the rest is replayed.
"""

from __future__ import annotations

import math

import polars as pl

from keel.new.choices import (  # noqa: F401 - the plan's parts, imported from here by their users
    ADDED,
    COMMON_NULLS,
    MAX_CATEGORIES,
    FeatureChoice,
    HistoryChoice,
    Options,
    Plan,
    PlanError,
    Rule,
    SchemaColumn,
)
from keel.new.defects import table_defects
from keel.new.keys import row_key
from keel.new.profile import ColumnProfile, TableProfile
from keel.new.rules import (  # the rules of one column, the time axis and the label
    budget,
    categories_in,
    duplicate_rule,
    first_day,
    label_domain,
    label_values,
    last_day,
    median_rows,
    n_rows,
    nice,
    null_words,
    numeric_range,
    shown_number,
    task_of,
    time_rules,
)


def _month_rows(frame, ident: str, months: list[str]):
    return frame.filter(pl.col(ident).is_not_null() & pl.col("_month").is_in(months))


def plan(profile: TableProfile, frame, opts: Options) -> Plan:
    """The use case for a profiled table (``profile_table``'s profile and typed frame)."""
    cols = {c.ident: c for c in profile.columns}

    def find(name: str, what: str) -> ColumnProfile:
        for c in profile.columns:
            if name in (c.name, c.ident):
                return c
        raise PlanError(f"{what} {name!r} is not a column of the table (its columns: {', '.join(cols)})")

    label, time = find(opts.label, "--label"), find(opts.time, "--time")
    entity = tuple(find(e, "--entity").ident for e in opts.entity)
    clash = [a for a in (*ADDED, "row_ref") if a in cols]
    if clash:
        raise PlanError(f"the table has columns named {clash}: keel new adds columns of those names; rename them")
    task, positive = task_of(label, opts)
    t = profile.time
    months = list(t.months[-opts.months :]) if opts.months else list(t.months)
    frame = frame.with_columns(
        (pl.col(time.ident).dt.date() if time.kind == "datetime" else pl.col(time.ident))
        .dt.strftime("%Y-%m")
        .alias("_month")
    )
    with_rows = [m for m in months if t.rows_per_month.get(m, 0) > 0]
    if len(with_rows) < 3:
        raise PlanError(f"{len(with_rows)} months with rows in {months[0]}…{months[-1]}: a first model needs two to "
                        "train on and one to validate on (more with --months)")  # fmt: skip
    n_train = max(2, len(with_rows) // 4)
    train = with_rows[:n_train]
    gaps = t.gap_months()
    # the validation month: the first after training with a typical month's rows (at least half the median) and
    # no gap of a week; failing that, the first with that many rows; failing that, the next month with rows
    enough = [m for m in with_rows[n_train:] if t.rows_per_month.get(m, 0) >= 0.5 * median_rows(t, with_rows)]
    later = [m for m in enough if m not in gaps] or enough or with_rows[n_train:]
    valid = later[0]
    first_months = [*train, valid]
    first = _month_rows(frame, time.ident, first_months)
    # the prior (where every category's history starts) from the training months only: the validation month is
    # what the first model is judged on, and the gate's — its labels must not leak into a feature (issue 61 item 10)
    y = label_values(_month_rows(frame, time.ident, train)[label.ident], task, positive)
    prior = float(y.mean()) if y.len() else 0.0

    defects: list[str] = []
    rules: list[Rule] = []
    schema: list[SchemaColumn] = []
    features: list[FeatureChoice] = []
    histories: list[HistoryChoice] = []
    categories: list[str] = []
    flags: list[str] = []
    ignored: dict[str, str] = {}
    critical_rows = 0

    # what no single value shows: columns that give the label away (never features), a stuck sensor, impossible
    # zeros (keel/new/leakage.py, keel/new/defects.py)
    others = [c for c in profile.columns if c.ident not in (label.ident, time.ident, *entity)]
    leaks, found_rules, found = table_defects(frame, profile, time, label, positive, others)
    defects += found
    # time
    time_rows = time_rules(time, profile, rules, defects)
    critical_rows += time_rows
    time_key, time_parts, part_rules = row_key(profile, frame, time, label, entity)  # keel/new/keys.py
    rules += part_rules
    # one row once
    dup_rule, _ = duplicate_rule(profile, frame, (time.ident,) if time_key else entity, defects, keyed=time_key)
    rules.append(dup_rule)  # a warning: not in the critical budget

    for c in profile.columns:
        is_label, is_time = c.ident == label.ident, c.ident == time.ident
        ctype = {"int": "int64", "float": "float64", "bool": "bool", "string": "string", "date": "date",
                 "datetime": "datetime"}[c.kind]  # fmt: skip
        if is_time:
            ctype = "datetime"
        nullable = c.nulls > 0 and not (is_label or is_time)
        desc = "the label" if is_label else "the time column" if is_time else ""
        schema.append(SchemaColumn(c.ident, ctype, nullable, c.fmt if c.temporal else None, desc))
        if is_time:
            continue
        if c.nulls and (is_label or is_time):
            critical_rows += c.nulls
            defects.append(f"{c.ident}: {n_rows(c.nulls)} without a value ({null_words(c)}) — the "
                           f"{'label' if is_label else 'time'}: quarantined (schema, critical)")  # fmt: skip
        elif c.nulls:
            share = c.nulls / profile.rows
            common = share >= COMMON_NULLS  # a usual absence: info (never holds a day back), else a warning
            rules.append(Rule(f"{c.ident}_present", {"type": "not_null", "column": c.ident,
                                                     "severity": "info" if common else "warning", "action": "flag",
                                                     "max_failure_fraction": budget(share)},
                              f"{c.nulls} of {profile.rows} rows ({share:.1%}) have no {c.ident} ({null_words(c)}): kept "
                              "(the model learns a missing value), counted" + (
                                  "; info: that common, a day of them is no broken delivery" if common else
                                  "; a day that is mostly without it is held back (docs/contracts.md, Deliveries)"),
                              c.nulls))  # fmt: skip
            defects.append(
                f"{c.ident}: {n_rows(c.nulls)} without a value ({null_words(c)}) — kept, flagged (`{c.ident}_present`)"
            )
        if c.numeric and c.quantiles:
            lo, hi, how = numeric_range(c)
            values = frame[c.ident].drop_nulls()
            outside = values.filter((values < lo) | (values > hi))
            sev = "critical" if is_label else "warning"
            why = f"{how}: [{lo:g}, {hi:g}]"
            if outside.len():
                shown = ", ".join(shown_number(v) for v in outside.head(5).to_list())
                why += f"; {n_rows(outside.len())} outside ({shown}): an entry or unit error, quarantined"
                defects.append(f"{c.ident}: {n_rows(outside.len())} outside [{lo:g}, {hi:g}] ({shown}) — quarantined "
                               f"(`{c.ident}_range`, {sev})")  # fmt: skip
                critical_rows += outside.len() if is_label else 0
            fields = {
                "type": "range",
                "column": c.ident,
                "min": lo,
                "max": hi,
                "severity": sev,
                "action": "quarantine",
            }
            if not is_label:
                fields["max_failure_fraction"] = budget(outside.len() / profile.rows)
            rules.append(Rule(f"{c.ident}_range", fields, why, outside.len()))
            if c.distinct <= 1 and not is_label:
                ignored[c.ident] = "one value only: held to its range, not a feature"
            elif not is_label and c.ident not in entity:
                flag = c.kind == "int" and (c.min, c.max) == (0, 1)
                med = c.q(0.5)
                default = int(round(med)) if c.kind == "int" else nice(med, up=True)
                default = min(max(default, lo), hi)
                features.append(FeatureChoice(c.ident, "int" if c.kind == "int" else "float",
                                              f'ops.as_{"int" if c.kind == "int" else "float"}(col("{c.ident}"))',
                                              lo, hi, default, f"{c.name} (from the request)"))  # fmt: skip
                if flag:
                    flags.append(c.ident)
        elif c.kind == "bool" and c.distinct <= 1 and not is_label:
            ignored[c.ident] = "one value only: not a feature"
        elif c.kind == "bool" and not is_label and c.ident not in entity:
            common = c.categories[0][0] if c.categories else "false"
            features.append(FeatureChoice(c.ident, "int", f'ops.as_int(col("{c.ident}"))', 0, 1,
                                          1 if common == "true" else 0, f"{c.name}: 1 when true"))  # fmt: skip
            flags.append(c.ident)
        elif c.kind == "string" and not is_label:
            small = c.distinct <= MAX_CATEGORIES and c.distinct < 0.5 * profile.rows
            if c.ident in entity:
                continue
            if not small:
                ignored[c.ident] = f"{c.distinct} distinct values: an id or free text, not a feature"
                continue
            keyed = c.distinct > 1
            if not keyed:
                ignored[c.ident] = "one value only: held to it, not a feature"
            seen = categories_in(first, c.ident)
            later_only = [v for v, _ in c.categories if v not in seen]
            new_rows = int(frame.filter(pl.col(c.ident).is_in(later_only)).height) if later_only else 0
            why = f"the {len(seen)} values of the first model's months ({', '.join(first_months[:1])}…{valid})"
            if later_only:
                why += (f"; {', '.join(later_only[:8])} first seen later ({new_rows} rows): kept, flagged — the model "
                        "answers a value it never saw from the prior")  # fmt: skip
                defects.append(f"{c.ident}: new values {', '.join(later_only[:8])} after the first model's months "
                               f"({new_rows} rows) — kept, flagged (`{c.ident}_known`)")  # fmt: skip
            why += "; info: a new value is an event, not a broken delivery — it never holds a day back"
            rules.append(Rule(f"{c.ident}_known", {"type": "in_set", "column": c.ident, "values": sorted(seen),
                                                   "severity": "info", "action": "flag",
                                                   "max_failure_fraction": budget(new_rows / profile.rows)},
                              why, new_rows))  # fmt: skip
            if not keyed:
                continue
            categories.append(c.ident)
            histories.append(HistoryChoice(f"{c.ident}_{label.ident}_mean", c.ident,
                                           f"mean {label.ident} of earlier days' rows with the same {c.ident}"))  # fmt: skip
        elif c.temporal and not is_label:
            ignored[c.ident] = "a second date or time: not a feature (derive one in features.py)"
    ignored |= {col: f"label leakage — {why}: not a feature" for col, why in leaks.items()}
    rules += found_rules
    features = [f for f in features if f.name not in leaks]
    histories = [h for h in histories if h.key not in leaks]
    categories = [c for c in categories if c not in leaks]
    flags = [f for f in flags if f not in leaks]
    if time.kind == "datetime" or t.cadence in ("hourly", "daily", "business days"):
        features.append(FeatureChoice(_free("day_of_week", cols), "int", 'ops.as_int(ops.weekday(col("event_date")))', 1, 7, 3,
                                      "ISO weekday of the row's day"))  # fmt: skip
    features.insert(0, FeatureChoice(_free("month_of_year", cols), "int", 'ops.as_int(ops.month(col("event_date")))', 1, 12, 6,
                                     "month of the row's day"))  # fmt: skip
    gate_min_rows = max(30, min(1000, int(median_rows(t, with_rows) // 3)))
    share = max(0.02, budget(critical_rows / profile.rows))
    smallest = min(with_rows, key=lambda x: t.rows_per_month[x])
    tiny = t.rows_per_month[smallest] * share < 1
    floor_why = f"{smallest} has {t.rows_per_month[smallest]} rows: under one row at {share:.0%}" if tiny else ""
    # two samples of one distribution, a month (n rows) and the reference (m), differ by ~sqrt(1/n + 1/m) in
    # normalised Wasserstein distance (and in Jensen-Shannon distance over a few categories) by chance alone: drift is
    # judged at twice that where it is over the defaults (0.15 and 0.1: a month of thousands of rows)
    n, m = median_rows(t, with_rows), sum(t.rows_per_month.get(x, 0) for x in first_months)
    noise = math.sqrt(1 / max(n, 1) + 1 / max(m, 1))
    drift_threshold = round(max(0.15, 2 * noise), 2) if 2 * noise > 0.1 else None
    # a leaf of keel's default 50 rows leaves a model of ~100 bagged training rows no split at all: a constant
    train_rows = sum(t.rows_per_month.get(x, 0) for x in train)
    leaf = max(5, min(50, train_rows // 10))
    domain, domain_why = label_domain(label) if task == "regression" else (None, "")
    renames = {c.name: c.ident for c in profile.columns if c.name != c.ident}
    tokens = tuple(sorted({tok for c in profile.columns for tok in c.null_tokens}))
    null_columns = tuple(c.ident for c in profile.columns if c.kind != "string" or c.null_tokens)
    return Plan(
        name=opts.name, table=opts.name, model=opts.name.replace("_", "-"), task=task, label=label.ident,
        positive=positive, time=time.ident, time_fmt=time.fmt or "%Y-%m-%d", entity=entity, tier=opts.tier,
        renames=renames, null_tokens=tokens, schema=tuple(schema), rules=tuple(rules),
        critical_share=share, critical_rows=int(tiny), critical_rows_why=floor_why, defects=tuple(defects),
        features=tuple(features), histories=tuple(histories), prior=round(prior, 6), categories=tuple(categories),
        flags=tuple(flags), months=tuple(months), first_day=first_day(months[0], t), last_day=last_day(months[-1], t),
        train_months=tuple(train), valid_month=valid, gate_min_rows=gate_min_rows,
        rps=40.0 if median_rows(t, with_rows) >= 3000 else 5.0, ignored=ignored, null_columns=null_columns,
        drift_threshold=drift_threshold, drift_noise=round(noise, 3), month_rows=int(n), reference_rows=int(m),
        train_rows=train_rows, min_data_in_leaf=leaf if leaf < 50 else None, label_domain=domain,
        label_domain_why=domain_why, time_key=time_key, time_parts=time_parts,
    )  # fmt: skip


def _free(name: str, columns) -> str:
    """A feature name keel adds, ``event_``-prefixed when the table has a column of that name already."""
    return f"event_{name}" if name in columns else name
