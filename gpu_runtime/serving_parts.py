"""What the serving process and the gateway's workers share (gpu_runtime/serve.py, gpu_runtime/workers.py): the
gateway's configuration per served model, its uvicorn server, and the runtime's ``endpoints.json`` — written when
it is up, removed when it stops."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path

from gpu_runtime.edge import EDGE_TOKEN_ENV


def write_endpoints(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)


def endpoints_record(
    args, server, announced: str, port: int, admin_key: str, policy, l1_port: int | None = None, **extra
) -> dict:
    """What endpoints.json says: where Triton and the gateway are reached (and L1's own door at the edge, when there
    is one: ``edge_l1``), the admin key, the policy served."""
    host = announced if args.gateway_host in ("0.0.0.0", "::") else args.gateway_host
    if l1_port is not None:
        extra["edge_l1"] = f"{host}:{l1_port}"
    return {
        "pid": os.getpid(), "triton_grpc": f"{announced}:{server.grpc_port}", "triton_http": server.http_url,
        "triton_metrics": f"127.0.0.1:{server.metrics_port}", "gateway": f"{host}:{port}", "admin_key": admin_key,
        "triton_version": server.info.triton_version if server.info else None, "policy": policy.to_dict(), **extra,
    }  # fmt: skip


def stop_runtime(supervisor, endpoints: Path, server, watchdog) -> None:
    """Triton's supervisor, Triton and its watchdog stopped; endpoints.json gone (nobody is to deploy here)."""
    supervisor.stop()
    endpoints.unlink(missing_ok=True)
    server.stop()
    if watchdog is not None:
        watchdog.kill()
        watchdog.wait()
    print("keel serve: stopped", flush=True)


def gateway_configs(args, served, refs, home, layout, triton_url: str, device: str, compute: bool = True):
    """The first served model's GatewayConfig and the others' (``also``). ``compute``: this process samples
    Triton's compute statistics and records overload incidents (one process of a gateway does: with workers,
    worker 0)."""
    from gpu_runtime.gateway.app import GatewayConfig
    from keel.features.backends import online_store_url

    first = GatewayConfig(
        triton_url=triton_url,
        routing_path=layout.routing_of(served[0].model.name),
        exposure_dir=layout.exposures,
        online_store_path=home.online_store_of(served[0].name),
        online_store_url=online_store_url(),  # KEEL_ONLINE_STORE (keel/features/backends.py)
        online_store_prefix=os.environ.get("KEEL_ONLINE_PREFIX") or "keel:online",
        policy_store_path=home.policies,
        usecase=refs[0].strip(),
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        clock_path=home.clock,
        compute_dir=layout.compute if compute else None,
        meter_interval_s=float(os.environ.get("KEEL_METER_INTERVAL_S", "5")),
        compute_device=device,
        incidents_path=home.incidents if compute else None,
        edge_token=os.environ.get(EDGE_TOKEN_ENV) or None,  # set by the serving process when the edge is in front
    )
    also = tuple(
        replace(first, usecase=ref.strip(), routing_path=layout.routing_of(uc.model.name),
                online_store_path=home.online_store_of(uc.name), compute_dir=None)
        for ref, uc in zip(refs[1:], served[1:], strict=True)
    )  # fmt: skip
    return first, also


def gateway_server(gateway, args, on_up, **bind):
    """The gateway's uvicorn server (bounded protocol, keep-alive): on start-up the start-up objects are frozen out of
    the garbage collector before the first request (collections walk only what requests allocate), then ``on_up``;
    TERM asks it to exit."""
    import uvicorn

    from gpu_runtime.gateway.collector import freeze_startup_objects
    from gpu_runtime.gateway.server import bounded_protocol

    config = uvicorn.Config(
        gateway, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=args.keepalive_s,
        http=bounded_protocol(gateway, args.header_timeout_s, args.max_connections), **bind,
    )  # fmt: skip
    uv = uvicorn.Server(config)
    original_startup = uv.startup

    async def startup(sockets=None):
        await original_startup(sockets=sockets)
        freeze_startup_objects()
        on_up()

    uv.startup = startup  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, lambda *_: setattr(uv, "should_exit", True))
    return uv
