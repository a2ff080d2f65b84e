"""Processes a test session left running, and the signals a session starts its children with (issue 46 item 11).

A CI run once ended with both UI guards, a ``dagster dev`` group and its code servers still running 25 minutes later,
each with SIGTERM in its ignored-signal mask: they inherited it ignored from the test process (a harness's background
shell ignores INT and QUIT; that run's ignored TERM too), so no TERM could stop them. ``restore_default_signals``
(keel/signals.py) gives the test process — and so every child it starts — the default dispositions back; ``leftovers`` finds the
processes of the session still alive at its end (their environment or command line names one of the session's
homes: its temporary root and a test home it was given, never a home it was merely handed — keel/home.py);
conftest.py fails the session on them, after killing them.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from keel.signals import restore_default_signals  # noqa: F401 - the session calls it (conftest.py)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile, or not ours to read
        return b""


def ancestors(pid: int) -> set[int]:
    """``pid`` and the processes it descends from (the session's own launcher, e.g. ``timeout``, names its home too)."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        status = _read(Path(f"/proc/{pid}/status")).decode(errors="replace")
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "0")
        pid = int(ppid)
    return out


def leftovers(roots: list[str], me: int | None = None) -> dict[int, str]:
    """pid → command line of every live process (not a zombie, not this one or its ancestors) whose environment or
    command line names a path under one of ``roots``."""
    mine = ancestors(os.getpid() if me is None else me)
    # A root is matched whole: pytest-1 is not a prefix of pytest-12's paths (another session's).
    marks = [re.compile(re.escape(r.rstrip("/").encode()) + rb"(?=[/\0 ]|$)") for r in roots if r]
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        status = _read(entry / "status")
        if not status or b"State:\tZ" in status:
            continue
        seen = _read(entry / "environ") + b"\0" + _read(entry / "cmdline")
        if any(m.search(seen) for m in marks):
            found[int(entry.name)] = _read(entry / "cmdline").replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def wait_for_leftovers(roots: list[str], grace_s: float = 30.0) -> dict[int, str]:
    """The session's processes still alive after ``grace_s`` (a teardown's TERM takes a moment to act)."""
    deadline = time.monotonic() + grace_s
    while True:
        found = leftovers(roots)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
