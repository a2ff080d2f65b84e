"""L1 beside an L2 flood, through the edge (issue 61, 3b): does the highest tier keep its capacity when the lowest
tier's tenants flood the same Envoy?

The real model runtime (``python -m gpu_runtime.serve --edge``: Triton, the gateway's workers, Envoy with keel's edge
filter) in a throwaway KEEL_HOME serves hotels' rate model (tier L1) and flights' delay model (tier L2), each trained
here on its own real data. The overload drill's load (gpu_runtime/overload_drill.py, the same code ``keel drill
overload`` runs) then sends, open loop with a 5 s client timeout, each request with its tenant's API key:

- the probe: hotels' quotes at 40 req/s (tenant ``drill-probe``) for the whole run;
- the flood: flights' requests at ``--flood-rps`` (2,500) spread over 64 tenants for ``--flood-s`` (10 s), after a
  5 s baseline; then 20 s of recovery.

The load generator runs on CPU ``--client-cpus`` (the last one) and the runtime on the others — as a remote client
would leave the server its cores (``--server-cpus all``: the runtime on every CPU, the generator's too). No busy
processes (the drill's starve phase is off): the flood is the fault.

Two ways, each on a fresh runtime in the same run: the edge's breakers with the policy's places only
(``KEEL_EDGE_FLOOD_CUT=0``, what the edge did before issue 61) and with the flood cut (keel/edge/flood.py: one
lower-tier request in flight while they flood).

Reported: L1 answered within its tier's deadline (share, and by second of the flood), L1 client timeouts and connections reset, the flood's
answers by status and code (structured refusals: 429/503), how long after the flood L1 was back (≥ 99 % answered,
p99 ≤ 2× the baseline's), connections left in CLOSE-WAIT.

    .venv/bin/python bench/edge_flood.py [--flood-rps 2500] [--flood-s 10] [--client-cpus 1] [--server-cpus all]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiers import BASE_POLICY, load_bench_serving, setup_hotels  # noqa: E402

from gpu_runtime.triton import TritonControl, free_port  # noqa: E402
from keel.deploy.routing import Route, Target  # noqa: E402
from keel.usecase import from_module  # noqa: E402
from resources.triton import TritonResource  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def start_runtime(home: Path, port: int, server_cpus: str, cut: bool) -> subprocess.Popen:
    env = os.environ | {
        "KEEL_HOME": str(home),
        "KEEL_USECASES": "flights,usecases.hotels",
        "KEEL_EDGE": "1",
        "KEEL_EDGE_FLOOD_CUT": "1" if cut else "0",
    }
    env.pop("KEEL_TRITON_ADMIN_KEY", None)
    return subprocess.Popen(
        [
            "taskset",
            "-c",
            server_cpus,
            sys.executable,
            "-m",
            "gpu_runtime.serve",
            "--gateway-port",
            str(port),
            "--policy",
            str(home / "policy.yaml"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(home / "serve.log").open("w"),
        start_new_session=True,
    )


def deploy_both(home: Path, flights_text: str, hotels_text: str) -> None:
    endpoints = json.loads((home / "serving" / "endpoints.json").read_text())
    control = TritonControl(endpoints["triton_grpc"], endpoints["admin_key"])
    resource = TritonResource(serving_dir=str(home / "serving"), drain_s=0.3)
    for uc, text in ((from_module("usecases.flights"), flights_text), (from_module("usecases.hotels"), hotels_text)):
        sha = hashlib.sha256(text.encode()).hexdigest()
        target = Target(Route("champion", 1, sha, 1.0, f"rel-bench-{uc.name}"), text)
        resource.deployer(uc.model.name, len(uc.features.names), control=control).deploy(uc.model.name, [target])


EDGE_COUNTERS = (  # what the edge did with the load: connections, requests, refusals by its own breakers
    "http.keel_edge.downstream_cx_total",
    "http.keel_edge.downstream_rq_total",
    "http.keel_edge.downstream_rq_2xx",
    "http.keel_edge.downstream_rq_4xx",
    "http.keel_edge.downstream_rq_5xx",
    "cluster.keel_gateway.upstream_rq_total",
    "cluster.keel_gateway.upstream_rq_pending_overflow",
    "cluster.keel_gateway.upstream_rq_timeout",
    "cluster.keel_gateway.upstream_cx_total",
    "listener.127.0.0.1_{port}.downstream_cx_overflow",
    "overload.envoy.resource_monitors.global_downstream_max_connections.pressure",
    "server.overload.global_downstream_max_connections_reached",
    "connection_limit.keel_edge.limited_connections",  # the main listener's cap (keel/edge/door.py)
    "connection_limit.keel_edge_l1.limited_connections",  # L1's door's
)


def edge_counters(home: Path) -> dict[str, int]:
    """The edge's own counters (Envoy's admin /stats, on loopback) after the run."""
    import httpx

    endpoints = json.loads((home / "serving" / "endpoints.json").read_text())
    text = httpx.get(f"{endpoints['edge_admin']}/stats", timeout=10).text
    port = endpoints["gateway"].rsplit(":", 1)[1]
    wanted = {name.format(port=port) for name in EDGE_COUNTERS}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if name in wanted or "downstream_global_cx_overflow" in name or name.endswith("rq_overflow"):
            out[name] = int(float(value)) if value.replace(".", "").isdigit() else value
    return out


def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/edge_flood: {what} within {timeout_s:g} s — it did not")
        time.sleep(0.2)


def one_run(home: Path, server: list[int], args, cut: bool, texts: tuple[str, str]) -> dict:
    """A fresh runtime on ``home`` (the edge's flood cut on or off), both models deployed, the drill's load."""
    from gpu_runtime.overload_drill import drill, drill_keys

    (home / "serving" / "endpoints.json").unlink(missing_ok=True)
    port = free_port()
    serve = start_runtime(home, port, ",".join(map(str, server)), cut)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        endpoints = home / "serving" / "endpoints.json"
        wait_until(lambda: endpoints.exists() or serve.poll() is not None, 180, "the runtime starts")
        if serve.poll() is not None:
            raise SystemExit(
                f"bench/edge_flood: gpu_runtime.serve exited: {(home / 'serve.log').read_text()[-2000:]}"
            )
        deploy_both(home, *texts)
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, 120, "the runtime is ready")
        keys = drill_keys(url)
        door = json.loads(endpoints.read_text()).get("edge_l1") if args.l1_door else None
        report = drill(
            url,
            port,
            5.0,
            0.0,
            args.flood_s,
            20.0,
            keys=keys,
            flood_rps=args.flood_rps,
            client_cpus=args.client_cpus,
            probe_url=f"http://{door}" if door else None,
        )
        report["edge_counters"] = edge_counters(home)
        return report
    finally:
        os.killpg(serve.pid, 15)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, 9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood-rps", type=float, default=2500.0)
    parser.add_argument("--flood-s", type=float, default=10.0)
    parser.add_argument("--client-cpus", default=str(max(os.sched_getaffinity(0))))
    parser.add_argument("--server-cpus", help="the runtime's CPUs (default: every other one; 'all': not pinned)")
    parser.add_argument("--out", type=Path, help="write the drills' reports here (JSON)")
    parser.add_argument(
        "--l1-door",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="L1 probed at its own door (keel/edge/door.py; default), or at the main port with the flood",
    )
    args = parser.parse_args()
    from gpu_runtime.overload_drill import cpu_list

    client = cpu_list(args.client_cpus)
    every = sorted(os.sched_getaffinity(0))
    if args.server_cpus == "all":
        server = every
    else:
        server = sorted(cpu_list(args.server_cpus) if args.server_cpus else set(every) - client) or every
    home = Path(tempfile.mkdtemp(prefix="keel-bench-edge-flood-"))
    print(f"bench/edge_flood: setting up in {home} (training both models on their real data) …", flush=True)
    texts, _ = load_bench_serving().setup(home)
    hotels_text, _ = setup_hotels(home, from_module("usecases.hotels"))
    (home / "policy.yaml").write_text(json.dumps(BASE_POLICY))
    os.environ |= {"KEEL_HOME": str(home), "KEEL_USECASES": "flights,usecases.hotels"}
    print(f"bench/edge_flood: runtime on CPU {server}, load generator on CPU {sorted(client)}", flush=True)
    reports = {}
    for cut in (False, True):
        way = "the flood cut" if cut else "the policy's places only (KEEL_EDGE_FLOOD_CUT=0)"
        print(f"bench/edge_flood: {way}", flush=True)
        reports[way] = one_run(home, server, args, cut, (texts[0], hotels_text))
    if args.out:
        args.out.write_text(json.dumps(reports, indent=2))
    for way, report in reports.items():
        print(f"\n## {way}\n")
        print(summary(report, args.flood_rps, args.flood_s))
    return 0


def summary(report: dict, flood_rps: float, flood_s: float) -> str:
    probe = report["probe"]
    lines = [
        f"L1 probe ({report['protected_model']}, 40 req/s) beside an L2 flood ({report['flooded_model']}, "
        f"{flood_rps:g} req/s offered over 64 tenants for {flood_s:g} s, {report['flood_offered_rps']:g}/s sent)",
        "",
        "| phase | L1 sent | answered 200 | within deadline | client timeouts / transport failures | refusals | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for phase in ("baseline", "flood", "recovery"):
        p = probe[phase]
        lines.append(
            f"| {phase} | {p['sent']} | {p['answered']} | {p['answered_in_time_share']:.2%} | "
            f"{p['client_timeouts']} {p['transport_failures']} | {p['refusals']} | {p['p50_ms']} | {p['p99_ms']} |"
        )
    flood = report["flood"]
    lines += [
        "",
        f"flood: answered {report['flood_answered_rps']:g}/s; refusals {flood['refusals']}; client timeouts/"
        f"transport failures {flood['client_timeouts']} {flood['transport_failures']}",
        f"L1 back (≥ 99 % answered, p99 ≤ 2× baseline) {report['recovered_after_s']} s after the flood; "
        f"CLOSE-WAIT left: {report['close_wait']}; L1 within its deadline by second of the flood: "
        f"{report['probe_in_time_by_second']}",
        "",
        "the edge's counters: " + json.dumps(report.get("edge_counters", {}), indent=1),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
