"""The report of the overload drill (gpu_runtime/overload_drill.py): per phase what the probe's requests got, how fast
the refusals came, when the service recovered, and the connections left in CLOSE-WAIT. Each request is a record
``[sent offset s, latency s or None, status (0: transport failure or client timeout), error code, how late it left s]``.
"""

from __future__ import annotations

from pathlib import Path

WINDOW_S = 5.0
FAST_REFUSAL_S = 0.05  # a refusal is fast when it comes back within this (issue 45)


def close_wait(port: int) -> int:
    """Connections to ``port`` in CLOSE-WAIT (the gateway holds a socket its client has closed)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "08":
                count += 1
    return count


def pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else None


def phase_report(records: list[list], start: float, end: float, timeout_s: float | None = None) -> dict:
    """One phase's requests: answered (200) at all and — ``timeout_s``, the tier's timeout — within it, as the
    client measured (from its write to the answer read)."""
    part = [r for r in records if start <= r[0] < end]
    ok = [r[1] for r in part if r[2] == 200]
    refusals = [r for r in part if r[2] not in (0, 200)]
    in_time = sum(1 for t in ok if t <= timeout_s) if timeout_s is not None else None
    return {
        "sent": len(part), "answered": len(ok), "answered_share": round(len(ok) / len(part), 4) if part else None,
        "answered_in_time_share": round(in_time / len(part), 4) if part and in_time is not None else None,
        "p50_ms": _ms(pct(ok, 0.5)), "p99_ms": _ms(pct(ok, 0.99)),
        "client_timeouts": sum(1 for r in part if r[2] == 0),
        "transport_failures": _codes([r for r in part if r[2] == 0]),  # by kind: a timeout, a connection reset …
        "refusals": _codes(refusals), "slowest_refusal_ms": _ms(max((r[1] for r in refusals), default=None)),
        "refusals_slower_than_50ms": sum(1 for r in refusals if r[1] > FAST_REFUSAL_S),
    }  # fmt: skip


def refusal_times(refusals: list[list]) -> dict:
    """How fast the refusals came back: p50, p99 and how many took longer than ``FAST_REFUSAL_S``."""
    times = [r[1] for r in refusals]
    return {"refusal_p50_ms": _ms(pct(times, 0.5)), "refusal_p99_ms": _ms(pct(times, 0.99)),
            "refusals_slower_than_50ms": sum(1 for t in times if t > FAST_REFUSAL_S)}  # fmt: skip


def recovered_at(records: list[list], fault_end: float, end: float, baseline_p99_s: float) -> float | None:
    """Seconds after the fault ended when the first 5 s window with ≥ 99 % answered and p99 ≤ 2× baseline began."""
    t = fault_end
    while t + WINDOW_S <= end:
        part = [r for r in records if t <= r[0] < t + WINDOW_S]
        ok = [r[1] for r in part if r[2] == 200]
        if part and len(ok) >= 0.99 * len(part) and pct(ok, 0.99) <= 2 * baseline_p99_s:
            return round(t - fault_end, 2)
        t += 0.5
    return None


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 2)


def _codes(records: list[list]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[str(r[3] or r[2])] = out.get(str(r[3] or r[2]), 0) + 1
    return out
