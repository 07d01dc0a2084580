"""The engines' opt-in components, checked as data: components/weights (the Job that puts
the checkpoints on the volume triton-models) and components/judge-scale-to-zero.

The gpu overlay is rendered with each component added as docs/deploy.md tells an operator
to (`components: [..., ../../components/weights]`), by this suite's own kustomize
(tests/unit/test_k8s_manifests.py) and by `kubectl kustomize` where kubectl is installed.
Then: the Job downloads exactly the checkpoints model.json names, pinned, unprivileged, with
an optional token it never prints, and it alone mounts the volume read-write; scale to zero
takes the judge's engine and its workers to zero together, the workers waiting for the
engine; and every invariant test_k8s_manifests.py checks still holds with either component.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit import test_k8s_manifests as k8s
from tests.unit.test_k8s_manifests import (
    ENGINE_URL,
    ENGINES,
    K8S,
    REPO,
    _pod_spec,
    config_data,
    find,
    get,
    of_kind,
)
from tests.unit.test_k8s_watch import INVARIANTS, kubectl_render

WEIGHTS = "../../components/weights"
SCALE_TO_ZERO = "../../components/judge-scale-to-zero"
ENDPOINT = "../../components/judge-endpoint"
COMPONENTS = (WEIGHTS, SCALE_TO_ZERO, ENDPOINT)
VLLM = REPO / "deploy" / "triton" / "vllm"
PVC = "triton-models"

Objs = list[dict[str, Any]]


def with_component(tmp: Path, component: str) -> Path:
    """deploy/k8s with the gpu overlay's `.env` and `component` added to its components,
    as docs/deploy.md says; returns the overlay's folder."""
    root = tmp / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns(".env"))
    overlay = root / "overlays" / "gpu"
    shutil.copy(k8s.SECRETS_EXAMPLE, overlay / ".env")
    path = overlay / "kustomization.yaml"
    kust = yaml.safe_load(path.read_text())
    kust.setdefault("components", []).append(component)
    path.write_text(yaml.safe_dump(kust, sort_keys=False))
    return overlay


@pytest.fixture(scope="module")
def overlays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {c: with_component(tmp_path_factory.mktemp(Path(c).name), c) for c in COMPONENTS}


@pytest.fixture(scope="module")
def weights(overlays: dict[str, Path]) -> Objs:
    return k8s.render(overlays[WEIGHTS])


@pytest.fixture(scope="module")
def zero(overlays: dict[str, Path]) -> Objs:
    return k8s.render(overlays[SCALE_TO_ZERO])


ENDPOINT_URL = "https://llm.example.org/v1"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Objs:
    """The gpu overlay with the judge-endpoint component and the patch its comment tells
    the operator to add (the endpoint's URL and the model it serves)."""
    overlay = with_component(tmp_path_factory.mktemp("endpoint-named"), ENDPOINT)
    path = overlay / "kustomization.yaml"
    kust = yaml.safe_load(path.read_text())
    kust["patches"].append(
        {
            "target": {"kind": "ConfigMap", "name": "rsieve-config"},
            "patch": yaml.safe_dump(
                [
                    {
                        "op": "replace",
                        "path": "/data/RSIEVE_JUDGE_OPENAI_URL",
                        "value": ENDPOINT_URL,
                    },
                    {"op": "replace", "path": "/data/RSIEVE_JUDGE_MODEL", "value": "Qwen/Qwen3-8B"},
                ]
            ),
        }
    )
    path.write_text(yaml.safe_dump(kust, sort_keys=False))
    return k8s.render(overlay)


def job_container(objs: Objs) -> dict[str, Any]:
    job = get(objs, "Job", "triton-weights")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def env_values(container: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: str(v["value"]) for v in container.get("env") or [] if "value" in v}


# ---------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("component", COMPONENTS)
def test_both_renderers_agree(component: str, overlays: dict[str, Path]) -> None:
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in kubectl_render(overlays[component])}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in k8s.render(overlays[component])}
    assert sorted(theirs) == sorted(ours), component
    for key, obj in ours.items():
        assert theirs[key] == obj, f"{component}: {key} differs from kubectl kustomize"


@pytest.mark.parametrize(
    "check",
    [
        *INVARIANTS,
        "test_every_tritonserver_loads_exactly_its_models",
        "test_models_match_the_overlay_repository",
        "test_one_engine_per_role_on_its_own_gpu_and_queue",
        "test_each_engine_takes_requests_from_its_role_only",
    ],
)
def test_the_weights_component_keeps_every_invariant(
    check: str,
    weights: Objs,
    rendered: dict[str, Objs],
) -> None:
    # gpu with the component; cpu as shipped (the component is for gpu only).
    getattr(k8s, check)({"cpu": rendered["cpu"], "gpu": weights})


ZERO_EXCEPTIONS = {
    # minReplicaCount 0 for the judge and its engine: the point of the component (checked
    # in test_judge_scale_to_zero below, with what makes it safe).
    "test_keda_reads_redis_as_the_workers_do",
    "test_one_engine_per_role_on_its_own_gpu_and_queue",
}


@pytest.mark.parametrize(
    "check",
    sorted(
        {
            *INVARIANTS,
            "test_every_tritonserver_loads_exactly_its_models",
            "test_each_engine_takes_requests_from_its_role_only",
        }
        - ZERO_EXCEPTIONS
    ),
)
def test_the_scale_to_zero_component_keeps_every_invariant(
    check: str,
    zero: Objs,
    rendered: dict[str, Objs],
) -> None:
    getattr(k8s, check)({"cpu": rendered["cpu"], "gpu": zero})


def test_the_overlays_as_shipped_have_neither_component(
    rendered: dict[str, Objs],
) -> None:
    for overlay, objs in rendered.items():
        assert not of_kind(objs, "Job"), overlay
        kust = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
        assert not set(COMPONENTS) & set(kust.get("components") or []), overlay
        # Warm engines by default.
        for so in of_kind(objs, "ScaledObject"):
            assert so["spec"]["minReplicaCount"] >= 1, (overlay, so["metadata"]["name"])


# ---------------------------------------------------------------------------- the weights Job


def model_json_checkpoints() -> set[str]:
    """Every folder a model.json of deploy/triton/vllm names (`model`, `tokenizer`)."""
    folders = set()
    for path in VLLM.glob("*/1/model.json"):
        engine = json.loads(path.read_text())
        folders |= {engine["model"], engine.get("tokenizer") or engine["model"]}
    return folders


def test_the_job_downloads_what_model_json_names(weights: Objs) -> None:
    container = job_container(weights)
    env = env_values(container)
    repos = env["CHECKPOINTS"].split()
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+", repo) for repo in repos), repos
    assert {f"/models/{repo.rpartition('/')[2]}" for repo in repos} == model_json_checkpoints()
    assert model_json_checkpoints() == {"/models/Qwen3-VL-8B-Thinking"}
    script = container["args"][0]
    assert container["command"] == ["/bin/sh", "-c"] and len(container["args"]) == 1
    assert re.search(r'hf download "\$\{repo\}" --local-dir "/models/\$\{repo##\*/\}"', script)
    # The check at the end reads the model.json files the engines read.
    job = get(weights, "Job", "triton-weights")["spec"]["template"]["spec"]
    mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in job["volumes"]}
    for model, engine in (("vlm", "triton-vlm"), ("judge", "triton-judge")):
        volume = volumes[mounted[f"/repository/{model}"]]
        assert volume["configMap"]["name"] == f"{engine}-repository"
        assert volume["configMap"]["items"] == [{"key": "model.json", "path": "model.json"}]
    assert '"/repository"' in script and "model.json" in script


def test_the_job_is_pinned_unprivileged_and_bounded(weights: Objs) -> None:
    job = get(weights, "Job", "triton-weights")
    spec = job["spec"]["template"]["spec"]
    container = job_container(weights)
    env = env_values(container)
    # Pinned: a python image tag with its minor version and Debian release, and one exact
    # huggingface_hub version (whose CLI is `hf`).
    assert re.fullmatch(r"python:3\.\d+-slim-bookworm", container["image"]), container["image"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", env["HF_HUB_VERSION"])
    assert (
        'pip install --no-cache-dir --quiet "huggingface_hub==${HF_HUB_VERSION}"'
        in (container["args"][0])
    )
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 1000, "the engines' uid"
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["readOnlyRootFilesystem"] is True
    for part in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][part]), part
    assert spec["restartPolicy"] in {"OnFailure", "Never"}
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["activeDeadlineSeconds"] > 0
    # `kubectl wait --for=condition=complete` needs the Job to still be there.
    assert "ttlSecondsAfterFinished" not in job["spec"]
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"]
    assert env["HOME"].startswith("/tmp") and env["HF_HOME"].startswith("/tmp")


def test_the_token_is_optional_and_never_printed(weights: Objs) -> None:
    container = job_container(weights)
    (token,) = [v for v in container["env"] if v["name"] == "HF_TOKEN"]
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is True and ref["key"] == "HF_TOKEN"
    # Not the Secret every pod reads (its keys are placeholders that hf would send).
    assert ref["name"] != "rsieve-secrets"
    script = container["args"][0]
    assert "set -x" not in script and "--token" not in script and "HF_TOKEN" not in script
    assert not re.search(r"set -\w*x", script)


def test_only_the_job_writes_the_volume(weights: Objs) -> None:
    """The Job mounts the PVC read-write; the engines and their clients read-only."""
    writers, readers = [], []
    for obj in weights:
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else _pod_spec(obj)
        if spec is None:
            continue
        claims = {
            v["name"]: v["persistentVolumeClaim"]
            for v in spec.get("volumes") or []
            if v.get("persistentVolumeClaim", {}).get("claimName") == PVC
        }
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for mount in container.get("volumeMounts") or []:
                if mount["name"] in claims:
                    name = obj["metadata"]["name"]
                    assert mount["mountPath"] == "/models", name
                    if mount.get("readOnly") or claims[mount["name"]].get("readOnly"):
                        assert mount.get("readOnly") and claims[mount["name"]]["readOnly"], name
                        readers.append(name)
                    else:
                        writers.append(name)
    assert writers == ["triton-weights"]
    assert sorted(readers) == sorted([*ENGINES, *ENGINES.values()])
    assert get(weights, "PersistentVolumeClaim", PVC)["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_job_matches_the_kubernetes_schema(weights: Objs) -> None:
    validate = pytest.importorskip("kubernetes_validate")
    from tests.unit.test_k8s_schemas import KUBERNETES_VERSION

    validate.validate(get(weights, "Job", "triton-weights"), KUBERNETES_VERSION, strict=True)


def test_the_job_script_fails_when_a_checkpoint_is_missing(tmp_path: Path, weights: Objs) -> None:
    """The Job's own script, run with a stand-in `hf` (no network) and its paths moved under
    a temporary folder: it downloads each repository to its folder, then fails unless every
    folder that a model.json names holds a checkpoint."""
    script = job_container(weights)["args"][0]
    for path in ("/tmp/venv", "/models", "/repository"):
        script = script.replace(path, f"{tmp_path}{path}")
    for model in ("vlm", "judge"):
        (tmp_path / "repository" / model).mkdir(parents=True)
        engine = json.loads((VLLM / model / "1" / "model.json").read_text())
        for key in ("model", "tokenizer"):
            engine[key] = f"{tmp_path}{engine[key]}"
        (tmp_path / "repository" / model / "model.json").write_text(json.dumps(engine))
    # `python -m venv DIR` makes a venv whose pip records its arguments and whose hf writes
    # a checkpoint's marker files where --local-dir says; any other python call is Python.
    fake = tmp_path / "fake-venv-bin"
    fake.mkdir()
    (fake / "pip").write_text(f'#!/bin/sh\necho "pip $*" >> {tmp_path}/calls\n')
    (fake / "hf").write_text(
        f'#!/bin/sh\necho "hf $*" >> {tmp_path}/calls\nmkdir -p "$4"\n'
        ': > "$4/config.json"\n: > "$4/tokenizer_config.json"\n'
    )
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python").write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3" && cp -r {fake} "$3/bin"
  exit 0
fi
exec {sys.executable} "$@"
""")
    for shim in (fake / "pip", fake / "hf", shims / "python"):
        shim.chmod(0o755)
    env = {**env_values(job_container(weights)), "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}

    def run(checkpoints: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", "-c", script],
            env={**env, "CHECKPOINTS": checkpoints},
            capture_output=True,
            text=True,
            timeout=60,
        )

    wrong = run("someone/Other-Model")
    assert wrong.returncode != 0
    assert "Qwen3-VL-8B-Thinking has no config.json" in wrong.stderr
    out = run(env["CHECKPOINTS"])
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert f"pip install --no-cache-dir --quiet huggingface_hub=={env['HF_HUB_VERSION']}" in calls
    assert (
        f"hf download Qwen/Qwen3-VL-8B-Thinking --local-dir {tmp_path}/models/Qwen3-VL-8B-Thinking"
    ) in calls


# ---------------------------------------------------------------------------- scale to zero


def test_judge_scale_to_zero(zero: Objs, rendered: dict[str, Objs]) -> None:
    scalers = {so["spec"]["scaleTargetRef"]["name"]: so for so in of_kind(zero, "ScaledObject")}
    # The judge's engine and its workers go to zero together; everything else stays warm,
    # so some live worker always runs kombu's restore sweep (one unacked index per Redis
    # database, restored by any worker).
    assert {n for n, so in scalers.items() if so["spec"]["minReplicaCount"] == 0} == {
        "judge",
        "triton-judge",
    }
    assert all(
        so["spec"]["minReplicaCount"] >= 1
        for n, so in scalers.items()
        if n not in {"judge", "triton-judge"}
    )
    # Woken by the same list.
    lists = {
        n: [t["metadata"]["listName"] for t in scalers[n]["spec"]["triggers"]]
        for n in ("judge", "triton-judge")
    }
    assert lists["judge"] == lists["triton-judge"] == ["judge"]
    # The engine outlives the workers' last shard: they go first and drain it.
    judge = get(zero, "Deployment", "judge")["spec"]["template"]["spec"]
    grace = judge["terminationGracePeriodSeconds"]
    assert scalers["triton-judge"]["spec"]["cooldownPeriod"] >= (
        scalers["judge"]["spec"]["cooldownPeriod"] + grace
    )
    # A worker consumes nothing before its engine is ready.
    (wait,) = judge["initContainers"]
    script = "\n".join(wait["command"])
    url = re.search(r'"(http://[^"]+)"', script)
    assert url, script
    host, _, rest = url.group(1).removeprefix("http://").partition(":")
    port, _, path = rest.partition("/")
    config = config_data(zero, "rsieve-config")
    assert host == config[ENGINE_URL["judge"]].partition(":")[0] == "triton-judge"
    service = get(zero, "Service", host)
    assert {"name": "http", "port": int(port), "targetPort": "http"} in service["spec"]["ports"]
    assert f"/{path}" == "/v2/health/ready"
    assert (
        wait["image"]
        == get(zero, "Deployment", "judge")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    # The rest of the judge Deployment is as shipped.
    shipped = get(rendered["gpu"], "Deployment", "judge")["spec"]["template"]["spec"]
    assert {k: v for k, v in judge.items() if k != "initContainers"} == shipped
    assert find(rendered["gpu"], "Deployment", "judge") is not None


# ---------------------------------------------------------------------------- judge endpoint


# The invariants about the judge's own Triton engine, which this component removes; what
# replaces each is asserted in test_the_judge_endpoint_replaces_the_judges_engine.
ABOUT_THE_JUDGES_ENGINE = {
    "test_every_service_has_a_deployment": "triton-judge is gone",
    "test_gpus_only_where_intended": "one GPU Deployment left (triton-vlm)",
    "test_probes": "triton-judge's probes are gone with it",
    "test_s3_and_triton_endpoints": "no Service triton-judge to point at",
    "test_images_agree_with_compose": "compose runs both engines",
    "test_clients_read_the_tokenizer_of_the_served_checkpoint": "the endpoint serves it",
    "test_the_judges_are_language_models": "the endpoint's model, named by the overlay",
}


@pytest.mark.parametrize("check", [c for c in INVARIANTS if c not in ABOUT_THE_JUDGES_ENGINE])
def test_the_judge_endpoint_component_keeps_the_other_invariants(
    check: str,
    endpoint: Objs,
    rendered: dict[str, Objs],
) -> None:
    getattr(k8s, check)({"cpu": rendered["cpu"], "gpu": endpoint})


def test_the_judge_endpoint_replaces_the_judges_engine(
    endpoint: Objs, overlays: dict[str, Path]
) -> None:
    from rsieve.adapters.model import open_model
    from rsieve.adapters.openai_compat import OpenAIModel
    from rsieve.settings import Settings

    gone = [
        (o["kind"], o["metadata"]["name"])
        for o in endpoint
        if "triton-judge" in o["metadata"]["name"]
        or "triton-judge" in json.dumps(o.get("spec", {}))
    ]
    assert gone == []
    assert find(endpoint, "Deployment", "triton-vlm") is not None  # the generator's stays
    judge = get(endpoint, "Deployment", "judge")
    (container,) = judge["spec"]["template"]["spec"]["containers"]
    [key] = [e for e in container["env"] if e["name"] == "RSIEVE_JUDGE_OPENAI_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {
        "name": "rsieve-secrets",
        "key": "JUDGE_OPENAI_KEY",
        "optional": True,
    }
    config = config_data(endpoint, "rsieve-config")
    assert config["RSIEVE_JUDGE_INTERFACE"] == "openai"
    assert "RSIEVE_JUDGE_OPENAI_KEY" not in config  # the key lives in the Secret only
    # As the judge pod sees it: the ConfigMap and the Secret (placeholders here).
    secrets = {"RSIEVE_S3_ACCESS_KEY": "k" * 20, "RSIEVE_S3_SECRET_KEY": "s" * 40}
    model = open_model(Settings.from_env_map(config | secrets), "judge")
    assert isinstance(model, OpenAIModel)
    assert (model.base_url, model.model) == (ENDPOINT_URL, "Qwen/Qwen3-8B")
    # Until the overlay names the endpoint, the judge refuses to start, saying what to set.
    bare = config_data(k8s.render(overlays[ENDPOINT]), "rsieve-config")
    with pytest.raises(ValueError, match="RSIEVE_JUDGE_OPENAI_URL"):
        Settings.from_env_map(bare | secrets)
