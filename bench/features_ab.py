"""A/B of the online feature path: ``get_online_features`` of this tree against the same function at an earlier
commit (``--base``), on the same store contents and the same requests, in one process, alternating.

    .venv/bin/python bench/features_ab.py --base 8c0ce45

The base commit's modules (features/definitions.py, online.py, sqlite_store.py: the flight-specific code before the
use-case declarations) are read with ``git show`` into a temporary package; the answers of both must be equal
before anything is timed. Prints the median µs per call and new/old for batches of 1 and 100 (7 rounds of 300).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def old_package(base: str, into: Path) -> None:
    pkg = into / "oldkeel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for m in ("definitions", "online", "sqlite_store"):
        text = subprocess.check_output(["git", "show", f"{base}:keel/features/{m}.py"], cwd=REPO, text=True)
        for name in ("definitions", "online", "sqlite_store"):
            text = text.replace(f"keel.features.{name}", f"oldkeel.{name}")
        (pkg / f"{m}.py").write_text(text)
    sys.path.insert(0, str(into))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    args = parser.parse_args()
    import numpy as np
    import polars as pl

    tmp = Path(tempfile.mkdtemp())
    old_package(args.base, tmp)
    from oldkeel.online import REQUEST_COLUMNS
    from oldkeel.online import build_views as old_views
    from oldkeel.online import get_online_features as old_get
    from oldkeel.sqlite_store import SQLiteOnlineStore as OldStore

    from keel.features.online import get_online_features as new_get
    from keel.features.sqlite_store import SQLiteOnlineStore as NewStore
    from tests.features.conftest import validated_months
    from usecases.flights.features import FLIGHT_FEATURES, build_views, offline_features

    v = validated_months(("2013-01", "2013-02"))
    day = date(2013, 2, 20)
    old = OldStore(tmp / "old.sqlite", cache_size=200_000)
    old.write_snapshot(old_views(v["weather"], v["planes"], v["flights"], as_of=day), as_of=day, partition="x")
    new = NewStore(tmp / "new.sqlite", features=FLIGHT_FEATURES, cache_size=200_000)
    new.write_snapshot(build_views(v["weather"], v["planes"], v["flights"], as_of=day), as_of=day, partition="x")
    todays = v["flights"].filter((pl.col("month") == 2) & (pl.col("day") == 20))
    rows = offline_features(todays, v["weather"], v["planes"], v["flights"]).select(REQUEST_COLUMNS).to_dicts()
    assert np.array_equal(old_get(old, rows).matrix, new_get(new, rows).matrix, equal_nan=True), "answers differ"
    for batch in (1, 100):
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(7):
            for name, fn, store in (("old", old_get, old), ("new", new_get, new)):
                t = time.perf_counter()
                for i in range(300):
                    start = i % (len(rows) - batch)
                    fn(store, rows[start : start + batch])
                times[name].append((time.perf_counter() - t) / 300 * 1e6)
        o, n = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"batch {batch:>3}: get_online_features median {args.base} {o:.1f} µs, this tree {n:.1f} µs, "
              f"new/old {n / o:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
