"""Process hygiene for the Triton server: it dies with its parent, its admin key leaves its command line, and
nothing of it outlives a killed ``serve`` — the watchdog and ``reap_orphan`` stop tritonserver and its Python-backend
stubs through the process group recorded in ``<work dir>/tritonserver.pid``."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (no tritonserver outlives a killed serve)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def hide_admin_key(pid: int, key: str) -> bool:
    """Overwrite ``key`` in process ``pid``'s argument memory (its /proc/<pid>/cmdline) and return whether it is
    gone. Works for a child of this process (a parent may write its child's memory)."""
    secret = key.encode()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(arg_start)
            args = mem.read(arg_end - arg_start)
            at = args.find(secret)
            while at >= 0:
                mem.seek(arg_start + at)
                mem.write(b"*" * len(secret))
                at = args.find(secret, at + len(secret))
        return secret not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return False


def reap_orphan(work_dir: str | Path) -> int | None:
    """Stop what an earlier, killed serve left of its Triton: every process of the process group recorded in
    ``tritonserver.pid`` that is a tritonserver or one of its Python stubs (nothing else, whatever reused the id).
    Returns the group when something was stopped."""
    pid_file = Path(work_dir) / "tritonserver.pid"
    try:
        pgid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid and b"triton" in cmdline:
            left.append(int(entry.name))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in left):
        time.sleep(0.05)
    pid_file.unlink(missing_ok=True)
    return pgid if left else None


WATCHDOG = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from gpu_runtime.process import reap_orphan
def reap(*_):
    reap_orphan(sys.argv[2])
    os._exit(0)
signal.signal(signal.SIGTERM, reap)
if os.getppid() != int(sys.argv[3]):
    reap()
while True:
    signal.pause()
"""


def start_watchdog(work_dir: str | Path) -> subprocess.Popen | None:
    """A small process that outlives nothing: when the process that started it dies — even by SIGKILL — the kernel
    sends it SIGTERM (setpriv --pdeathsig), and it stops every Triton process left in the recorded process group
    (tritonserver and its Python stubs, which a killed tritonserver cannot stop). None where setpriv is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    import sys

    return subprocess.Popen(
        [setpriv, "--pdeathsig", "TERM", sys.executable, "-c", WATCHDOG, str(REPO_ROOT), str(work_dir),
         str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
