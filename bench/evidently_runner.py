"""Runs Evidently's DataDriftPreset on bench/drift.py's Parquet files, in bench/.venv-evidently (pandas 2).

Prints one JSON line: seconds for Report.run (reading the files is not timed) and the per-column distances.
"""

import json
import os
import sys
import time

os.environ.setdefault("DO_NOT_TRACK", "1")

import pandas as pd  # noqa: E402
from evidently import Report  # noqa: E402
from evidently.presets import DataDriftPreset  # noqa: E402


def main() -> None:
    ref_path, cur_path, threshold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ref, cur = pd.read_parquet(ref_path), pd.read_parquet(cur_path)
    t = time.perf_counter()
    snapshot = Report([DataDriftPreset(method="wasserstein", threshold=threshold)]).run(
        current_data=cur, reference_data=ref
    )
    seconds = time.perf_counter() - t
    values = {}
    for metric in snapshot.dict()["metrics"]:
        name = metric.get("metric_name", "")
        if name.startswith("ValueDrift(column="):
            values[name.split("column=")[1].split(",")[0]] = float(metric["value"])
    print(json.dumps({"seconds": seconds, "values": values}))


if __name__ == "__main__":
    main()
