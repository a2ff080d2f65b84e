"""The gateway's worker processes: ``python -m gpu_runtime.serve --workers N`` (default: one per core) runs Triton and
its supervisor in the serving process and the gateway in N worker processes, each with its own event loop, on one
listening port: each worker binds it with ``SO_REUSEPORT`` and the kernel spreads new connections over them.

``WorkerPool`` is the serving process's side: it starts the workers (the same command with ``--worker-index``),
waits until each has written ``w<i>.up``, keeps the runtime's state in ``runtime.json`` for them, starts a worker
again when one exits, and stops them all. What the workers share and what stays each one's own:
gpu_runtime/gateway/shared.py.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpu_runtime.gateway.shared import RuntimeStatusWriter

START_TIMEOUT_S = 180.0
RESTART_BACKOFF_S = 1.0


def reuseport_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening socket that the other workers bind too (SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def port_is_free(host: str, port: int) -> bool:
    """Nobody listens there (a plain bind succeeds): checked before the workers share the port, so that a gateway
    left running by an earlier run can never share its traffic."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _die_with_parent() -> None:
    """In a worker before exec: the kernel sends it SIGTERM when the serving process dies, even by SIGKILL."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class WorkerPool:
    def __init__(self, argv: list[str], count: int, directory: Path, status_writer: RuntimeStatusWriter,
                 log: Callable[[str], None]):  # fmt: skip
        self.argv, self.count, self.directory, self.log = argv, count, directory, log
        self.status_writer = status_writer
        self.procs: dict[int, subprocess.Popen] = {}
        self.restarts = 0
        self._stopping = False
        self._restart_at: dict[int, float] = {}

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("w*.up"):
            stale.unlink()
        self.status_writer.write_if_changed()
        for index in range(self.count):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        (self.directory / f"w{index}.up").unlink(missing_ok=True)
        self.procs[index] = subprocess.Popen(
            [sys.executable, "-m", "gpu_runtime.serve", *self.argv, "--worker-index", str(index)],
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, before exec
        )

    def wait_up(self) -> None:
        """Until every worker listens; a worker that exits first is an error naming it."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all((self.directory / f"w{i}.up").exists() for i in range(self.count)):
            for index, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"gateway worker {index} exited with {proc.returncode} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway workers did not start within {START_TIMEOUT_S:g} s")
            self.status_writer.write_if_changed()
            time.sleep(0.05)

    def tend(self) -> None:
        """From the serving process's loop: the runtime's state out to the workers; a worker that exited started
        again (after ``RESTART_BACKOFF_S``)."""
        self.status_writer.write_if_changed()
        if self._stopping:
            return
        now = time.monotonic()
        for index, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            due = self._restart_at.setdefault(index, now + RESTART_BACKOFF_S)
            if now >= due:
                self._restart_at.pop(index)
                self.restarts += 1
                self.log(f"keel serve: gateway worker {index} exited ({proc.returncode}); starting it again")
                self._spawn(index)

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]


def default_workers() -> int:
    """``$KEEL_GATEWAY_WORKERS``, else one per core. Measured on 2 cores (BENCHMARKS.md, the overload drill): one
    worker could not even refuse an L2 flood of 3,700 requests/s (its clients timed out in the listen queue), two
    refused all of it with structured answers — at a cost to L1's latency under the flood (Triton's CPU)."""
    return int(os.environ.get("KEEL_GATEWAY_WORKERS") or os.cpu_count() or 1)


def worker_argv(args, refs: list[str], port: int, triton_url: str) -> list[str]:
    """The command line of the gateway's workers (``--worker-index`` added per worker)."""
    argv = ["--gateway-port", str(port), "--gateway-host", args.gateway_host, "--triton-url", triton_url,
            "--max-body-bytes", str(args.max_body_bytes), "--header-timeout-s", str(args.header_timeout_s),
            "--body-timeout-s", str(args.body_timeout_s), "--max-connections", str(args.max_connections),
            "--keepalive-s", str(args.keepalive_s)]  # fmt: skip
    for ref in refs:
        argv += ["--usecase", ref.strip()]
    if args.policy:
        argv += ["--policy", str(args.policy)]
    return argv


def run_worker(args, served, refs, home, layout, device: str, policy) -> int:
    """One gateway worker: the gateway on the shared port, the runtime's state read from the serving process."""
    from gpu_runtime.gateway.app import Gateway, WorkerShare
    from gpu_runtime.gateway.shared import SharedRuntimeStatus
    from gpu_runtime.serving_parts import gateway_configs, gateway_server

    index = args.worker_index
    directory = layout.root / "workers"
    first, also = gateway_configs(args, served, refs, home, layout, args.triton_url, device, compute=index == 0)
    runtime = SharedRuntimeStatus(directory / "runtime.json")
    share = WorkerShare(index, directory, args.edge_admin)
    gateway = Gateway(first, policy, runtime=runtime, also=also, worker=share)
    port = int(args.worker_ports.split(",")[index]) if args.worker_ports else args.gateway_port  # behind the edge
    sock = reuseport_socket("127.0.0.1" if args.worker_ports else args.gateway_host, port)
    uv = gateway_server(gateway, args, lambda: (directory / f"w{index}.up").write_text(str(os.getpid())))
    uv.run(sockets=[sock])
    return 0


def serve_with_workers(args, refs, port, server, supervisor, endpoints, admin_key, announced, policy, watchdog,
                       layout) -> int:  # fmt: skip
    """The serving process of a gateway of several workers: Triton, its supervisor and the worker pool."""
    from gpu_runtime.edge import EDGE_TOKEN_ENV
    from gpu_runtime.edge_follower import EdgeFollower
    from gpu_runtime.gateway.shared import RuntimeStatusWriter
    from gpu_runtime.serving_parts import endpoints_record, stop_runtime, write_endpoints
    from gpu_runtime.triton import free_port
    from keel.edge.envoy import LOWER_PER_HOST, EdgeLimits, parse_peers
    from keel.edge.flood import flood_cut_enabled
    from keel.home import KeelHome
    from keel.usecase import resolve

    if not port_is_free(args.gateway_host, port):
        print(f"keel serve: port {port} is in use: another gateway (or program) listens there", flush=True)
        server.stop()
        return 2
    directory = layout.root / "workers"
    writer = RuntimeStatusWriter(directory / "runtime.json", supervisor.status,
                                 lambda: server.proc.pid if server.proc is not None else None)  # fmt: skip
    argv, edge = worker_argv(args, refs, port, server.grpc_url), None
    if args.edge:  # Envoy on the port, each worker on an internal loopback port of its own; the token in their env
        ports, admin_port = [free_port() for _ in range(args.workers)], free_port()
        argv += ["--worker-ports", ",".join(map(str, ports)), "--edge-admin", f"http://127.0.0.1:{admin_port}"]
        os.environ[EDGE_TOKEN_ENV] = secrets.token_urlsafe(24)
        edge = EdgeFollower(
            layout.root / "edge", port, ports, [resolve(r.strip()).model.name for r in refs], KeelHome.from_env().policies,
            os.environ[EDGE_TOKEN_ENV], EdgeLimits(max_body_bytes=args.max_body_bytes, header_timeout_s=args.header_timeout_s,
            max_connections=args.max_connections, idle_timeout_s=max(75.0, args.keepalive_s),
            upstream_idle_s=max(0.5, args.keepalive_s - 1.0),
            lower_per_host=LOWER_PER_HOST if flood_cut_enabled() else args.max_connections), host=args.gateway_host,
            admin_port=admin_port, base=policy, peers=parse_peers(args.edge_peers or ""),
            priority_port=args.edge_l1_port or free_port(),
        )  # fmt: skip
    else:
        os.environ.pop(EDGE_TOKEN_ENV, None)  # no edge: a token left in the environment must not lock callers out
    log = lambda m: print(m, flush=True)  # noqa: E731
    pool = WorkerPool(argv, args.workers, directory, writer, log=log)
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    supervisor.start()
    try:
        pool.start()
        pool.wait_up()
        if edge is not None:
            edge.start(log)
        write_endpoints(
            endpoints,
            endpoints_record(
                args,
                server,
                announced,
                port,
                admin_key,
                policy,
                workers=pool.pids(),
                edge_admin=edge.edge.admin_url if edge else None,
                l1_port=edge.priority_port if edge else None,
                worker_ports=list(edge.workers) if edge else None,
            ),  # fmt: skip
        )
        print(f"keel serve: gateway on http://127.0.0.1:{port} in {args.workers} worker processes serving "
              f"{', '.join(r.strip() for r in refs)} (POST /v1/models/{{model}}/predict, /metrics, /readyz)",
              flush=True)  # fmt: skip
        while not stop["now"]:
            pool.tend()
            if edge is not None:
                edge.tend(log)
            time.sleep(0.05)
    finally:
        if edge is not None:
            edge.stop()
        pool.stop()
        stop_runtime(supervisor, endpoints, server, watchdog)
    return 0
