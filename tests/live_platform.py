"""The whole platform as scripts/up starts it, for the slow tests that drive it: the model runtime (Triton + gateway),
`dagster dev` (webserver + daemon, every sensor) and `scripts/materialize.py --live` (the history, then the simulated
clock with replayed traffic), into a throwaway KEEL_HOME.

One such platform serves every slow test that needs a live one (the ``year_platform`` session fixture,
tests/conftest.py): tests/test_live_drills.py runs the chaos drills on it first, on the wall clock in a quiet April (no
canary of the loop yet), then tests/test_live_year.py goes on stepped — the reproducible clock — through the known
outcome that ``KNOWN_OUTCOME`` plants in what lands (its module name sorts after the drills': the live year's checks
count the traffic from where it took over, after every drill had recovered)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests import REPO
from tests.dagster_support import DAGSTER, free_port, home_env

DRILL_SPEED = (
    2000.0  # a simulated day every 43 s: a delivery's redelivery and a canary's labels come in a minute or two
)
# The data drill of the shared live platform (keel/data/plants.py; tests/test_live_year.py asserts what the loop must
# do with it), clear of the drills' days (a label planted under the bad-challenger drill's canary judges it on noise).
# April 13–30 half of the flights land on time whatever happened: April's drift report (May 1) asks for a challenger,
# but every candidate was fitted on April 1–10, before the change — none is surely better on April 11–30, and the gate
# must refuse them all. From May 1 a third of the flights land an hour late, for good: May's drift report (June 1)
# finds the label's shift, its candidates (fitted or recalibrated on May 1–10) must pass the gate, the chosen one beat
# the champion in shadow on June's flights and be promoted.
KNOWN_OUTCOME = [
    {"usecase": "flights", "table": "flights", "from_day": "2013-04-13", "until_day": "2013-04-30",
     "column": "arr_delay", "value": "0", "share": 0.5, "seed": 47,
     "why": "known outcome: April 13-30 half of the flights on time: the gate must refuse April's candidates"},
    {"usecase": "flights", "table": "flights", "from_day": "2013-05-01", "column": "arr_delay", "value": "60",
     "share": 0.35, "seed": 46, "why": "known outcome: from May a third of the flights an hour late: promoted"},
]  # fmt: skip


def wait_until(what: str, condition, timeout_s: float, every_s: float = 2.0, on_timeout=lambda: ""):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s. {on_timeout()}")
        time.sleep(every_s)


def no_run_in_progress(home: Path) -> bool:
    import dagster as dg

    with instance_of(home) as instance:
        busy = [
            dg.DagsterRunStatus.QUEUED,
            dg.DagsterRunStatus.NOT_STARTED,
            dg.DagsterRunStatus.STARTING,
            dg.DagsterRunStatus.STARTED,
        ]
        return not instance.get_runs(filters=dg.RunsFilter(statuses=busy), limit=1)


def instance_of(home: Path):
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home / "dagster_home")))


@dataclass
class LivePlatform:
    home: Path
    env: dict[str, str]
    year: subprocess.Popen  # scripts/materialize.py --live
    procs: list[subprocess.Popen]
    replay: list[str]  # how ``year`` was started (the command line)
    dev: subprocess.Popen  # `dagster dev` (webserver, daemon, code server)
    dev_args: list[str]
    port: int  # the UI's (keel's guard in front of the webserver)
    phase: str = "start"  # then "drills" (tests/test_live_drills.py), then "year" (tests/test_live_year.py)
    marks: dict[str, int] = field(default_factory=dict)  # where the drills began in the alert records
    traffic_before_year: dict = field(default_factory=dict)  # the traffic totals when the live-year test took over

    def log(self, name: str = "live.log", tail: int = 4000) -> str:
        return (self.home / name).read_text()[-tail:]

    def stop(self) -> None:
        """Stop every process of the platform (what the block's end does; for a user of it that is done early)."""
        stop_groups(self.procs)

    def go_on_stepped(self) -> None:
        """As an operator does with ``KEEL_LIVE_CLOCK=stepped scripts/up`` after a Ctrl-C: the wall-clock replay
        stopped (the clock pauses, the traffic stops), its runs let finish, `dagster dev` started again with the
        deciding sensors ticking every second (each step waits for their ticks; the drills before ran at their normal
        interval), then the replay again with ``--stepped`` — on from the next day's step (docs/live.md)."""
        self.year.send_signal(signal.SIGINT)
        assert self.year.wait(timeout=120) == 130, self.log()
        quiet = []  # no run in progress twice, 10 s apart: the paused clock asks for nothing more

        def settled() -> bool:
            quiet.append(no_run_in_progress(self.home))
            return quiet[-2:] == [True, True]

        wait_until("the wall-clock replay's runs have finished", settled, 900, 10)
        stop_groups([self.dev])
        self.env = self.env | {"KEEL_SENSOR_INTERVAL_S": "1"}
        self.dev = _start(self.home, self.env, self.procs, self.dev_args, "dagster_dev.log")
        wait_until("dagster dev is up again", lambda: webserver_up(self.port, self.dev, self.home / "dagster_dev.log"),
                   300, 1)  # fmt: skip
        self.year = _start(self.home, self.env, self.procs, [*self.replay, "--stepped"], "live.log")


@contextmanager
def live_platform(home: Path, *live_args: str, env: dict[str, str] | None = None) -> Iterator[LivePlatform]:
    """Start the runtime, `dagster dev` and the live year (``live_args`` added to materialize.py's; ``env`` added to
    the environment); stop them all when the block ends (SIGTERM to each process group, SIGKILL after a minute)."""
    (home / "dagster_home").mkdir()
    shutil.copy(REPO / "scripts" / "dagster.yaml", home / "dagster_home" / "dagster.yaml")
    env = home_env(home) | {"KEEL_EDGE": "1"} | (env or {})  # the edge in front, as scripts/up has it
    procs: list[subprocess.Popen] = []

    def start(args, log: str) -> subprocess.Popen:
        return _start(home, env, procs, args, log)

    try:
        gateway_port, port, internal = free_port(), free_port(), free_port()
        serve = start([sys.executable, "-m", "gpu_runtime.serve", "--gateway-port", str(gateway_port)], "serve.log")
        wait_until("the model runtime is up",
                   lambda: (home / "serving" / "endpoints.json").exists() or serve.poll() is not None, 180, 0.2)  # fmt: skip
        assert serve.poll() is None, (home / "serve.log").read_text()[-3000:]
        # as scripts/up: the webserver on an internal port, the UI's port is keel's guard in front of it
        dev_args = [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(internal)]
        dev = start(dev_args, "dagster_dev.log")
        start([sys.executable, "-m", "keel.uiguard", "--listen", f"127.0.0.1:{port}", "--upstream",
               f"127.0.0.1:{internal}"], "uiguard.log")  # fmt: skip
        wait_until("dagster dev is up", lambda: webserver_up(port, dev, home / "dagster_dev.log"), 300, 1)
        replay = [sys.executable, "scripts/materialize.py", "--port", str(port), "--live",
                  "--gateway", f"http://127.0.0.1:{gateway_port}", *live_args]  # fmt: skip
        yield LivePlatform(home, env, start(replay, "live.log"), procs, replay, dev, dev_args, port)
    finally:
        stop_groups(procs)


def _start(home: Path, env: dict, procs: list[subprocess.Popen], args: list[str], log: str) -> subprocess.Popen:
    """A process of the platform in a session of its own (so its whole group can be stopped), its output appended to
    ``home/log``."""
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=open(home / log, "ab"), stderr=subprocess.STDOUT, start_new_session=True
    )
    procs.append(proc)
    return proc


def stop_groups(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process group still running (newest first), SIGKILL to any still there after a minute."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def webserver_up(port: int, proc: subprocess.Popen, log: Path) -> bool:
    """Whether `dagster dev` on ``port`` answers; an assertion with its log's tail if the process exited."""
    assert proc.poll() is None, log.read_text()[-3000:]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextmanager
def shared_year(home: Path, receiver_url: str) -> Iterator[LivePlatform]:
    """The session's live platform: its alerts go to the on-call's webhooks at ``receiver_url`` (the page as
    Alertmanager's API, the chat Slack-compatible), and what lands carries the ``KNOWN_OUTCOME`` data drill."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "alerts.yaml").write_text(
        f'channels:\n  page: {{format: alertmanager, url: "{receiver_url}/page"}}\n'
        f'  chat: {{format: slack, url: "{receiver_url}/chat"}}\n  mail: {{format: log}}\n'
    )
    (home / "landing").mkdir()
    (home / "landing" / "plants.json").write_text(json.dumps(KNOWN_OUTCOME))
    # April on the wall clock at the drills' speed (tests/test_live_drills.py), then tests/test_live_year.py goes on
    # stepped (LivePlatform.go_on_stepped)
    with live_platform(home, "--speed", str(DRILL_SPEED)) as platform:
        yield platform
