"""The Kubernetes deployment profile: Dagster runs as Kubernetes Jobs (dagster-k8s' K8sRunLauncher) on Postgres run
storage, the model runtime (Triton + gateway) as its own StatefulSet with GPU requests, and values for the official
Dagster Helm chart — all rendered from one profile (YAML).

Beyond one machine, every store that several processes write is a shared server: the Dagster instance and keel's
control plane (policies, ledger, registry metadata, incidents) on Postgres, the online store on Redis — their
connection settings come from secrets (``control_plane_secret``, ``online_store_secret``), never from the profile.
No SQLite file lies on the shared volume: it holds only files with one writer each (asset Parquet files written
atomically by one run, content-addressed model files, and each runtime replica's own ``replicas/<pod>/``). Each
replica is a StatefulSet pod that names itself (``KEEL_REPLICA`` = the pod's name) and announces the address other
pods reach it at (``KEEL_ADVERTISE_HOST`` = the pod's IP) in its own ``endpoints.json``; a deployment run loads a
release into every replica, one after another (``keel.deploy.routing.ReplicatedDeployer``).

No cluster runs here: ``run_job`` builds the Job exactly as dagster-k8s builds it for a run
(``dagster_k8s.job.construct_dagster_k8s_job`` with the launcher's job config), ``runtime_manifests`` the Deployment
and Service, ``instance_yaml`` the dagster.yaml the chart mounts; tests assert them (image, resources, env from
secrets, GPU requests) and validate dagster.yaml against Dagster's own config schema. docs/kubernetes.md walks
through a deployment.

    keel k8s render --profile keel/deploy/profile.yaml --out deploy/    # writes the manifests and values
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from keel.errors import KeelError
from keel.names import validate_name
from keel.storage import read_yaml

PROFILE = Path(__file__).resolve().parent / "profile.yaml"
KEEL_HOME = "/var/lib/keel"  # the shared volume (ReadWriteMany): asset storage, model files, replicas' own logs
DOCKERFILES = Path(__file__).resolve().parent.parent.parent / "docker"


class ProfileError(KeelError):
    """The deployment profile is malformed; the message names the field."""


@dataclass(frozen=True)
class K8sProfile:
    namespace: str = "keel"
    image: str = "ghcr.io/keel-platform/keel:0.1.0"  # Dagster code, .venv
    runtime_image: str = "ghcr.io/keel-platform/keel-runtime:0.1.0"  # Triton + native backend + gateway
    image_pull_policy: str = "IfNotPresent"
    service_account: str = "keel"
    secrets: str = "keel-secrets"  # KEEL_TRITON_ADMIN_KEY and other secrets, as environment variables
    postgres_password_secret: str = "keel-postgresql"  # key postgresql-password (the chart's convention)
    postgres_host: str = "keel-postgresql"
    postgres_db: str = "dagster"
    postgres_user: str = "dagster"
    keel_home_claim: str = "keel-home"
    # KEEL_CONTROL_PLANE (postgresql://…?schema=keel) and KEEL_CHAIN_KEY; KEEL_ONLINE_STORE (redis://…) and
    # KEEL_REDIS_PASSWORD — secrets whose keys are these variables' names (docs/kubernetes.md creates them)
    control_plane_secret: str = "keel-control-plane"
    online_store_secret: str = "keel-online-store"
    image_dockerfile: str = "docker/platform.Dockerfile"  # how ``image`` is built (from the repository root)
    runtime_dockerfile: str = "docker/runtime.Dockerfile"  # how ``runtime_image`` is built
    run_resources: dict[str, Any] = field(
        default_factory=lambda: {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}
    )
    runtime_replicas: int = 2
    gpus_per_runtime: int = 1
    runtime_resources: dict[str, Any] = field(
        default_factory=lambda: {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}}
    )
    gpu_node_selector: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    # The business label that buys resources: the runtime's service tier (the highest it serves; None: the highest
    # the installed use cases declare) gives its pods a priority class (keel-l1 preempts keel-l2 …) and a QoS
    # class: L1 Guaranteed (requests = limits), L2 Burstable (the profile's), L3 BestEffort (none).
    runtime_tier: str | None = None
    tier_priorities: dict[str, int] = field(default_factory=lambda: {"L1": 1_000_000, "L2": 100_000, "L3": 10_000})


TIER_QOS = {"L1": "Guaranteed", "L2": "Burstable", "L3": "BestEffort"}


def runtime_tier(profile: K8sProfile) -> str:
    """The runtime's tier: the profile's, else the highest the installed use cases' models are declared in."""
    from keel.usecase import installed

    return profile.runtime_tier or min((uc.serving.tier for uc in installed().values()), default="L2")


def tiered_resources(profile: K8sProfile, tier: str) -> dict[str, Any]:
    """The runtime container's resources for its tier's QoS class; GPUs as the profile asks, requested = limited."""
    if TIER_QOS[tier] == "BestEffort":
        if profile.gpus_per_runtime:
            raise ProfileError(
                "runtime_tier L3 is BestEffort (no requests, no limits): a runtime with GPUs cannot be"
            )
        return {}
    resources = {k: dict(v) for k, v in profile.runtime_resources.items()}
    if TIER_QOS[tier] == "Guaranteed":  # every resource requested at its limit
        resources = {"requests": dict(resources["limits"]), "limits": dict(resources["limits"])}
    for part in ("requests", "limits") if profile.gpus_per_runtime else ():
        resources.setdefault(part, {})["nvidia.com/gpu"] = str(profile.gpus_per_runtime)
    return resources


def priority_classes(profile: K8sProfile) -> list[dict[str, Any]]:
    """A PriorityClass per tier (keel-l1 …): a higher tier's pods are scheduled first and may preempt a lower's."""
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": f"keel-{t.lower()}"},
             "value": v, "preemptionPolicy": "PreemptLowerPriority", "description": f"keel tier {t} ({TIER_QOS[t]})"}
            for t, v in sorted(profile.tier_priorities.items())]  # fmt: skip


def load_profile(path: str | Path = PROFILE) -> K8sProfile:
    path = Path(path)
    raw = read_yaml(path, ProfileError, "profile") or {}
    known = {f.name for f in fields(K8sProfile)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProfileError(f"{path}: field '{unknown[0]}' is unknown (known: {', '.join(sorted(known))})")
    for key in (
        "namespace", "service_account", "secrets", "postgres_password_secret", "keel_home_claim",
        "control_plane_secret", "online_store_secret",
    ):  # fmt: skip
        if key in raw:
            try:
                validate_name(str(raw[key]), what=key)
            except KeelError as exc:
                raise ProfileError(f"{path}: field '{key}': {exc}") from None
    if raw.get("runtime_tier") is not None and raw["runtime_tier"] not in TIER_QOS:
        raise ProfileError(
            f"{path}: field 'runtime_tier' is one of {', '.join(TIER_QOS)}, got {raw['runtime_tier']!r}"
        )
    for key in ("runtime_replicas", "gpus_per_runtime"):
        if key in raw and (not isinstance(raw[key], int) or raw[key] < 0):
            raise ProfileError(f"{path}: field '{key}' must be a non-negative integer")
    return K8sProfile(**raw)


def _home_volume(profile: K8sProfile) -> dict[str, Any]:
    """The shared KEEL_HOME volume (a ReadWriteMany claim), as pod specs and the chart spell it."""
    return {"name": "keel-home", "persistentVolumeClaim": {"claimName": profile.keel_home_claim}}


def _home_mount() -> dict[str, Any]:
    return {"name": "keel-home", "mountPath": KEEL_HOME}  # a fresh dict each time: no YAML anchors when rendered


def _kind(profile: K8sProfile) -> str:
    """Triton instance kind the deployment runs ask for: GPU instances when the runtime has GPUs."""
    return "KIND_GPU" if profile.gpus_per_runtime else "KIND_CPU"


def _env(profile: K8sProfile) -> list[dict[str, Any]]:
    return [
        {"name": "KEEL_HOME", "value": KEEL_HOME},
        {"name": "DAGSTER_HOME", "value": "/opt/dagster/dagster_home"},
    ]


def _secrets(profile: K8sProfile) -> list[str]:
    """The secrets every keel pod reads its environment from: keel's own, the control plane's, the online store's."""
    return [profile.secrets, profile.control_plane_secret, profile.online_store_secret]


def instance_yaml(profile: K8sProfile) -> dict[str, Any]:
    """dagster.yaml: each run a Kubernetes Job; runs, events and schedules in Postgres (password from a secret)."""
    return {
        "run_launcher": {
            "module": "dagster_k8s",
            "class": "K8sRunLauncher",
            "config": {
                "job_namespace": profile.namespace,
                "job_image": profile.image,
                "image_pull_policy": profile.image_pull_policy,
                "service_account_name": profile.service_account,
                "instance_config_map": "keel-dagster-instance",
                "postgres_password_secret": profile.postgres_password_secret,
                "dagster_home": "/opt/dagster/dagster_home",
                "load_incluster_config": True,
                "env_secrets": _secrets(profile),
                "env_vars": [f"KEEL_HOME={KEEL_HOME}", f"KEEL_INSTANCE_KIND={_kind(profile)}"],
                "resources": profile.run_resources,
                "volume_mounts": [_home_mount()],
                "volumes": [_home_volume(profile)],
                "labels": {"app.kubernetes.io/part-of": "keel"},
            },
        },
        "storage": {
            "postgres": {
                "postgres_db": {
                    "hostname": profile.postgres_host,
                    "db_name": profile.postgres_db,
                    "username": profile.postgres_user,
                    "password": {"env": "DAGSTER_PG_PASSWORD"},
                    "port": 5432,
                }
            }
        },
        "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"},
        "telemetry": {"enabled": False},
    }


def run_job(profile: K8sProfile, run_id: str = "00000000-0000-0000-0000-000000000000", job: str = "keel_incidents"):
    """The Kubernetes Job that K8sRunLauncher submits for a run, built by dagster-k8s itself."""
    from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_job_name_from_run_id

    config = instance_yaml(profile)["run_launcher"]["config"]
    job_config = DagsterK8sJobConfig(
        job_image=config["job_image"],
        dagster_home=config["dagster_home"],
        image_pull_policy=config["image_pull_policy"],
        service_account_name=config["service_account_name"],
        instance_config_map=config["instance_config_map"],
        postgres_password_secret=config["postgres_password_secret"],
        env_secrets=config["env_secrets"],
        env_vars=config["env_vars"],
        resources=config["resources"],
        volume_mounts=config["volume_mounts"],
        volumes=config["volumes"],
        labels=config["labels"],
    )
    args = ["dagster", "api", "execute_run", f'{{"run_id": "{run_id}", "job": "{job}"}}']
    return construct_dagster_k8s_job(
        job_config,
        args=args,
        job_name=get_job_name_from_run_id(run_id),
        component="run_worker",
        labels={"dagster/job": job, "dagster/run-id": run_id},
    )


def runtime_manifests(profile: K8sProfile) -> list[dict[str, Any]]:
    """The model runtime (Triton + gateway, `python -m gpu_runtime.serve`) as a StatefulSet requesting GPUs — each
    replica a pod with a stable name, its own ``replicas/<pod>/`` directory and its own announced address — a
    headless Service that gives each replica's Triton a DNS name for deployment runs, and the gateway's Service
    (cluster-internal; the gateway is the only port it exposes)."""
    labels = {"app.kubernetes.io/name": "keel-model-runtime", "app.kubernetes.io/part-of": "keel"}
    tier = runtime_tier(profile)
    resources = tiered_resources(profile, tier)
    container = {
        "name": "model-runtime",
        "image": profile.runtime_image,
        "imagePullPolicy": profile.image_pull_policy,
        # the edge (Envoy: API keys, business labels, limits in C++) on 8080, the gateway's workers on loopback only
        "command": ["python", "-m", "gpu_runtime.serve", "--edge", "--gateway-host", "0.0.0.0", "--gateway-port",
                    "8080", "--triton-grpc-port", "8001"],
        "ports": [{"name": "gateway", "containerPort": 8080}, {"name": "triton-grpc", "containerPort": 8001}],
        "env": [
            *_env(profile),
            # which replica this pod is (its own serving directory), and where other pods reach its Triton
            {"name": "KEEL_REPLICA", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "KEEL_ADVERTISE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "KEEL_RUNTIME_DEVICE", "value": "gpu" if profile.gpus_per_runtime else "cpu"},
        ],
        "envFrom": [{"secretRef": {"name": n}} for n in _secrets(profile)],
        "resources": resources,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "gateway"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "gateway"}, "periodSeconds": 10},
        "volumeMounts": [_home_mount()],
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
    }  # fmt: skip
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "keel-model-runtime", "namespace": profile.namespace, "labels": labels},
        "spec": {
            "replicas": profile.runtime_replicas,
            "serviceName": "keel-model-runtime",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": profile.service_account,
                    "priorityClassName": f"keel-{tier.lower()}",
                    "nodeSelector": dict(profile.gpu_node_selector) if profile.gpus_per_runtime else {},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                    if profile.gpus_per_runtime
                    else [],
                    "containers": [container],
                    "volumes": [_home_volume(profile)],
                },
            },
        },
    }
    replicas = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "keel-model-runtime", "namespace": profile.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",  # headless: one DNS name per replica (keel-model-runtime-0.keel-model-runtime)
            "selector": labels,
            "ports": [{"name": "triton-grpc", "port": 8001, "targetPort": "triton-grpc"}],
        },
    }
    gateway = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "keel-gateway", "namespace": profile.namespace, "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "gateway", "port": 8080, "targetPort": "gateway"}],
        },
    }
    return [statefulset, replicas, gateway]


def helm_values(profile: K8sProfile) -> dict[str, Any]:
    """Values for the official Dagster chart (helm repo https://dagster-io.github.io/helm, chart dagster 1.13.27)."""
    repo, tag = profile.image.rsplit(":", 1)
    return {
        "global": {"serviceAccountName": profile.service_account},
        "dagsterWebserver": {"service": {"type": "ClusterIP"}},
        "dagster-user-deployments": {
            "enabled": True,
            "deployments": [
                {
                    "name": "keel",
                    "image": {"repository": repo, "tag": tag, "pullPolicy": profile.image_pull_policy},
                    "dagsterApiGrpcArgs": ["--python-file", "definitions.py"],
                    "port": 3030,
                    "envSecrets": [{"name": n} for n in _secrets(profile)],
                    "env": _env(profile),
                    "volumeMounts": [_home_mount()],
                    "volumes": [_home_volume(profile)],
                }
            ],
        },
        "runLauncher": {
            "type": "K8sRunLauncher",
            "config": {
                "k8sRunLauncher": {
                    "jobNamespace": profile.namespace,
                    "envSecrets": [{"name": n} for n in _secrets(profile)],
                    "envVars": [f"KEEL_HOME={KEEL_HOME}", f"KEEL_INSTANCE_KIND={_kind(profile)}"],
                    "resources": profile.run_resources,
                    "volumeMounts": [_home_mount()],
                    "volumes": [_home_volume(profile)],
                }
            },
        },
        "postgresql": {
            "enabled": True,
            "postgresqlHost": profile.postgres_host,
            "postgresqlDatabase": profile.postgres_db,
            "postgresqlUsername": profile.postgres_user,
        },
        "generatePostgresqlPasswordSecret": False,  # created beforehand: kubectl create secret … (docs/kubernetes.md)
        "dagsterDaemon": {"enabled": True, "runCoordinator": {"enabled": True, "type": "QueuedRunCoordinator"}},
    }


class _PlainDumper(yaml.SafeDumper):
    """No &anchors/*aliases for dicts used twice (labels in metadata and selectors): manifests read as written."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(profile: K8sProfile, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "dagster.yaml": instance_yaml(profile),
        "helm-values.yaml": helm_values(profile),
        "model-runtime.yaml": runtime_manifests(profile),
        "priority-classes.yaml": priority_classes(profile),
    }
    written = []
    for name, obj in files.items():
        path = out / name
        dump = yaml.dump_all if isinstance(obj, list) else yaml.dump
        text = dump(obj, Dumper=_PlainDumper, sort_keys=False)
        path.write_text(text)
        written.append(path)
    return written
