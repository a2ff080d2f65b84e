"""The live replay's traffic (``python -m gpu_runtime.replay --live``, gpu_runtime/replay.py): requests about the
entities of the simulated day, sent while the clock (``$KEEL_HOME/clock.json``) runs — open loop at ``rps``, none
while it is paused, until it ends — or, on a stepped clock, ``per_day`` of each step's day in its traffic phase, each
asked again after a load refusal (``LOAD_REFUSALS``) so that a step's traffic is the same however busy the machine. The
running totals (``LiveTotals``: sent, ok, failed by status, error and simulated month, versions seen) are rewritten
every few seconds to ``$KEEL_HOME/serving/live_traffic/<use case>.json`` for the platform's summary."""

from __future__ import annotations

import asyncio
import os
import signal
import time

KEYS_ENV = "KEEL_REPLAY_KEYS"  # tenant=API key pairs, comma-separated: the replay behind the edge (never in argv)
# On a stepped clock a step's traffic must not depend on how busy the machine is: a request the gateway refused
# before doing any work (503 shed / overloaded, with Retry-After) is asked again after the Retry-After, as a patient
# client does, up to PATIENT_TRIES times; only its last answer counts (``retried`` says how many were asked again).
LOAD_REFUSALS = ("shed", "overloaded")
PATIENT_TRIES = 30


def key_headers(tenants: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Each tenant's request headers: its API key from ``$KEEL_REPLAY_KEYS`` (``ops=keel_…,pricing=keel_…``), for a
    gateway behind the edge; none for a tenant without one (a gateway without an edge takes the body's tenant_id)."""
    keys = dict(pair.split("=", 1) for pair in os.environ.get(KEYS_ENV, "").split(",") if "=" in pair)
    return {t: ({"x-api-key": keys[t]} if t in keys else {}) for t in tenants}


def wait_for_key(url: str, key: str, timeout_s: float = 30.0) -> float:
    """Until the edge at ``url`` takes ``key`` (a request with it is no longer 401: the edge follows the policy store
    within a second or two of the commit); the seconds it took. RuntimeError after ``timeout_s``. The probe is a
    ``GET /v1/predict``: the edge authenticates it like any request, and the gateway answers it 404 without asking a
    model — no exposure is logged, no request counted."""
    import httpx

    started = time.monotonic()
    while httpx.get(f"{url}/v1/predict", headers={"x-api-key": key}, timeout=10).status_code == 401:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the edge at {url} did not take the new API key within {timeout_s:g} s")
        time.sleep(0.05)
    return time.monotonic() - started


def entities_by_day(uc) -> dict[str, list[dict]]:
    """Every request entity of the use case's period, by local day (YYYY-MM-DD)."""
    out: dict[str, list[dict]] = {}
    for month in uc.months:
        for row in uc.replay.requests(month):
            out.setdefault(uc.replay.day_of(row), []).append(row)
    return out


def day_sample(entities: list[dict], n: int) -> list[dict]:
    """``n`` of a day's entities spread evenly over it (all, cycled, when it has fewer): the same on every run."""
    if not entities or n <= 0:
        return []
    return [
        entities[(j * len(entities)) // n] if n <= len(entities) else entities[j % len(entities)] for j in range(n)
    ]


def answered_by(payload: dict) -> str | None:
    """Which model answered: its version, or ``coarse vN`` for the coarse model's answer."""
    if payload.get("variant") == "coarse":
        return f"coarse v{payload.get('coarse_version')}"
    version = payload.get("model_version")
    return None if version is None else str(version)


class LiveTotals:
    """The live traffic's running totals, as written to the summary file."""

    def __init__(self) -> None:
        self.sent = self.ok = self.failed = 0
        self.by_status: dict[str, int] = {}
        self.by_error: dict[str, int] = {}
        self.by_month: dict[str, dict[str, int]] = {}
        self.versions: dict[str, int] = {}
        self.degraded = 0
        self.by_degraded: dict[str, int] = {}  # flag → answers that carried it (coarse_fallback, frozen:…, …)
        self.started = time.time()
        self.sending_s = 0.0  # wall seconds the clock was running (the rate is over these)
        self.step: int | None = None
        self.retried = 0  # a stepped replay's requests asked again after a load refusal (LOAD_REFUSALS)

    def add(self, month: str, status: int, version, error: str | None, degraded) -> None:
        self.ok += status == 200
        self.failed += status != 200
        self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1
        if error:
            self.by_error[error] = self.by_error.get(error, 0) + 1
        m = self.by_month.setdefault(month, {"ok": 0, "failed": 0})
        m["ok" if status == 200 else "failed"] += 1
        if status == 200:
            self.versions[str(version)] = self.versions.get(str(version), 0) + 1
            self.degraded += bool(degraded)
            for flag in degraded or ():
                self.by_degraded[flag] = self.by_degraded.get(flag, 0) + 1

    def as_dict(self, sim_now: str, finished: bool) -> dict:
        answered = self.ok + self.failed
        return {
            "sim_now": sim_now,
            "finished": finished,
            "step": self.step,  # a stepped clock's newest step whose traffic is all answered (None: not stepped)
            "sent": self.sent,
            "answered": answered,
            "ok": self.ok,
            "failed": self.failed,
            "retried": self.retried,
            "by_status": self.by_status,
            "by_error": self.by_error,
            "degraded_answers": self.degraded,
            "by_degraded": self.by_degraded,
            "versions": self.versions,
            "by_month": dict(sorted(self.by_month.items())),
            "achieved_rps": round(answered / self.sending_s, 1) if self.sending_s else None,
        }


async def live(
    url: str, uc, home, rps: float, max_in_flight: int, tenants: tuple[str, ...] = ("replay",), per_day: int = 0
) -> dict:
    """Send the simulated day's entities at ``rps`` while the clock runs; return the totals when it ends. On a
    stepped clock: ``per_day`` requests of each step's day in its traffic phase, as fast as ``max_in_flight`` allows
    (module docstring)."""
    from datetime import UTC, datetime

    import aiohttp

    from keel.clock import TRAFFIC, SimClock
    from keel.storage import write_json_atomic

    clock = SimClock(home.clock, uc.name)
    summary_path = home.serving.live_traffic(uc.name)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    days = entities_by_day(uc)
    route = f"/v1/models/{uc.model.name}/predict"
    headers = key_headers(tenants)  # behind the edge: each tenant's API key ($KEEL_REPLAY_KEYS)
    totals = LiveTotals()
    cursor: dict[str, int] = {}
    sem = asyncio.Semaphore(max_in_flight)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    timeout = aiohttp.ClientTimeout(total=30.0)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    tasks: set[asyncio.Task] = set()
    sim_now = ""
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout) as client:

        async def one(entity: dict, month: str, tenant: str, patient: bool = False) -> None:
            body = {"entities": [entity], "tenant_id": tenant, "risk_level": 2, "unit_id": uc.replay.unit_of(entity)}
            try:
                for attempt in range(PATIENT_TRIES if patient else 1):
                    async with client.post(route, json=body, headers=headers[tenant]) as resp:
                        payload = await resp.json()
                        error = (payload.get("error") or {}).get("code")
                        wait = float(resp.headers.get("Retry-After") or 1.0)
                    if resp.status == 503 and error in LOAD_REFUSALS and attempt + 1 < PATIENT_TRIES and patient:
                        totals.retried += 1
                        await asyncio.sleep(min(max(wait, 0.05), 5.0))
                        continue
                    totals.add(month, resp.status, answered_by(payload), error, payload.get("degraded"))
                    break
            except Exception as exc:  # noqa: BLE001 - a transport failure is a failed request, counted
                totals.add(month, 0, None, type(exc).__name__, None)
            finally:
                sem.release()

        last_write = 0.0
        next_send = prev = time.perf_counter()
        while not stop.is_set():
            t0 = time.perf_counter()
            elapsed, prev = t0 - prev, t0
            state = clock.state()
            wall = datetime.now(UTC)
            if state is not None and state.stepped and state.running:
                if state.phase == TRAFFIC and (totals.step is None or state.step > totals.step):
                    now = state.now(wall)
                    sim_now = now.isoformat(timespec="seconds")
                    # Fresh connections each step: between steps they idle longer than a server keeps them alive,
                    # and a request on a connection the server has just closed fails on the client's side.
                    await client.close()
                    client = aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=max_in_flight),
                                                   timeout=timeout)  # fmt: skip
                    for entity in day_sample(days.get(f"{now:%Y-%m-%d}", []), per_day):
                        await sem.acquire()
                        totals.sent += 1
                        tenant = tenants[totals.sent % len(tenants)]
                        task = asyncio.create_task(one(entity, f"{now:%Y-%m}", tenant, patient=True))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    if tasks:
                        await asyncio.gather(*tasks)  # every answer of the step is in before it counts as sent
                    totals.step = state.step
                    write_json_atomic(totals.as_dict(sim_now, False), summary_path)
                elif state.finished(wall) and totals.step is not None and totals.step >= state.step:
                    break
                else:
                    await asyncio.sleep(0.05)
                continue
            if state is None or not state.running or state.finished(wall):
                if state is not None and state.finished(wall):
                    break
                await asyncio.sleep(0.5)  # paused (or not started): nothing is sent
                next_send = time.perf_counter()
                continue
            totals.sending_s += elapsed  # wall time the clock ran: the achieved rate is over it
            now = state.now(wall)
            sim_now = now.isoformat(timespec="seconds")
            day = f"{now:%Y-%m-%d}"
            todays = days.get(day)
            t = time.perf_counter()
            if time.time() - last_write > 5:
                write_json_atomic(totals.as_dict(sim_now, False), summary_path)
                last_write = time.time()
            if not todays:
                await asyncio.sleep(0.1)
                next_send = time.perf_counter()
                continue
            if next_send > t:
                await asyncio.sleep(next_send - t)
            next_send = max(next_send + 1.0 / rps, time.perf_counter() - 1.0)  # open loop, no burst after a stall
            i = cursor.get(day, 0)
            cursor[day] = i + 1
            await sem.acquire()
            totals.sent += 1
            task = asyncio.create_task(one(todays[i % len(todays)], day[:7], tenants[totals.sent % len(tenants)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        await client.close()  # a stepped replay's newest session (the first one the block closes itself)
    summary = totals.as_dict(sim_now, True)
    write_json_atomic(summary, summary_path)
    return summary
