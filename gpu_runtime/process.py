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


SERVING_NICE_ENV = "KEEL_SERVING_NICE"
SERVING_NICE_DEFAULT = -5


def serving_priority(environ=os.environ) -> str:
    """Raise the model runtime's CPU priority (``$KEEL_SERVING_NICE``, default −5) before its threads and children
    start: Triton, the gateway's workers and their threads inherit it. A request crosses several threads (the
    gateway's loop, its gRPC poller, Triton's frontend and model instance); on a machine whose cores other work keeps
    busy each waits in the run queue, and at the default priority their waits add up past an L1 deadline. At nice −5 a
    serving thread weighs 3× a normal process's and preempts it on waking (Linux CFS) — what a Kubernetes pod of
    Guaranteed QoS gets through its CPU shares. Lowering the nice value needs CAP_SYS_NICE (or RLIMIT_NICE): where it
    is not allowed the runtime keeps its priority and says so. Returns the line to print."""
    raw = environ.get(SERVING_NICE_ENV, str(SERVING_NICE_DEFAULT))
    try:
        wanted = int(raw)
    except ValueError:
        raise ValueError(f"{SERVING_NICE_ENV} must be an integer nice value (-20…19), got {raw!r}") from None
    if not -20 <= wanted <= 19:
        raise ValueError(f"{SERVING_NICE_ENV} must be within -20…19, got {wanted}")
    current = os.getpriority(os.PRIO_PROCESS, 0)
    group = session_priority(wanted)
    if current == wanted:
        return f"serving at nice {current}{group}"
    try:  # (Linux keeps a nice value per thread: every thread of the process now, those started later inherit it)
        for tid in _threads():
            os.setpriority(os.PRIO_PROCESS, tid, wanted)
    except PermissionError:
        return (f"serving at nice {current}: not permitted to set nice {wanted} ({SERVING_NICE_ENV}; needs "
                f"CAP_SYS_NICE) — on a busy machine serving competes with other work as an equal")  # fmt: skip
    return f"serving at nice {wanted} (was {current}; {SERVING_NICE_ENV}){group}"


AUTOGROUP = Path("/proc/self/autogroup")


def session_priority(wanted: int) -> str:
    """Give this process's session the nice value ``wanted`` too; what to add to the priority line.

    Linux's *autogroup* (``kernel.sched_autogroup_enabled``, on by default in Debian's kernels) first shares the CPU
    between sessions — each ``setsid`` starts one — and a process's own nice counts only within its session: a
    serving process at nice −5 and a batch run at nice 5 in another session weigh the same. The live year showed it:
    an L1 request 70 ms late with the gateway's loop idle and the machine busy with Dagster's runs. So the serving
    session's autogroup gets the serving nice (scripts/up starts the runtime in a session of its own, Dagster's in
    another at the batch nice; Triton and Envoy stay in the serving session). Only a session leader changes its
    session's — a runtime started from a shell leaves the shell's session alone."""
    if os.getsid(0) != os.getpid():
        return ""
    try:
        current = AUTOGROUP.read_text().split("nice", 1)[1].strip()  # "/autogroup-120 nice 0"
        if int(current) != wanted:
            AUTOGROUP.write_text(str(wanted))
    except FileNotFoundError:  # a kernel without autogroup: nice values alone decide
        return ""
    except (OSError, IndexError, ValueError) as exc:
        return f"; its session's autogroup keeps its nice ({exc})"
    return f", its session too (autogroup nice {wanted})"


def _threads(pid: int | str = "self") -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # no /proc (or the process is gone): the calling thread
        return [0] if pid == "self" else []


def hold_priority(pid: int) -> int:
    """Bring every thread of process ``pid`` (Triton) to this process's nice value; returns how many were changed.
    Triton sets its model instances' threads to a nice value of its own (0, or 5 or 19 by a model's
    ``optimization.priority``) when it loads a model, so the supervisor holds them at the serving priority."""
    wanted = os.getpriority(os.PRIO_PROCESS, 0)
    changed = 0
    for tid in _threads(pid):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) != wanted:
                os.setpriority(os.PRIO_PROCESS, tid, wanted)
                changed += 1
        except (ProcessLookupError, PermissionError):  # a thread that ended, or a priority not ours to give
            continue
    return changed
