"""The overload drill's load (gpu_runtime/overload_drill.py): open-loop streams of requests, each in a process of its
own (``python -m gpu_runtime.overload_load SPEC``: its stream from a JSON file, its records out as JSON), pinned to
the load generator's CPUs when given — so no client loop delays another's answers, and the runtime keeps the cores
a remote client would leave it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLIENT_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 4096  # a stream's open connections at most (a client's file descriptors)
IDLE_REUSE_S = 2.0  # a keep-alive connection idle longer is closed, not reused (uvicorn closes them after 5 s)


def api_key(body: bytes, keys: dict[str, str] | None) -> str | None:
    """The request's API key behind the edge: its tenant's (the body's ``tenant_id``); None without an edge."""
    return keys.get(json.loads(body).get("tenant_id", "")) if keys else None


async def stream(
    url: str, route: str, bodies: list[bytes], rate: float, seconds: float, keys: dict[str, str] | None = None
) -> list[list]:
    """Open loop: requests leave on schedule whatever the answers do. Per request: [sent offset s, latency s or
    None, status (0: transport failure or client timeout), error code, how late it left s].

    A plain HTTP/1.1 client on asyncio streams (keep-alive connections reused, a new one when all are busy, up to
    ``MAX_CONNECTIONS``; requests prebuilt): a flood of thousands a second from a client library would take the cores
    the gateway is measured on. Latency runs from when the request was written; how late the sender was against
    its schedule is kept apart (the last field), so the client's own lag is not counted as the gateway's."""
    from urllib.parse import urlsplit

    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80

    def request(b: bytes) -> bytes:
        key = api_key(b, keys)
        auth = f"x-api-key: {key}\r\n" if key else ""
        head = f"POST {route} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n{auth}"
        return f"{head}content-length: {len(b)}\r\n\r\n".encode() + b

    requests = [request(b) for b in bodies]
    out: list[list] = []
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []  # (…, when it was last answered)
    open_connections = 0
    start = time.perf_counter()

    async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        first = await reader.readline()
        if not first:  # closed before an answer (a connection cap's refusal as it accepted): a transport failure
            raise ConnectionAbortedError("the server closed the connection without an answer")
        status = int(first.split()[1])
        length, keep = 0, True
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
        return status, await reader.readexactly(length), keep

    async def one(i: int, due: float) -> None:
        nonlocal open_connections
        t0 = time.perf_counter()
        while idle and t0 - idle[-1][2] > IDLE_REUSE_S:  # the server may be closing it: a client lets it go
            idle.pop()[1].close()
            open_connections -= 1
        conn = idle.pop()[:2] if idle else None
        try:
            if conn is None:
                if open_connections >= MAX_CONNECTIONS:
                    raise ConnectionError("the client's connection limit")
                open_connections += 1
                try:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, port), CLIENT_TIMEOUT_S)
                except BaseException:
                    open_connections -= 1
                    raise
            reader, writer = conn
            writer.write(requests[i % len(requests)])
            left = CLIENT_TIMEOUT_S - (time.perf_counter() - t0)
            status, payload, keep = await asyncio.wait_for(answer(reader), left)
        except Exception as exc:  # noqa: BLE001 - a client timeout or a refused connection: counted
            if conn is not None:
                conn[1].close()
                open_connections -= 1
            out.append([t0 - start, None, 0, type(exc).__name__, t0 - start - due])
            return
        if keep:
            idle.append((reader, writer, time.perf_counter()))
        else:
            writer.close()
            open_connections -= 1
        code = None if status == 200 else json.loads(payload).get("error", {}).get("code")
        out.append([t0 - start, time.perf_counter() - t0, status, code, t0 - start - due])

    tasks, i = [], 0
    while (now := time.perf_counter() - start) < seconds:
        while i <= now * rate:  # request i is due at i / rate
            tasks.append(asyncio.create_task(one(i, i / rate)))
            i += 1
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    for _, writer, _ in idle:
        writer.close()
    return out


def run_stream(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    bodies = [b.encode() for b in spec["bodies"]]
    import uvloop  # the gateway's own loop: the cheapest sender on the same cores

    result = uvloop.run(stream(spec["url"], spec["route"], bodies, spec["rate"], spec["seconds"], spec.get("keys")))
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


def default_client_cpus() -> str:
    """The last CPU this process may use, when it may use several: the load generator's own ('' with one)."""
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[-1]) if len(cpus) > 1 and shutil.which("taskset") else ""


def cpu_list(text: str) -> set[int]:
    """CPUs from taskset's list form (``1``, ``0,2``, ``2-3``)."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def start_stream(
    work: Path,
    name: str,
    url: str,
    route: str,
    bodies: list[bytes],
    rate: float,
    seconds: float,
    keys: dict[str, str] | None = None,
    cpus: str | None = None,
) -> tuple[subprocess.Popen, Path]:
    spec = work / f"{name}.json"
    out = work / f"{name}.out.json"
    spec.write_text(
        json.dumps(
            {
                "url": url,
                "route": route,
                "bodies": [b.decode() for b in bodies],
                "rate": rate,
                "seconds": seconds,
                "out": str(out),
                "keys": keys or {},
            }
        )
    )
    spec.chmod(0o600)  # (API keys)
    pin = ["taskset", "-c", cpus] if cpus else []  # the load generator on CPUs of its own (a remote client's)
    return subprocess.Popen([*pin, sys.executable, "-m", "gpu_runtime.overload_load", str(spec)]), out


if __name__ == "__main__":
    sys.exit(run_stream(sys.argv[1]))
