"""The exposure log on real files: one append is one whole line or nothing, a failed append is reported and not
raised, and readers skip and count what is not a whole record instead of failing the whole read."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from keel.exposure_log import ExposureLog, read_exposures, scan_exposures
from keel.exposures import read_exposure_scan
from tests import REPO

WRITER = """
import json, resource, sys, time
from keel.exposure_log import ExposureLog
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
log = ExposureLog(sys.argv[1])
results = [log.append({"ts": 1767225600.0 + i, "status": 200, "request_id": f"r{i}", "model_version": 1,
                       "unit_id": "u" * 300}) for i in range(12)]
print(json.dumps({"results": results, "failures": log.failures, "last_error": log.last_error}))
"""


def test_a_file_size_limit_cuts_no_line_in_half_and_raises_nothing(tmp_path):
    """RLIMIT_FSIZE (no root needed) stands in for a full disk: the append that crosses it is a short write, which
    is cut back; the later ones fail outright. Every failure is counted, none raises, no line is torn."""
    limit = 1500  # three ~400-byte lines fit, the fourth crosses the limit
    out = subprocess.run(
        [sys.executable, "-c", WRITER, str(tmp_path), str(limit)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    written = report["results"].count(True)
    assert report["results"] == [True] * written + [False] * (12 - written) and 0 < written < 12
    assert report["failures"] == 12 - written and report["last_error"]
    [path] = tmp_path.glob("exposures-*.jsonl")
    assert path.stat().st_size <= limit and path.read_bytes().endswith(b"\n")
    scan = scan_exposures(tmp_path)
    assert scan.skipped == 0 and [r["request_id"] for r in scan.records] == [f"r{i}" for i in range(written)]


def test_readers_skip_and_count_lines_that_are_not_whole_records(tmp_path):
    log = ExposureLog(tmp_path)
    now = time.time()
    for i in range(3):
        assert log.append({"ts": now, "status": 200, "request_id": f"ok{i}", "model_version": 1, "routed_version": 1})
    log.close()
    [path] = tmp_path.glob("exposures-*.jsonl")
    with open(path, "ab") as fh:
        fh.write(b'{"ts": 1, "status": 200, "request_id": "to\n')  # torn by a crash, then appended after
        fh.write(b"\xff\xfe not utf-8\n")
        fh.write(b"[1, 2]\n")
        fh.write(b'{"ts": "yesterday", "status": 200}\n')
        fh.write(b'{"ts": 5, "status": 200, "model_version": "one"}\n')
        fh.write(json.dumps({"ts": now, "status": 503, "request_id": "ok3", "model_version": None}).encode() + b"\n")
        fh.write(b'{"ts": 6, "stat')  # the last line, cut short
    scan = scan_exposures(tmp_path)
    assert [r["request_id"] for r in scan.records] == ["ok0", "ok1", "ok2", "ok3"]
    assert scan.skipped == 6
    assert scan.examples[0] == f"{path.name}:4: not JSON (a torn or corrupt line)"
    assert any("not UTF-8" in e for e in scan.examples)
    assert len(read_exposures(tmp_path)) == 4
    frame, scan = read_exposure_scan(tmp_path)  # what the sensors and the lake read
    assert frame.height == 4 and scan.skipped == 6


def test_each_gateway_worker_writes_its_own_day_file_and_readers_take_them_all(tmp_path):
    """Several gateway workers (gpu_runtime/workers.py): one writer per file, every file of the directory read."""
    from keel.exposure_log import ExposureLog, day_stamp, read_exposures
    from keel.metering.usage import logged_days

    ts = 1_365_000_000.0  # 2013-04-03
    for worker in (0, 1):
        log = ExposureLog(tmp_path, worker=worker)
        for i in range(3):
            assert log.append({"request_id": f"w{worker}-{i}", "ts": ts, "status": 200})
        log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "exposures-20130403-w0.jsonl",
        "exposures-20130403-w1.jsonl",
    ]
    assert len(read_exposures(tmp_path, day="2013-04-03")) == 6
    assert logged_days(tmp_path, "exposures") == ["2013-04-03"]
    assert [
        day_stamp(tmp_path / n, "exposures")
        for n in ("exposures-20130403.jsonl", "exposures-2013.jsonl", "exposures-20130403-wx.jsonl")
    ] == ["20130403", "", ""]
