"""The Kubernetes manifests (deploy/k8s), checked as data: there is no cluster here.

The overlays are rendered twice: by `render()` below, a small kustomize for exactly the
features deploy/k8s uses (resources, components, generators without name hashes, JSON 6902
and delete patches, images, namespace), so that every check runs without a kustomize binary;
and by `kubectl kustomize` where kubectl is installed (Debian's kubernetes-client), which
must produce the same objects. Then the cross-references that must hold: services, queues,
settings, Secrets, ConfigMaps, probes, GPUs, grace periods, security, images and ports.
"""

from __future__ import annotations

import base64
import copy
import math
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rsieve.adapters.queues import QUEUES
from rsieve.settings import Settings
from rsieve_cli.local.llama_judge import API_KEY_ENV as LLAMA_API_KEY_ENV
from tests.unit.test_deploy_files import dockerfile_stages, interpolate, stage_lineage

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
ENTRYPOINT = "/app/deploy/docker/entrypoint.sh"
SECRETS_EXAMPLE = K8S / "secrets.env.example"

# Folders services/<name>/ that are runnable, and the queue each worker consumes (read from
# its __main__.py: `run_worker("cleaner", "clean", register)`).
SERVICE_MODULES = sorted(p.parent.name for p in (REPO / "services").glob("*/__main__.py"))
RUN_WORKER = re.compile(r"run_worker\(\s*\"(\w+)\"\s*,\s*\"([\w.-]+)\"")


def worker_queues() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in SERVICE_MODULES:
        match = RUN_WORKER.search((REPO / "services" / name / "__main__.py").read_text())
        if match:
            assert match.group(1) == name, f"services/{name} names itself {match.group(1)!r}"
            found[name] = match.group(2)
    return found


WORKER_QUEUES = worker_queues()
WORKERS = sorted(WORKER_QUEUES)
GPU_SIDE = ("generator", "judge")
# One engine per role: the Deployment (and its Service) that serves each GPU-side worker's
# model, and the settings that name its address and its model.
ENGINES = {"generator": "triton-vlm", "judge": "triton-judge"}
ENGINE_URL = {"generator": "RSIEVE_TRITON_GRPC_URL", "judge": "RSIEVE_JUDGE_TRITON_GRPC_URL"}
ENGINE_MODEL = {"generator": "RSIEVE_GENERATOR_MODEL", "judge": "RSIEVE_JUDGE_MODEL"}
# Environment variables of rsieve containers that are not Settings fields: the pieces
# RSIEVE_REDIS_URL is composed of, cache folders on the writable /tmp volume, and the Hugging
# Face hub kept offline (the clients read tokenizer files from disk only).
HELPER_ENV = {"REDIS_PASSWORD", "REDIS_ADDRESS", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_OFFLINE"}
FIELDS = {f"RSIEVE_{name.upper()}" for name in Settings.model_fields}
POD_KINDS = ("Deployment", "StatefulSet")
CLUSTER_SCOPED = {"Namespace"}


# ---------------------------------------------------------------------------- a small kustomize


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _pointer(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        kind = op["op"]
        if isinstance(node, list):
            if kind == "add":
                index = len(node) if last == "-" else int(last)
                node.insert(index, copy.deepcopy(op["value"]))
            elif kind == "remove":
                del node[int(last)]
            elif kind == "replace":
                node[int(last)] = copy.deepcopy(op["value"])
            else:
                raise NotImplementedError(kind)
        elif kind in ("add", "replace"):
            assert kind == "add" or last in node, f"replace of missing {op['path']}"
            node[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del node[last]
        else:
            raise NotImplementedError(kind)


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    unsupported = set(target) - {"kind", "name"}
    assert not unsupported, f"patch target fields not supported here: {unsupported}"
    if "kind" in target and obj["kind"] != target["kind"]:
        return False
    return "name" not in target or re.fullmatch(target["name"], obj["metadata"]["name"]) is not None


def _env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def _generate(kust: dict[str, Any], root: Path) -> list[dict[str, Any]]:
    options = kust.get("generatorOptions") or {}
    made: list[dict[str, Any]] = []
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for spec in kust.get(key) or []:
            assert options.get("disableNameSuffixHash"), "name hashes are not modelled here"
            assert set(spec) <= {"name", "files", "envs", "literals"}, spec
            data: dict[str, str] = {}
            for item in spec.get("files") or []:
                name, sep, file = item.partition("=")
                data[name if sep else Path(name).name] = (root / (file or name)).read_text()
            for env in spec.get("envs") or []:
                data.update(_env_file(root / env))
            for literal in spec.get("literals") or []:
                name, _, value = literal.partition("=")
                data[name] = value
            obj: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": kind,
                "metadata": {"name": spec["name"]},
            }
            if kind == "Secret":
                obj["type"] = "Opaque"
                obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
            else:
                obj["data"] = data
            made.append(obj)
    return made


def _transform(kust: dict[str, Any], objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for patch in kust.get("patches") or []:
        assert set(patch) <= {"target", "patch"}, f"only inline patches here: {patch}"
        body = yaml.safe_load(patch["patch"])
        if isinstance(body, dict):
            assert body.get("$patch") == "delete", "only delete strategic-merge patches here"
            objs = [
                o
                for o in objs
                if not (
                    o["kind"] == body["kind"] and o["metadata"]["name"] == body["metadata"]["name"]
                )
            ]
            continue
        hits = [o for o in objs if _matches(o, patch.get("target") or {})]
        assert hits, f"patch target matches nothing: {patch.get('target')}"
        for obj in hits:
            _json_patch(obj, body)
    images = {i["name"]: i for i in kust.get("images") or []}
    for obj in objs:
        for container in _containers(obj):
            name, _, tag = container["image"].partition(":")
            if name in images:
                rule = images[name]
                container["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    if kust.get("namespace"):
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = kust["namespace"]
    return objs


def render(root: Path, objs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What `kubectl kustomize root` prints, for the features deploy/k8s uses."""
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    known = {
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "components",
        "patches",
        "images",
        "configMapGenerator",
        "secretGenerator",
        "generatorOptions",
    }
    assert set(kust) <= known, f"{root}: not modelled here: {set(kust) - known}"
    objs = [] if objs is None else objs
    for entry in kust.get("resources") or []:
        path = root / entry
        objs.extend(render(path) if path.is_dir() else _load(path))
    for component in kust.get("components") or []:
        objs = render(root / component, objs)
    objs.extend(_generate(kust, root))
    return _transform(kust, objs)


# ---------------------------------------------------------------------------- helpers


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in POD_KINDS:
        return obj["spec"]["template"]["spec"]
    return None


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = _pod_spec(obj)
    if spec is None:
        return []
    return [*spec.get("initContainers", []), *spec["containers"]]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    return next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)


def get(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    obj = find(objs, kind, name)
    assert obj is not None, f"no {kind} {name}"
    return obj


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def config_data(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    return {k: str(v) for k, v in (get(objs, "ConfigMap", name).get("data") or {}).items()}


def secret_data(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    secret = get(objs, "Secret", name)
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    data.update(secret.get("stringData") or {})
    return data


EXPANSION = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def effective_env(objs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet gives a container: envFrom first, then env in order with
    $(VAR) expanded from what is defined before it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            env.update(config_data(objs, source["configMapRef"]["name"]))
        if "secretRef" in source:
            env.update(secret_data(objs, source["secretRef"]["name"]))
    for var in container.get("env") or []:
        if "value" in var:
            value = EXPANSION.sub(lambda m: env.get(m.group(1), m.group(0)), str(var["value"]))
        else:
            ref = var["valueFrom"]
            if "configMapKeyRef" in ref:
                value = config_data(objs, ref["configMapKeyRef"]["name"])[
                    ref["configMapKeyRef"]["key"]
                ]
            elif "secretKeyRef" in ref:
                value = secret_data(objs, ref["secretKeyRef"]["name"])[ref["secretKeyRef"]["key"]]
            else:
                continue
        env[var["name"]] = value
    return env


def rsieve_container(objs: list[dict[str, Any]], service: str) -> dict[str, Any]:
    deployment = get(objs, "Deployment", service)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def image_name(image: str) -> str:
    return image.rpartition("/")[2].partition(":")[0]


PBTXT_PARAMETER = re.compile(
    r'parameters:?\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}\s*\}'
)


def model_parameters(config_pbtxt: str) -> dict[str, str]:
    """The string parameters of a Triton model config (`parameters: { key: .. value: .. }`)."""
    return dict(PBTXT_PARAMETER.findall(config_pbtxt))


def app_image_copies() -> dict[str, str]:
    """Where the rsieve image (Dockerfile stage `app` and the stages it derives from) gets
    files from the builder stages (builder, checkpoints): destination -> source."""
    bodies = {name: body for _, name, body in dockerfile_stages()}
    copies: dict[str, str] = {}
    for stage in stage_lineage("app"):
        for line in bodies[stage]:
            parts = line.split()
            if parts[0] == "COPY" and {"--from=builder", "--from=checkpoints"} & set(parts):
                source, dest = [p for p in parts[1:] if not p.startswith("--")]
                copies[dest] = source
    return copies


# ---------------------------------------------------------------------------- fixtures


def each_overlay(
    rendered: dict[str, list[dict[str, Any]]],
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    yield from rendered.items()


# ---------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubectl_kustomize_renders_the_same_objects(
    overlay: str, k8s_copy: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "kubectl not installed (Debian: apt-get install kubernetes-client); "
            "the checks below ran on this module's own rendering"
        )
    out = subprocess.run(
        [kubectl, "kustomize", str(k8s_copy / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout) if o}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered[overlay]}
    assert sorted(theirs) == sorted(ours)
    for key, obj in ours.items():
        assert theirs[key] == obj, f"{overlay}: {key} differs from kubectl kustomize"


def test_objects_are_unique_and_namespaced(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        keys = [(o["kind"], o["metadata"]["name"]) for o in objs]
        assert len(keys) == len(set(keys)), f"{overlay}: duplicate objects"
        (namespace,) = of_kind(objs, "Namespace")
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                assert obj["metadata"]["namespace"] == namespace["metadata"]["name"], obj


def test_triton_model_repository_copies_are_current() -> None:
    source = REPO / "deploy" / "triton" / "vllm"
    copy_root = K8S / "base" / "triton-vllm"
    ours = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(copy_root) for p in copy_root.rglob("*") if p.is_file())
    assert ours == theirs and all(
        (source / p).read_bytes() == (copy_root / p).read_bytes() for p in ours
    ), (
        "deploy/k8s/base/triton-vllm is stale: "
        "cp -r deploy/triton/vllm/. deploy/k8s/base/triton-vllm/"
    )


# ---------------------------------------------------------------------------- services


def test_every_service_has_a_deployment(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert set(WORKERS) == {"cleaner", "generator", "verifier", "judge", "compactor"}
    for overlay, objs in each_overlay(rendered):
        for service in SERVICE_MODULES:
            container = rsieve_container(objs, service)
            assert image_name(container["image"]) == "rsieve", (overlay, service)
            assert "command" not in container, f"{service} must keep the image's entrypoint"
            assert container["args"] == [service], (overlay, service)
        for engine in ENGINES.values():
            assert find(objs, "Deployment", engine), (overlay, engine)
        # The shared engine of before is gone, with everything that named it.
        for obj in objs:
            labels = obj["metadata"].get("labels") or {}
            assert obj["metadata"]["name"] != "triton", (overlay, obj["kind"])
            assert labels.get("app.kubernetes.io/component") != "triton", (overlay, obj)


def test_settings_env_and_configmap_keys_are_fields(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, objs in each_overlay(rendered):
        config = config_data(objs, "rsieve-config")
        unknown = sorted(set(config) - FIELDS - {"REDIS_ADDRESS"})
        assert not unknown, f"rsieve-config keys that are not Settings fields: {unknown}"
        for service in SERVICE_MODULES:
            names = {v["name"] for v in rsieve_container(objs, service).get("env") or []}
            unknown = sorted(n for n in names if n.startswith("RSIEVE_") and n not in FIELDS)
            assert not unknown, f"{overlay}/{service}: not Settings fields: {unknown}"
            others = sorted(n for n in names if not n.startswith("RSIEVE_"))
            assert set(others) <= HELPER_ENV, f"{overlay}/{service}: unexpected env {others}"


# The settings a deployment must set itself (the others may keep their defaults).
REQUIRED = {
    "environment",
    "redis_url",
    "visibility_timeout_s",
    "task_time_limit_s",
    "max_deliveries",
    "s3_endpoint",
    "s3_bucket",
    "s3_region",
    "s3_access_key",
    "s3_secret_key",
    "triton_grpc_url",
    "judge_triton_grpc_url",
    "generator_model",
    "judge_model",
    "max_inflight",
    "model_timeout_s",
    "model_retries",
    "worker_concurrency",
    "shard_size",
    "api_url",
}
TEST_ONLY = {"RSIEVE_TEST_CRASH_ITEM_IDS"}  # tests/fault_injection


def settings_of(env: dict[str, str]) -> Settings:
    rsieve = {k: v for k, v in env.items() if k.startswith("RSIEVE_")}
    return Settings.from_env_map(rsieve)


def test_every_setting_is_deployed_and_valid(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert REQUIRED <= set(Settings.model_fields), sorted(REQUIRED - set(Settings.model_fields))
    for overlay, objs in each_overlay(rendered):
        for service in SERVICE_MODULES:
            env = effective_env(objs, rsieve_container(objs, service))
            values = {k.removeprefix("RSIEVE_").lower() for k in env if k.startswith("RSIEVE_")}
            wanted = REQUIRED | ({"api_token"} if service == "api" else set())
            missing = sorted(wanted - values)
            assert not missing, (
                f"{overlay}/{service}: settings not deployed: {missing}; add RSIEVE_<NAME> to "
                "deploy/k8s/base/config.yaml (or the Secret)"
            )
            assert not TEST_ONLY & set(env), f"{overlay}/{service}: fault injection deployed"
            assert not EXPANSION.search(env["RSIEVE_REDIS_URL"]), f"{service}: unresolved $(...)"
            settings = settings_of(env)
            assert settings.environment == "production"
            assert "@" in settings.redis_url and ":change-me" in settings.redis_url


def _quantity_bytes(q: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "k": 1000, "M": 10**6}
    for unit, factor in units.items():
        if q.endswith(unit):
            return int(float(q.removesuffix(unit)) * factor)
    return int(q)


def test_the_api_pods_temporary_space_holds_every_upload_slot(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """An upload holds its body and its extraction on /tmp until it is packed into the
    bucket; the API takes api_upload_slots at once. /tmp must hold them all, with 256 MiB
    for the caches beside them, or an upload within every limit fills the pod's disk."""
    for overlay, objs in each_overlay(rendered):
        api = get(objs, "Deployment", "api")
        settings = settings_of(effective_env(objs, rsieve_container(objs, "api")))
        (tmp,) = [v for v in api["spec"]["template"]["spec"]["volumes"] if v["name"] == "tmp"]
        size = _quantity_bytes(tmp["emptyDir"]["sizeLimit"])
        per_upload = settings.api_max_request_bytes + settings.api_max_extracted_bytes
        needed = settings.api_upload_slots * per_upload + 256 * 1024**2
        assert size >= needed, f"{overlay}: /tmp {size} bytes < {needed} for the uploads"
        assert settings.api_max_json_bytes <= 1024**2


def test_every_reference_resolves(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        for obj in objs:
            where = f"{overlay}/{obj['kind']}/{obj['metadata']['name']}"
            spec = _pod_spec(obj)
            if spec is None:
                continue
            for container in _containers(obj):
                defined: set[str] = set()
                for source in container.get("envFrom") or []:
                    if "configMapRef" in source:
                        defined |= set(config_data(objs, source["configMapRef"]["name"]))
                    if "secretRef" in source:
                        defined |= set(secret_data(objs, source["secretRef"]["name"]))
                for var in container.get("env") or []:
                    ref = var.get("valueFrom") or {}
                    if "configMapKeyRef" in ref:
                        r = ref["configMapKeyRef"]
                        assert r["key"] in config_data(objs, r["name"]), f"{where}: {r}"
                    if "secretKeyRef" in ref:
                        r = ref["secretKeyRef"]
                        assert r["key"] in secret_data(objs, r["name"]), f"{where}: {r}"
                    for used in EXPANSION.findall(str(var.get("value", ""))):
                        assert used in defined, f"{where}: $({used}) used before it is defined"
                    defined.add(var["name"])
                for arg in [*container.get("args", []), *container.get("command", [])]:
                    for used in EXPANSION.findall(str(arg)):
                        assert used in defined, f"{where}: $({used}) in args is not defined"
                mounts = {m["name"] for m in container.get("volumeMounts") or []}
                volumes = {v["name"] for v in spec.get("volumes") or []}
                claims = {
                    t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates") or []
                }
                assert mounts <= volumes | claims, f"{where}: mounts {mounts - volumes - claims}"
            for volume in spec.get("volumes") or []:
                if "configMap" in volume:
                    data = config_data(objs, volume["configMap"]["name"])
                    for item in volume["configMap"].get("items") or []:
                        assert item["key"] in data, f"{where}: {item}"
                if "secret" in volume:
                    get(objs, "Secret", volume["secret"]["secretName"])
                if "persistentVolumeClaim" in volume:
                    get(objs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        for auth in of_kind(objs, "TriggerAuthentication"):
            for ref in auth["spec"]["secretTargetRef"]:
                assert ref["key"] in secret_data(objs, ref["name"]), (overlay, ref)


def test_secrets_example_matches_what_is_referenced(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    example = _env_file(SECRETS_EXAMPLE)
    for key, value in example.items():
        assert value.startswith("change-me"), f"secrets.env.example {key} must be a placeholder"
    for overlay, objs in each_overlay(rendered):
        used: set[str] = set()
        for obj in objs:
            for container in _containers(obj):
                for var in container.get("env") or []:
                    ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        assert ref["name"] == "rsieve-secrets"
                        used.add(ref["key"])
        for auth in of_kind(objs, "TriggerAuthentication"):
            used |= {ref["key"] for ref in auth["spec"]["secretTargetRef"]}
        assert used == set(example), f"{overlay}: referenced {sorted(used)}"
        kust = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
        (generator,) = kust["secretGenerator"]
        assert generator["envs"] == [".env"], "the Secret must come from a git-ignored file"
    assert ".env" in (REPO / ".gitignore").read_text().split()


# ---------------------------------------------------------------------------- KEDA and queues


def queue_problems(
    objs: list[dict[str, Any]], queues: dict[str, str], consumes: dict[str, str]
) -> list[str]:
    """What is wrong between the code's queues (`queues`: task -> queue, `consumes`: worker
    service -> queue) and the ScaledObjects; empty when everything agrees."""
    problems: list[str] = []
    routed = set(queues.values())
    for queue in sorted(routed - set(consumes.values())):
        problems.append(f"queue {queue!r} has no worker")
    scaled: dict[str, set[str]] = {}
    for so in of_kind(objs, "ScaledObject"):
        name, target = so["metadata"]["name"], so["spec"]["scaleTargetRef"]
        if target.get("kind", "Deployment") != "Deployment" or not find(
            objs, "Deployment", target["name"]
        ):
            problems.append(f"ScaledObject {name} targets no Deployment: {target}")
            continue
        for trigger in so["spec"]["triggers"]:
            if trigger["type"] != "redis":
                problems.append(f"ScaledObject {name}: trigger {trigger['type']}")
                continue
            listed = trigger["metadata"]["listName"]
            if listed not in routed:
                problems.append(f"ScaledObject {name} watches {listed!r}, not a queue")
            served = consumes.get(target["name"])
            if served is not None and listed != served:
                problems.append(
                    f"ScaledObject {name} watches {listed!r}; {target['name']} consumes {served!r}"
                )
            scaled.setdefault(target["name"], set()).add(listed)
    for worker, queue in consumes.items():
        if queue not in scaled.get(worker, set()):
            problems.append(f"worker {worker} (queue {queue!r}) has no ScaledObject on it")
    return problems


def test_every_queue_has_a_worker_and_a_scaledobject(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, objs in each_overlay(rendered):
        assert queue_problems(objs, QUEUES, WORKER_QUEUES) == [], overlay


def test_a_renamed_queue_in_the_code_fails_the_check(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    renamed = {task: ("generation" if q == "generate" else q) for task, q in QUEUES.items()}
    consumes = {w: ("generation" if q == "generate" else q) for w, q in WORKER_QUEUES.items()}
    problems = queue_problems(rendered["gpu"], renamed, consumes)
    assert any("'generate', not a queue" in p for p in problems), problems
    assert any("generator (queue 'generation') has no ScaledObject" in p for p in problems)
    # A queue the code routes to that no worker consumes.
    problems = queue_problems(rendered["gpu"], {**QUEUES, "rsieve.new": "new"}, WORKER_QUEUES)
    assert "queue 'new' has no worker" in problems


def test_keda_reads_redis_as_the_workers_do(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        auths = {a["metadata"]["name"] for a in of_kind(objs, "TriggerAuthentication")}
        for so in of_kind(objs, "ScaledObject"):
            target = get(objs, "Deployment", so["spec"]["scaleTargetRef"]["name"])
            (container,) = target["spec"]["template"]["spec"]["containers"]
            env = effective_env(objs, container)
            assert so["spec"]["minReplicaCount"] >= 1, (
                "scale to zero would leave no worker to restore unacked messages"
            )
            for trigger in so["spec"]["triggers"]:
                meta = trigger["metadata"]
                assert trigger["authenticationRef"]["name"] in auths
                assert "password" not in meta and "passwordFromEnv" not in meta
                assert meta["addressFromEnv"] in env, (overlay, so["metadata"]["name"])
                assert meta.get("databaseIndex", "0") == "0"
            if target["metadata"]["name"] in WORKERS:
                url = env["RSIEVE_REDIS_URL"]
                assert url.endswith(f"@{env['REDIS_ADDRESS']}/0"), url


# ---------------------------------------------------------------------------- scheduling


def _gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    return max(
        int((resources.get(part) or {}).get("nvidia.com/gpu", 0)) for part in ("requests", "limits")
    )


def test_gpus_only_where_intended(rendered: dict[str, list[dict[str, Any]]]) -> None:
    engines = set(ENGINES.values())
    for overlay, objs in each_overlay(rendered):
        for obj in objs:
            for container in _containers(obj):
                wanted = 1 if (overlay == "gpu" and obj["metadata"]["name"] in engines) else 0
                assert _gpus(container) == wanted, (overlay, obj["metadata"]["name"])
        for engine in sorted(engines):
            spec = get(objs, "Deployment", engine)["spec"]["template"]["spec"]
            if overlay == "gpu":
                assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, engine
                assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"]), engine
                (term,) = spec["affinity"]["nodeAffinity"][
                    "requiredDuringSchedulingIgnoredDuringExecution"
                ]["nodeSelectorTerms"]
                (expr,) = term["matchExpressions"]
                assert expr["key"] == "nvidia.com/gpu.memory", engine
                assert int(expr["values"][0]) >= 79000, engine
            else:
                assert "nodeSelector" not in spec and "tolerations" not in spec, engine
        for name in GPU_SIDE:
            spec = get(objs, "Deployment", name)["spec"]["template"]["spec"]
            affinity = spec["affinity"]["podAffinity"]
            terms = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
            # Next to its own engine.
            assert any(
                t["podAffinityTerm"]["labelSelector"]["matchLabels"]
                == {"app.kubernetes.io/component": ENGINES[name]}
                for t in terms
            ), name
            assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


def test_one_engine_per_role_on_its_own_gpu_and_queue(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """gpu: two GPU Deployments, triton-vlm (the generator's engine) and triton-judge (the
    judge's), one GPU each, each scaled by its own ScaledObject on its own role's queue only."""
    objs = rendered["gpu"]
    gpu_deployments = sorted(
        o["metadata"]["name"]
        for o in of_kind(objs, "Deployment")
        if any(_gpus(c) for c in _containers(o))
    )
    assert gpu_deployments == sorted(ENGINES.values())
    for role, engine in ENGINES.items():
        (container,) = get(objs, "Deployment", engine)["spec"]["template"]["spec"]["containers"]
        for part in ("requests", "limits"):
            assert int(container["resources"][part]["nvidia.com/gpu"]) == 1, (engine, part)
        scalers = [
            so
            for so in of_kind(objs, "ScaledObject")
            if so["spec"]["scaleTargetRef"]["name"] == engine
        ]
        assert len(scalers) == 1, engine
        (scaler,) = scalers
        lists = [trigger["metadata"]["listName"] for trigger in scaler["spec"]["triggers"]]
        queue = WORKER_QUEUES[role]
        assert lists == [queue], (engine, lists)
        assert queue in QUEUES.values()
        # Warm by default: components/judge-scale-to-zero is the opt-in for zero.
        assert scaler["spec"]["minReplicaCount"] == 1, engine


def tritonserver_containers(
    objs: list[dict[str, Any]],
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, container) for every container that runs tritonserver."""
    for obj in objs:
        for container in _containers(obj):
            argv = [*container.get("command", []), *container.get("args", [])]
            if "tritonserver" in argv[:1]:
                yield obj, container


def loaded_models(container: dict[str, Any]) -> list[str]:
    """The models a tritonserver container loads (`--load-model=NAME`, in order)."""
    argv = [*container.get("command", []), *container.get("args", [])]
    return [arg.partition("=")[2] for arg in argv if arg.startswith("--load-model=")]


def engine_of(objs: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The one Deployment whose tritonserver loads `model`."""
    found = [
        obj for obj, container in tritonserver_containers(objs) if model in loaded_models(container)
    ]
    assert len(found) == 1, f"{model}: loaded by {[o['metadata']['name'] for o in found]}"
    return found[0]


def test_every_tritonserver_loads_exactly_its_models(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Explicit model control everywhere: a ConfigMap-mounted repository holds `..data` and a
    timestamped folder that Triton's default mode would take for models; and each engine
    loads its role's model, nothing else (cpu: rapidocr and judge-smollm2 from the image's
    repository, never the test stand-in judge-abstain)."""
    for overlay, objs in each_overlay(rendered):
        config = config_data(objs, "rsieve-config")
        servers = list(tritonserver_containers(objs))
        assert sorted(o["metadata"]["name"] for o, _ in servers) == sorted(ENGINES.values())
        for obj, container in servers:
            argv = container.get("args", [])
            where = (overlay, obj["metadata"]["name"])
            assert "--model-control-mode=explicit" in argv, where
            assert "--exit-on-error=true" in argv, where
            assert any(a.startswith("--exit-timeout-secs=") for a in argv), where
            assert sum(a.startswith("--model-repository=") for a in argv) == 1, where
        for role, engine in ENGINES.items():
            (container,) = get(objs, "Deployment", engine)["spec"]["template"]["spec"]["containers"]
            assert loaded_models(container) == [config[ENGINE_MODEL[role]]], (overlay, role)
            assert engine_of(objs, config[ENGINE_MODEL[role]])["metadata"]["name"] == engine
            assert "judge-abstain" not in loaded_models(container)


def _engine_repository(objs: list[dict[str, Any]], engine: str) -> tuple[str, dict[str, str]]:
    """The ConfigMap that is an engine's model repository: its name and its data."""
    spec = get(objs, "Deployment", engine)["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "model-repository"]
    name = volume["configMap"]["name"]
    return name, config_data(objs, name)


def test_models_match_the_overlay_repository(rendered: dict[str, list[dict[str, Any]]]) -> None:
    repositories = {
        "cpu": REPO / "deploy" / "triton" / "cpu",
        "gpu": REPO / "deploy" / "triton" / "vllm",
    }
    for overlay, objs in each_overlay(rendered):
        config = config_data(objs, "rsieve-config")
        for key in ("RSIEVE_GENERATOR_MODEL", "RSIEVE_JUDGE_MODEL"):
            model_dir = repositories[overlay] / config[key]
            assert (model_dir / "config.pbtxt").is_file(), f"{overlay}: {key} names no model"
    objs = rendered["gpu"]
    config = config_data(objs, "rsieve-config")
    source = REPO / "deploy" / "triton" / "vllm"
    served: set[str] = set()
    for role, engine in ENGINES.items():
        model = config[ENGINE_MODEL[role]]
        name, repo = _engine_repository(objs, engine)
        assert name == f"{engine}-repository", (engine, name)
        spec = get(objs, "Deployment", engine)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "model-repository"]
        items = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
        assert set(repo) == set(items), engine
        # Its one model's files, at their places in deploy/triton/vllm, byte for byte.
        files = {str(p.relative_to(source)) for p in (source / model).rglob("*") if p.is_file()}
        assert set(items.values()) == files, engine
        for key, path in items.items():
            assert repo[key] == (source / path).read_text(), (engine, path)
        served |= files
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        checkpoint = yaml.safe_load(repo["model.json"])["model"]
        assert any(checkpoint.startswith(m + "/") for m in mounts), checkpoint
    # Every model of deploy/triton/vllm is some engine's.
    assert served == {str(p.relative_to(source)) for p in source.rglob("*") if p.is_file()}


def _triton_model(
    overlay: str, objs: list[dict[str, Any]], model: str
) -> tuple[str, dict[str, Any]]:
    """The config.pbtxt text of a model the overlay's engines serve, and for the gpu overlay
    its model.json (from the repository ConfigMap of the engine that loads it, what Triton
    really reads)."""
    if overlay == "gpu":
        _, repo = _engine_repository(objs, engine_of(objs, model)["metadata"]["name"])
        return repo["config.pbtxt"], yaml.safe_load(repo["model.json"])
    return (REPO / "deploy" / "triton" / "cpu" / model / "config.pbtxt").read_text(), {}


def test_no_chat_template_setting_anywhere() -> None:
    """RSIEVE_CHAT_TEMPLATE (hand-written templates) is gone: the checkpoint's own template is
    read from its tokenizer files (RSIEVE_*_TOKENIZER). No deploy file may still set it, and
    every RSIEVE_ name the deploy files mention is a Settings field or a variable a model
    server reads (a Triton model of deploy/triton, or compose's judge-server its key)."""
    assert "chat_template" not in Settings.model_fields
    model_vars: set[str] = {LLAMA_API_KEY_ENV}
    for path in (REPO / "deploy" / "triton").rglob("*"):
        if path.is_file() and path.suffix in {".py", ".pbtxt"}:
            model_vars |= set(re.findall(r"RSIEVE_[A-Z0-9_]+", path.read_text()))
    files = [p for p in K8S.rglob("*") if p.is_file() and p.suffix in {".yaml", ".md", ".example"}]
    files += [
        REPO / "docker-compose.yml",
        REPO / ".env.example",
        REPO / "docs" / "deploy.md",
        *(p for p in (REPO / "deploy" / "docker").iterdir() if p.is_file()),
    ]
    for path in files:
        text = path.read_text()
        where = path.relative_to(REPO)
        assert "CHAT_TEMPLATE" not in text, f"{where} still names RSIEVE_CHAT_TEMPLATE"
        unknown = sorted(set(re.findall(r"RSIEVE_[A-Z0-9_]*[A-Z0-9]", text)) - FIELDS - model_vars)
        assert not unknown, f"{where}: neither Settings fields nor model variables: {unknown}"


def test_clients_read_the_tokenizer_of_the_served_checkpoint(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """gpu: the generator and the judge render the chat template of the very checkpoint
    Triton's vLLM model serves (model.json), read-only from the same PVC at the same path.
    cpu: rapidocr (the rsieve interface) needs no tokenizer; the judge's tokenizer files are
    baked into the rsieve image."""
    for overlay, objs in each_overlay(rendered):
        for service, key in (("generator", "GENERATOR"), ("judge", "JUDGE")):
            where = (overlay, service)
            deployment = get(objs, "Deployment", service)
            pod = deployment["spec"]["template"]["spec"]
            container = rsieve_container(objs, service)
            env = effective_env(objs, container)
            assert env.get("HF_HUB_OFFLINE") == "1", where
            tokenizer = env[f"RSIEVE_{key}_TOKENIZER"]
            config, engine = _triton_model(overlay, objs, env[f"RSIEVE_{key}_MODEL"])
            kind = model_parameters(config).get("rsieve_kind")
            assert kind in {"vlm", "llm", "ocr-engine", "stand-in"}, (where, kind)
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts") or []}
            volumes = {v["name"]: v for v in pod["volumes"]}
            if overlay == "gpu":
                assert tokenizer == engine.get("tokenizer", engine["model"]), where
                assert tokenizer.startswith("/models/"), where
                mount = mounts["/models"]
                assert mount["readOnly"] is True, where
                claim = volumes[mount["name"]]["persistentVolumeClaim"]
                assert claim == {"claimName": "triton-models", "readOnly": True}, where
                # Its own engine reads the checkpoint at the same path, read-only too.
                triton = get(objs, "Deployment", ENGINES[service])["spec"]["template"]["spec"]
                (theirs,) = [
                    v
                    for v in triton["volumes"]
                    if v.get("persistentVolumeClaim", {}).get("claimName") == "triton-models"
                ]
                assert theirs["persistentVolumeClaim"]["readOnly"] is True, where
                (triton_mount,) = [
                    m
                    for m in triton["containers"][0]["volumeMounts"]
                    if m["name"] == theirs["name"]
                ]
                assert triton_mount["mountPath"] == "/models", "the same paths in every pod"
                assert triton_mount["readOnly"] is True, where
                # Written by the weights Job (components/weights), read by pods on any node.
                pvc = get(objs, "PersistentVolumeClaim", "triton-models")
                assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
            else:
                assert "/models" not in mounts, where
                assert not [v for v in volumes.values() if "persistentVolumeClaim" in v], where
                if kind == "ocr-engine":
                    assert tokenizer == "", f"{where}: an OCR engine has no tokenizer"
                else:
                    assert tokenizer in app_image_copies(), (
                        f"{where}: {tokenizer} is not baked into the rsieve image"
                    )
            # The checkpoint is mounted, never written: the pod stays as hardened as before.
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert all(m.get("readOnly") for path, m in mounts.items() if path != "/tmp"), where
            assert pod["securityContext"]["runAsNonRoot"] is True, where


def test_the_judges_are_language_models(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Neither overlay deploys the test stand-in judge-abstain (answers UNSURE to everything):
    the cpu overlay's judge is SmolLM2 (judge-smollm2), the gpu overlay's the VLM (text only)."""
    expected = {"cpu": ("judge-smollm2", "llm"), "gpu": ("judge", "vlm")}
    for overlay, objs in each_overlay(rendered):
        model = config_data(objs, "rsieve-config")["RSIEVE_JUDGE_MODEL"]
        config, _ = _triton_model(overlay, objs, model)
        assert (model, model_parameters(config)["rsieve_kind"]) == expected[overlay], overlay
    assert Settings.model_fields["judge_model"].default == "judge-smollm2"


def test_a_run_has_one_identity(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Settings.fingerprint() is part of a run's id, computed by the api and the cleaners
    (continuous ingestion) but describing the generator's and judge's work: every rsieve
    container must see the same values, the tokenizers included."""
    for overlay, objs in each_overlay(rendered):
        prints = {}
        for obj in objs:
            for container in _containers(obj):
                if image_name(container["image"]) == "rsieve":
                    env = effective_env(objs, container)
                    prints[obj["metadata"]["name"]] = settings_of(env).fingerprint()
        assert set(SERVICE_MODULES) <= set(prints), overlay
        first = prints["api"]
        for name, fingerprint in prints.items():
            assert fingerprint == first, (
                overlay,
                name,
                {k: (v, first[k]) for k, v in fingerprint.items() if first[k] != v},
            )


# ---------------------------------------------------------------------------- probes and stops


def test_probes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        for obj in objs:
            spec = _pod_spec(obj)
            # Init containers run to completion before the pod starts: no probes there.
            for container in [] if spec is None else spec["containers"]:
                where = (overlay, obj["metadata"]["name"])
                assert container.get("livenessProbe"), f"{where}: no liveness probe"
                text = yaml.safe_dump({k: v for k, v in container.items() if "Probe" in k})
                assert "inspect" not in text and "celery" not in text, where
        for worker in WORKERS:
            container = rsieve_container(objs, worker)
            assert container["livenessProbe"]["exec"]["command"] == [ENTRYPOINT, "--healthcheck"]
        api = rsieve_container(objs, "api")
        port = int(config_data(objs, "rsieve-config")["RSIEVE_API_URL"].rpartition(":")[2])
        assert api["ports"] == [{"name": "http", "containerPort": port}]
        assert api["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        service = get(objs, "Service", "api")
        assert service["spec"]["ports"][0]["port"] == port
        for engine in ENGINES.values():
            triton = get(objs, "Deployment", engine)["spec"]["template"]["spec"]["containers"][0]
            assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
            startup = triton["startupProbe"]
            assert startup["httpGet"]["path"] == "/v2/health/ready"
            budget = startup["periodSeconds"] * startup["failureThreshold"]
            # Loading an 8B VLM takes minutes (compose allows 15); the CPU models seconds.
            assert budget >= (900 if overlay == "gpu" else 120), (overlay, engine, budget)


def model_seconds(env: dict[str, str]) -> float:
    """An upper bound on the model calls of one shard: its requests go out in waves of
    RSIEVE_MAX_INFLIGHT; each call may take RSIEVE_MODEL_TIMEOUT_S, be tried
    1 + RSIEVE_MODEL_RETRIES times, with doubling backoffs from RSIEVE_MODEL_BACKOFF_S."""
    waves = math.ceil(int(env["RSIEVE_SHARD_SIZE"]) / int(env["RSIEVE_MAX_INFLIGHT"]))
    retries = int(env["RSIEVE_MODEL_RETRIES"])
    backoff = float(env.get("RSIEVE_MODEL_BACKOFF_S", "1")) * (2**retries - 1)
    return waves * (float(env["RSIEVE_MODEL_TIMEOUT_S"]) * (1 + retries) + backoff)


def test_workers_get_time_to_finish_their_shard(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        for worker in WORKERS:
            deployment = get(objs, "Deployment", worker)
            grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            env = effective_env(objs, rsieve_container(objs, worker))
            settings = settings_of(env)
            where = (overlay, worker, grace)
            # SIGTERM is Celery's warm shutdown: the shard in hand runs to its end, which the
            # hard task time limit bounds; the kubelet must not SIGKILL before that.
            assert grace >= settings.task_time_limit_s + 30, where
            # A shard whose worker was killed anyway is redelivered after the visibility
            # timeout: not while a draining worker may still be working on it.
            assert settings.visibility_timeout_s > grace, where
            if worker in GPU_SIDE:
                # Model calls that may legitimately take this long must fit the time limit.
                assert model_seconds(env) <= settings.task_time_limit_s, (where, env)
            container = rsieve_container(objs, worker)
            assert "preStop" not in (container.get("lifecycle") or {}), (
                f"{worker}: SIGTERM must reach Celery at once (a preStop only eats the grace)"
            )
            assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


# ---------------------------------------------------------------------------- hardening


def test_pods_run_unprivileged(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        for obj in objs:
            spec = _pod_spec(obj)
            if spec is None:
                continue
            where = (overlay, obj["metadata"]["name"])
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, where
            assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
            assert spec["automountServiceAccountToken"] is False, where
            for container in _containers(obj):
                ctx = container["securityContext"]
                assert ctx["allowPrivilegeEscalation"] is False, where
                assert ctx["capabilities"]["drop"] == ["ALL"], where
                assert not ctx.get("privileged"), where
                assert not ctx.get("runAsUser", 1) == 0, where
        for service in SERVICE_MODULES:
            container = rsieve_container(objs, service)
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            # The image's user (deploy/docker/Dockerfile: uid 10001).
            pod = get(objs, "Deployment", service)["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsUser"] == 10001


def test_resources_are_bounded(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        for obj in objs:
            for container in _containers(obj):
                resources = container["resources"]
                for part in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(resources[part]), (
                        overlay,
                        obj["metadata"]["name"],
                        part,
                    )


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_every_workload_has_a_pdb(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        pdbs = of_kind(objs, "PodDisruptionBudget")
        for obj in objs:
            if obj["kind"] not in POD_KINDS:
                continue
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert _selects(obj["spec"]["selector"], labels)
            matching = [p for p in pdbs if _selects(p["spec"]["selector"], labels)]
            assert len(matching) == 1, (overlay, obj["metadata"]["name"])
            assert "maxUnavailable" in matching[0]["spec"], "minAvailable blocks drains"


def test_network_policies(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        policies = of_kind(objs, "NetworkPolicy")
        deny = get(objs, "NetworkPolicy", "default-deny-ingress")["spec"]
        assert deny["podSelector"] == {} and "ingress" not in deny
        for service in of_kind(objs, "Service"):
            pods = next(
                o
                for o in objs
                if o["kind"] in POD_KINDS
                and _selects(
                    {"matchLabels": service["spec"]["selector"]},
                    o["spec"]["template"]["metadata"]["labels"],
                )
            )
            labels = pods["spec"]["template"]["metadata"]["labels"]
            allowed = {
                port["port"]
                for p in policies
                if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)
                for rule in p["spec"].get("ingress", [])
                for port in rule["ports"]
            }
            for port in service["spec"]["ports"]:
                assert port["port"] in allowed, (overlay, service["metadata"]["name"], port)
        for worker in WORKERS:
            labels = get(objs, "Deployment", worker)["spec"]["template"]["metadata"]["labels"]
            assert not [
                p
                for p in policies
                if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)
            ], worker
        redis = find(objs, "NetworkPolicy", "redis-ingress")
        if redis is not None:
            sources = redis["spec"]["ingress"][0]["from"]
            assert {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}
            } in sources
            for module in SERVICE_MODULES:
                labels = get(objs, "Deployment", module)["spec"]["template"]["metadata"]["labels"]
                assert any(
                    "podSelector" in s and _selects(s["podSelector"], labels) for s in sources
                ), module


def test_each_engine_takes_requests_from_its_role_only(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Inference (8000, 8001) on triton-vlm from the generator only, on triton-judge from the
    judge only; metrics (8002) from the monitoring namespace."""
    for overlay, objs in each_overlay(rendered):
        policies = of_kind(objs, "NetworkPolicy")
        for role, engine in ENGINES.items():
            labels = get(objs, "Deployment", engine)["spec"]["template"]["metadata"]["labels"]
            rules = [
                rule
                for p in policies
                if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)
                for rule in p["spec"].get("ingress", [])
            ]
            inference = [r for r in rules if {p["port"] for p in r["ports"]} & {8000, 8001}]
            sources = [s for r in inference for s in r["from"]]
            assert sources == [
                {"podSelector": {"matchLabels": {"app.kubernetes.io/component": role}}}
            ], (overlay, engine, sources)
            metrics = [r for r in rules if {p["port"] for p in r["ports"]} == {8002}]
            assert [s for r in metrics for s in r["from"]] == [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    }
                }
            ]


# ---------------------------------------------------------------------------- infrastructure


def test_redis_is_durable_and_where_the_settings_say(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for _overlay, objs in each_overlay(rendered):
        redis = get(objs, "StatefulSet", "redis")
        (container,) = redis["spec"]["template"]["spec"]["containers"]
        args = " ".join(container["args"])
        assert "--appendonly yes --appendfsync everysec" in args
        assert "--requirepass $(REDIS_PASSWORD)" in args and "--maxmemory-policy noeviction" in args
        data_dir = container["args"][container["args"].index("--dir") + 1]
        (template,) = redis["spec"]["volumeClaimTemplates"]
        assert {"name": template["metadata"]["name"], "mountPath": data_dir} in container[
            "volumeMounts"
        ]
        env = effective_env(objs, container)
        assert env["REDIS_PASSWORD"] == env["REDISCLI_AUTH"]
        address = config_data(objs, "rsieve-config")["REDIS_ADDRESS"]
        host, _, port = address.partition(":")
        service = get(objs, "Service", "redis")
        namespace = service["metadata"]["namespace"]
        # Qualified: the KEDA operator resolves it from its own namespace.
        assert host == f"redis.{namespace}.svc", address
        assert int(port) in {p["port"] for p in service["spec"]["ports"]}


def test_s3_and_triton_endpoints(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objs in each_overlay(rendered):
        config = config_data(objs, "rsieve-config")
        # Each role's address is its own engine's Service, whose pods load its model.
        for role, engine in ENGINES.items():
            host, _, port = config[ENGINE_URL[role]].partition(":")
            assert host == engine, (overlay, role, host)
            service = get(objs, "Service", host)
            assert int(port) in {p["port"] for p in service["spec"]["ports"]}
            grpc = next(p for p in service["spec"]["ports"] if p["port"] == int(port))
            assert grpc["targetPort"] == "grpc", (overlay, engine)
            pods = get(objs, "Deployment", engine)["spec"]["template"]["metadata"]["labels"]
            assert _selects({"matchLabels": service["spec"]["selector"]}, pods), engine
            assert config[ENGINE_MODEL[role]] in loaded_models(
                get(objs, "Deployment", engine)["spec"]["template"]["spec"]["containers"][0]
            )
        endpoint = config["RSIEVE_S3_ENDPOINT"]
        s3_host = endpoint.split("://")[1].split(":")[0].split("/")[0]
        if overlay == "cpu":
            s3 = get(objs, "Service", s3_host)
            assert int(endpoint.rpartition(":")[2]) == s3["spec"]["ports"][0]["port"]
            weed = get(objs, "StatefulSet", "s3")["spec"]["template"]["spec"]["containers"][0]
            env = effective_env(objs, weed)
            assert env["S3_BUCKET"] == config["RSIEVE_S3_BUCKET"]
            api = effective_env(objs, rsieve_container(objs, "api"))
            assert env["AWS_ACCESS_KEY_ID"] == api["RSIEVE_S3_ACCESS_KEY"]
            assert env["AWS_SECRET_ACCESS_KEY"] == api["RSIEVE_S3_SECRET_KEY"]
        else:
            assert find(objs, "Service", s3_host) is None and endpoint.startswith("https://")


def _dotenv_example() -> dict[str, str]:
    return _env_file(REPO / ".env.example")


def test_images_agree_with_compose(rendered: dict[str, list[dict[str, Any]]]) -> None:
    env = _dotenv_example()
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert compose["api"]["image"] == "rsieve:${IMAGE_TAG}"
    assert compose["triton-cpu"]["image"] == "rsieve-triton-cpu:${IMAGE_TAG}"
    tag = env["IMAGE_TAG"]
    for overlay, objs in each_overlay(rendered):
        for service in SERVICE_MODULES:
            assert rsieve_container(objs, service)["image"].endswith(f"rsieve:{tag}")
        for engine in ENGINES.values():
            spec = get(objs, "Deployment", engine)["spec"]["template"]["spec"]
            triton = spec["containers"][0]
            if overlay == "gpu":
                assert triton["image"] == (
                    f"nvcr.io/nvidia/tritonserver:{env['TRITON_VERSION']}-vllm-python-py3"
                )
                # compose's gpu profile: the same engines, by the same names.
                assert compose[engine]["image"] == (
                    "nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-vllm-python-py3"
                )
            else:
                assert triton["image"] == f"rsieve-triton-cpu:{tag}"
            ports = {p["containerPort"] for p in triton["ports"]}
            assert ports == {8000, 8001, 8002}
        redis = get(objs, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
        # compose's default image (.env.example's; compose.env names a local stand-in).
        assert redis["image"] == interpolate(compose["redis"]["image"], env)
    weed = get(rendered["cpu"], "StatefulSet", "s3")["spec"]["template"]["spec"]["containers"][0]
    assert weed["image"] == f"chrislusf/seaweedfs:{env['SEAWEEDFS_VERSION']}"
    api_port = compose["api"]["ports"][0].rpartition(":")[2]
    assert compose["api"]["environment"]["RSIEVE_API_URL"].endswith(f":{api_port}")
    config = config_data(rendered["gpu"], "rsieve-config")
    assert config["RSIEVE_API_URL"].endswith(f":{api_port}")
