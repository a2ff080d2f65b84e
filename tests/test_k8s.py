"""The Kubernetes profile: the specs dagster-k8s would submit, the model runtime's Deployment with GPU requests,
dagster.yaml validated against Dagster's own schema, the chart values — no cluster runs here, so these are built
with the real dagster-k8s code and asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keel.deploy.k8s import (
    KEEL_HOME,
    ProfileError,
    helm_values,
    instance_yaml,
    load_profile,
    run_job,
    runtime_manifests,
)
from tests import REPO


@pytest.fixture
def profile():
    return load_profile()


def test_a_run_is_a_kubernetes_job_with_the_image_resources_and_secrets(profile):
    job = run_job(profile, run_id="0f1e2d3c-aaaa-bbbb-cccc-000000000001").to_dict()
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == profile.image and container["image_pull_policy"] == "IfNotPresent"
    assert container["args"][:3] == ["dagster", "api", "execute_run"]
    assert {k: v for k, v in container["resources"].items() if v} == profile.run_resources
    # keel's secrets, and the shared stores' connection settings (KEEL_CONTROL_PLANE, KEEL_ONLINE_STORE, …)
    assert [e["secret_ref"]["name"] for e in container["env_from"] if e["secret_ref"]] == [
        "keel-secrets", "keel-control-plane", "keel-online-store",
    ]  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    pg = env["DAGSTER_PG_PASSWORD"]["value_from"]["secret_key_ref"]
    assert pg["name"] == "keel-postgresql" and pg["key"] == "postgresql-password"  # from a secret, never a value
    assert env["KEEL_HOME"]["value"] == KEEL_HOME and env["KEEL_INSTANCE_KIND"]["value"] == "KIND_GPU"
    assert pod["service_account_name"] == "keel"
    assert any(
        v["persistent_volume_claim"] and v["persistent_volume_claim"]["claim_name"] == "keel-home"
        for v in pod["volumes"]
    )
    assert job["metadata"]["labels"]["dagster/run-id"] == "0f1e2d3c-aaaa-bbbb-cccc-000000000001"


def test_the_model_runtime_requests_gpus_and_reads_secrets_from_the_environment(profile):
    deployment, replicas, service = runtime_manifests(profile)
    spec = deployment["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1" == c["resources"]["limits"]["nvidia.com/gpu"]
    assert c["envFrom"] == [
        {"secretRef": {"name": n}} for n in ("keel-secrets", "keel-control-plane", "keel-online-store")
    ]
    assert not any("KEY" in e["name"] or "PASSWORD" in e["name"] for e in c["env"])  # secrets only via secretRef
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and deployment["spec"]["replicas"] == 2
    assert service["spec"]["type"] == "ClusterIP"  # not exposed outside the cluster by default


def test_each_runtime_replica_is_its_own_pod_announcing_its_own_address_and_no_sqlite_is_shared(profile):
    """The faults of the old profile: one Deployment whose replicas overwrote one endpoints.json announcing a pod's
    own 127.0.0.1, and SQLite files on a ReadWriteMany volume. Now: a StatefulSet whose pods name themselves and
    announce their IP, a headless Service for their Tritons, the shared stores as servers from secrets."""
    statefulset, replicas, _ = runtime_manifests(profile)
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["serviceName"] == replicas["metadata"]["name"]
    assert replicas["spec"]["clusterIP"] == "None"
    [c] = statefulset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["KEEL_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # replicas/<pod>/
    assert env["KEEL_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert (
        c["command"][-2:] == ["--triton-grpc-port", "8001"]
        and {"containerPort": 8001, "name": "triton-grpc"} in c["ports"]
    )
    # the edge in front (Envoy on the gateway's port; the workers on the pod's loopback): API keys, not body fields
    assert "--edge" in c["command"] and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # what gpu_runtime.serve and keel read: the replica's own directory, its announced host, no file store
    from keel.home import KeelHome

    home = KeelHome(Path(KEEL_HOME))
    assert home.replica("keel-model-runtime-0").root == Path(KEEL_HOME) / "replicas" / "keel-model-runtime-0"
    text = yaml.safe_dump_all([*runtime_manifests(profile), instance_yaml(profile), helm_values(profile)])
    assert "sqlite" not in text.lower()


def test_the_profile_names_the_dockerfiles_of_its_images(profile):
    """The images can not be built here (no container daemon, no registry for base images): what is checked is
    that each Dockerfile exists, installs from the pins CI tested, runs as non-root and starts what the manifests
    expect."""
    platform = (REPO / profile.image_dockerfile).read_text()
    runtime = (REPO / profile.runtime_dockerfile).read_text()
    for text in (platform, runtime):
        assert "-c constraints.txt" in text and "USER 10001" in text
    assert '"dagster", "api", "grpc", "--python-file", "definitions.py"' in platform
    # one environment: the pinned Triton build extracted, the native backend built, no numpy<2 interpreter
    assert "-m gpu_runtime.triton_dist" in runtime and "make -s -C gpu_runtime/backend" in runtime
    assert "KEEL_TRITON_HOME=/opt/keel/.keel-triton" in runtime and "KEEL_RUNTIME_PYTHON" not in runtime
    assert "gpu_runtime/edge_filter/build.sh" in runtime  # the edge's filter is built in the image, as by the set-up
    [c] = runtime_manifests(profile)[0]["spec"]["template"]["spec"]["containers"]
    assert json.dumps(c["command"]).replace(" ", "") in runtime.replace(" ", "")  # the image's CMD is the pod's
    cpu_only = runtime_manifests(profile.__class__(gpus_per_runtime=0))[0]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu_only["containers"][0]["resources"]["requests"] and not cpu_only["nodeSelector"]


def test_dagster_yaml_passes_dagsters_own_schema(profile, tmp_path):
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster_k8s import K8sRunLauncher

    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(profile)))
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_launcher"]["class"] == "K8sRunLauncher" and "postgres" in config["storage"]
    launcher = process_config(K8sRunLauncher.config_type(), config["run_launcher"]["config"])
    assert launcher.success, launcher.errors


def test_helm_values_and_render(profile, tmp_path):
    values = helm_values(profile)
    [deployment] = values["dagster-user-deployments"]["deployments"]
    assert deployment["image"] == {
        "repository": "ghcr.io/keel-platform/keel",
        "tag": "0.1.0",
        "pullPolicy": "IfNotPresent",
    }
    assert values["runLauncher"]["type"] == "K8sRunLauncher" and values["postgresql"]["enabled"]
    r = subprocess.run([sys.executable, "-m", "keel.cli", "k8s", "render", "--out", str(tmp_path)], capture_output=True,
                       text=True, cwd=REPO)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [d["kind"] for d in yaml.safe_load_all((tmp_path / "model-runtime.yaml").read_text())] == [
        "StatefulSet",
        "Service",
        "Service",
    ]
    assert yaml.safe_load((tmp_path / "helm-values.yaml").read_text()) == values
    assert not any("&id" in p.read_text() for p in tmp_path.iterdir())  # no YAML anchors in the manifests


def test_a_bad_profile_names_the_field(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("namespace: keel\ngpus: 2\n")
    with pytest.raises(ProfileError, match="field 'gpus' is unknown"):
        load_profile(bad)
    bad.write_text("namespace: ../etc\n")
    with pytest.raises(ProfileError, match="field 'namespace'"):
        load_profile(bad)


def test_the_runtimes_tier_buys_its_priority_class_and_qos(profile):
    """Business labels decide resources: an L1 runtime is Guaranteed (requests = limits) at priority class keel-l1,
    above L2's and L3's; L3 is BestEffort (no resources), which a runtime with GPUs cannot be."""
    from dataclasses import replace

    from keel.deploy.k8s import ProfileError, priority_classes

    values = {c["metadata"]["name"]: c["value"] for c in priority_classes(profile)}
    assert values["keel-l1"] > values["keel-l2"] > values["keel-l3"]
    l1 = runtime_manifests(replace(profile, runtime_tier="L1"))[0]["spec"]["template"]["spec"]
    [c] = l1["containers"]
    assert l1["priorityClassName"] == "keel-l1" and c["resources"]["requests"] == c["resources"]["limits"]
    assert c["resources"]["requests"]["cpu"] == "8" and c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    l2 = runtime_manifests(replace(profile, runtime_tier="L2"))[0]["spec"]["template"]["spec"]
    assert l2["priorityClassName"] == "keel-l2" and l2["containers"][0]["resources"]["requests"]["cpu"] == "4"
    l3 = runtime_manifests(replace(profile, runtime_tier="L3", gpus_per_runtime=0))[0]["spec"]["template"]["spec"]
    assert l3["priorityClassName"] == "keel-l3" and l3["containers"][0]["resources"] == {}
    with pytest.raises(ProfileError, match="BestEffort"):
        runtime_manifests(replace(profile, runtime_tier="L3"))
    # the installed use cases: hotels' room-rate is L1, so the default runtime is L1
    assert runtime_manifests(profile)[0]["spec"]["template"]["spec"]["priorityClassName"] == "keel-l1"
