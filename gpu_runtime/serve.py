"""Run the model runtime: Triton (a child process) and the inference gateway (uvicorn, this process), on 127.0.0.1.

    .venv/bin/python -m gpu_runtime.serve [--gateway-port 8080] [--policy gateway.yaml]

State lives under ``$KEEL_HOME/serving/``: ``model_repository/`` (Triton's), ``routing/<model>.json`` (what the gateway
routes to; written by deployments), ``exposures/`` (the exposure log), ``triton/`` (binaries, log) and
``endpoints.json`` — where Triton and the gateway listen, written once both are up, removed on exit. Deployments
(the Dagster ``model_deployment`` asset, ``TritonResource``) find Triton through it. The model-repository API is
restricted to holders of ``$KEEL_TRITON_ADMIN_KEY``; when unset, one is generated and written into endpoints.json
(mode 0600) for deployments on this machine.

Triton is supervised (gpu_runtime.supervisor): when it dies it is restarted and what the routing table serves is
loaded again; on start, a tritonserver left behind by a killed earlier run is stopped first, and the routed versions
of an existing KEEL_HOME are loaded before the gateway reports ready.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from gpu_runtime.process import reap_orphan, serving_priority, start_watchdog
from gpu_runtime.repository import ModelRepository
from gpu_runtime.serving_parts import endpoints_record, gateway_configs, gateway_server, stop_runtime, write_endpoints
from gpu_runtime.supervisor import TritonSupervisor, restore_routed
from gpu_runtime.triton import ADMIN_KEY_ENV, TritonServer, free_port, reserve_port
from gpu_runtime.workers import default_workers, run_worker, serve_with_workers
from keel.home import KeelHome
from keel.signals import restore_default_signals


def main(argv: list[str] | None = None) -> int:
    restore_default_signals()  # stops on TERM whatever it inherited (keel/signals.py)
    parser = argparse.ArgumentParser(prog="python -m gpu_runtime.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway-port", type=int, default=int(os.environ.get("KEEL_GATEWAY_PORT", "8080")))
    parser.add_argument(
        "--gateway-host",
        default="127.0.0.1",
        help="address the gateway binds (default loopback; a container behind a Kubernetes Service needs 0.0.0.0)",
    )
    parser.add_argument("--triton-grpc-port", type=int, default=0, help="default: a free port")
    parser.add_argument(
        "--advertise-host",
        default=os.environ.get("KEEL_ADVERTISE_HOST") or None,
        help="the address other machines reach this runtime at ($KEEL_ADVERTISE_HOST; Kubernetes: the pod's IP). "
        "Given, Triton's gRPC port binds all interfaces (its model-repository API still needs the admin key) and "
        "endpoints.json announces this host instead of 127.0.0.1",
    )
    parser.add_argument("--policy", type=Path, help="gateway policy YAML (default: built-in defaults)")
    parser.add_argument(
        "--usecase",
        action="append",
        help="a use case whose model the gateway serves: an installed name, or the module that declares one "
        "(repeat for several; $KEEL_USECASES, comma-separated; default: every installed use case)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(os.environ.get("KEEL_GATEWAY_MAX_BODY_BYTES", str(1 << 20))),
        help="largest request body the gateway reads; larger ones are answered 413 (default 1 MiB)",
    )
    # The server's bounds (gpu_runtime/gateway/server.py, docs/serving.md "Limits"): flag, type, environment, default
    for flag, kind, env, default, what in (
        ("--header-timeout-s", float, "KEEL_GATEWAY_HEADER_TIMEOUT_S", "10",
         "a request's headers must arrive within this (else 408 and the connection closes)"),
        ("--body-timeout-s", float, "KEEL_GATEWAY_BODY_TIMEOUT_S", "10",
         "a request's body must arrive within this after its headers (else 408, connection closed)"),
        ("--max-connections", int, "KEEL_GATEWAY_MAX_CONNECTIONS", "1024",
         "open connections the gateway holds at once; one more is answered 503 and closed"),
        ("--keepalive-s", int, "KEEL_GATEWAY_KEEPALIVE_S", "5", "an idle keep-alive connection is closed after this"),
    ):  # fmt: skip
        parser.add_argument(flag, type=kind, default=kind(os.environ.get(env, default)),
                            help=f"{what} (${env}; default {default})")  # fmt: skip
    parser.add_argument(
        "--workers", type=int, default=default_workers(),
        help="gateway worker processes sharing the port (SO_REUSEPORT; $KEEL_GATEWAY_WORKERS; default one per core)",
    )  # fmt: skip
    parser.add_argument(
        "--edge", action="store_true", default=os.environ.get("KEEL_EDGE") == "1",
        help="Envoy in front of the workers on the gateway's port, the workers on internal loopback ports: tenants "
        "authenticate with API keys (keel tenant; docs/serving.md \"The edge\"; $KEEL_EDGE=1)",
    )  # fmt: skip
    parser.add_argument(
        "--edge-peers", default=os.environ.get("KEEL_EDGE_PEERS", ""),
        help="other replicas' edges, ip:port,… ($KEEL_EDGE_PEERS): behind this replica's workers, they take its "
        "traffic as its workers fail (outlier detection over the replicas)",
    )  # fmt: skip
    parser.add_argument(
        "--edge-l1-port",
        type=int,
        default=int(os.environ.get("KEEL_EDGE_L1_PORT", "0")),
        help="L1's own door at the edge: a listener for the L1 tier's requests alone, with connections of its own "
        "beside the cap the other tiers share ($KEEL_EDGE_L1_PORT; default a free port, named in endpoints.json as edge_l1)",
    )
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # a worker's own command line
    parser.add_argument("--worker-ports", help=argparse.SUPPRESS)  # behind the edge: each worker's own port
    parser.add_argument("--edge-admin", help=argparse.SUPPRESS)  # behind the edge: Envoy's admin (its stats)
    parser.add_argument("--triton-url", help=argparse.SUPPRESS)  # a worker's: where the serving process's Triton is
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    from keel.edge.envoy import parse_peers

    try:
        parse_peers(args.edge_peers)
    except ValueError as exc:
        parser.error(str(exc))
    for name in ("header_timeout_s", "body_timeout_s", "max_connections", "keepalive_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")

    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.max_connections + 512  # the connections, Triton's channels, log and store files
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))

    from gpu_runtime.gateway.app import Gateway
    from keel.policies.gateway import GatewayPolicy
    from keel.usecase import UseCaseError, installed, resolve

    listed = os.environ.get("KEEL_USECASES") or os.environ.get("KEEL_USECASE") or ""  # scripts/up's, or the older
    refs = args.usecase or [r for r in listed.split(",") if r.strip()]
    try:
        served = [resolve(r.strip()) for r in refs] if refs else list(installed().values())
    except UseCaseError as exc:
        parser.error(str(exc))
    if not served:
        parser.error("no use case is installed and none was named (--usecase)")
    refs = refs or [uc.name for uc in served]

    device = os.environ.get("KEEL_RUNTIME_DEVICE", "cpu")
    if device not in ("cpu", "gpu"):
        parser.error(f"KEEL_RUNTIME_DEVICE must be cpu or gpu (which compute price applies), got {device!r}")
    home = KeelHome.from_env()
    layout = home.replica(os.environ.get("KEEL_REPLICA"))  # serving/, or replicas/<name>/ of several runtimes
    layout.root.mkdir(parents=True, exist_ok=True)
    policy = GatewayPolicy.load(args.policy) if args.policy else GatewayPolicy()
    if args.worker_index is None:  # (a worker inherits the serving process's priority)
        try:
            print(f"keel serve: {serving_priority()}", flush=True)
        except ValueError as exc:
            parser.error(str(exc))
    if args.worker_index is not None:  # one of the gateway's worker processes (gpu_runtime/workers.py)
        return run_worker(args, served, refs, home, layout, device, policy)
    endpoints = layout.endpoints
    endpoints.unlink(missing_ok=True)  # a stale file from a run that crashed must not point deployments elsewhere
    admin_key = os.environ.get(ADMIN_KEY_ENV) or secrets.token_hex(16)
    for given in (args.gateway_port, args.triton_grpc_port):
        if given:
            reserve_port(given)  # not bound until Triton is up: Triton's own ports must not draw it
    server = TritonServer(
        layout.model_repository,
        layout.triton_dir,
        grpc_port=args.triton_grpc_port or None,
        admin_key=admin_key,
        grpc_address="0.0.0.0" if args.advertise_host else "127.0.0.1",
    )
    announced = args.advertise_host or "127.0.0.1"  # where deployments and clients of this replica connect
    orphan = reap_orphan(layout.triton_dir)
    if orphan:
        print(
            f"keel serve: stopped a tritonserver left running by an earlier run (process group {orphan})", flush=True
        )
    watchdog = start_watchdog(layout.triton_dir)  # stops Triton and its stubs if this process is killed
    print(f"keel serve: starting Triton (log: {server.log_path})", flush=True)
    server.start()
    print(f"keel serve: Triton live — gRPC {server.grpc_url}, HTTP {server.http_url}", flush=True)
    if not server.admin_key_hidden:
        print("keel serve: WARNING: could not hide the admin key from tritonserver's command line", flush=True)
    control = server.client()
    try:
        restored = restore_routed(control, ModelRepository(layout.model_repository), layout.routing_dir)
    finally:
        control.close()
    if restored:
        print(f"keel serve: loaded the routed versions {restored} again ({layout.routing_dir})", flush=True)
    supervisor = TritonSupervisor(
        server, layout.routing_dir, log=lambda m: print(m, flush=True), incidents=home.incidents, clock=home.clock
    )
    first, also = gateway_configs(args, served, refs, home, layout, server.grpc_url, device)
    port = args.gateway_port or free_port()
    if args.workers > 1 or args.edge:
        return serve_with_workers(args, refs, port, server, supervisor, endpoints, admin_key, announced, policy,
                                  watchdog, layout)  # fmt: skip
    gateway = Gateway(first, policy, runtime=supervisor.status, also=also)

    def on_up() -> None:
        write_endpoints(endpoints, endpoints_record(args, server, announced, port, admin_key, policy))
        print(f"keel serve: gateway on http://127.0.0.1:{port} serving {', '.join(gateway.served_models())} "
              "(POST /v1/models/{model}/predict, /metrics, /readyz)", flush=True)  # fmt: skip

    uv = gateway_server(gateway, args, on_up, host=args.gateway_host, port=port)
    supervisor.start()
    try:
        uv.run()
    finally:
        stop_runtime(supervisor, endpoints, server, watchdog)
    return 0


if __name__ == "__main__":
    sys.exit(main())
