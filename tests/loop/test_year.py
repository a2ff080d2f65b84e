"""The year at a glance (keel/loop/year.py, keel/plots.py lines_svg): every month so far in one table and chart, the
model changes and canary decisions on their months, and the loop's words as a person reads them."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET

import polars as pl

from keel.loop.year import on_the_months, shorten, step_words, year_rows, year_so_far
from keel.plots import lines_svg


def frame(month: str, served: float | None, static: float) -> pl.DataFrame:
    return pl.DataFrame({"month": [month] * 4, "model": ["served", "static", "naive", "expanding"],
                         "auc": [served, static, None, 0.7]})  # fmt: skip


def test_the_months_in_order_with_each_models_metric():
    months, series = year_so_far(pl.concat([frame("2013-05", 0.71, 0.69), frame("2013-04", None, 0.7)]), "auc")
    assert year_rows(["2013-04"], {"served": [0.651972471246]}, "auc", {})[0]["served_auc"] == 0.652  # 4 decimals
    assert months == ["2013-04", "2013-05"]
    assert series == {"served": [None, 0.71], "static": [0.7, 0.69], "naive": [None, None], "expanding": [0.7, 0.7]}
    rows = year_rows(months, series, "auc", {"2013-05": "v5 live 05-10"})
    assert rows == [
        {"month": "2013-04", "served_auc": None, "static_auc": 0.7, "naive_auc": None, "expanding_auc": 0.7,
         "what_happened": ""},
        {"month": "2013-05", "served_auc": 0.71, "static_auc": 0.69, "naive_auc": None, "expanding_auc": 0.7,
         "what_happened": "v5 live 05-10"},
    ]  # fmt: skip


def test_the_chart_is_valid_svg_with_a_line_per_model_and_the_markers():
    svg = lines_svg("auc by month", ["2013-04", "2013-05", "2013-06"],
                    {"served": [0.7, 0.72, None], "static": [0.7, 0.69, 0.68]},
                    [("2013-05", "v5 live 05-10"), ("2013-05", "canary rollback 05-20"), ("2014-01", "elsewhere")])  # fmt: skip
    root = ET.fromstring(svg)  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2 and len(root.findall(f"{ns}circle")) == 5
    texts = [t.text for t in root.findall(f"{ns}text")]
    assert "v5 live 05-10" in texts and "canary rollback 05-20" in texts and "elsewhere" not in texts
    assert len(root.findall(f"{ns}line")) == 2  # a marker off the calendar is not drawn
    assert base64.b64encode(svg.encode())  # embeddable as the metadata's data URL


def test_words_a_person_reads():
    assert step_words("start", "0.0") == "start: shadow (0 % of traffic)"
    assert step_words("advance", "25.0") == "advance at 25 %" and step_words("rollback", None) == "rollback"
    long = "none of 5 candidates is surely better than the champion after Holm's correction " * 3
    short = shorten(long, 60)
    assert len(short) < len(long) and short.endswith(f"(+{len(long) - len(short.split(' …')[0])} chars)")
    assert not short.split(" …")[0].endswith("champio")  # cut at a word, never mid-word
    assert shorten("room_month_price", 160) == "room_month_price"


def test_a_decision_after_the_last_month_is_shown_on_it_not_dropped():
    months = ["2013-11", "2013-12"]
    marks = [("2013-10", "v2 live 10-03"), ("2013-12", "v4 live 12-05"), ("2014-01", "canary rollback 01-12")]
    assert on_the_months(marks, months) == [
        ("2013-12", "v4 live 12-05"),
        ("2013-12", "then canary rollback 01-12 (2014-01)"),
    ]
    assert on_the_months(marks, []) == []
