"""deploy/k8s/components/watch: the Celery beat of continuous ingestion, checked as data.

Each overlay is rendered with the component added as docs/deploy.md tells an operator to
(`components: [../../components/watch]`; in gpu also the patch that sets the prefix), by
this suite's own kustomize (tests/unit/test_k8s_manifests.py) and by `kubectl kustomize`
where kubectl is installed. Then: exactly one beat, never two at once, never scaled, running
services.cleaner.beat with the cleaner's settings; the overlays as shipped run no beat; and
every invariant test_k8s_manifests.py checks still holds with the component in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rsieve.run.watch import watch_prefix
from services.cleaner.beat import beat_schedule
from tests.unit import test_k8s_manifests as k8s
from tests.unit.test_k8s_manifests import (
    K8S,
    OVERLAYS,
    REPO,
    config_data,
    effective_env,
    find,
    get,
    of_kind,
    rsieve_container,
    settings_of,
)

COMPONENT = "../../components/watch"
DEFAULT_PREFIX = "incoming/"  # components/watch/kustomization.yaml
OPERATOR_PREFIX = "scans/incoming/"  # what the gpu overlay's operator sets below
ENTRYPOINT = REPO / "deploy" / "docker" / "entrypoint.sh"

Objs = list[dict[str, Any]]


def enable_watch(overlay: Path, prefix: str | None) -> None:
    """What docs/deploy.md says to do: add the component, optionally set the prefix."""
    path = overlay / "kustomization.yaml"
    kust = yaml.safe_load(path.read_text())
    kust.setdefault("components", []).append(COMPONENT)
    if prefix is not None:
        kust.setdefault("patches", []).append(
            {
                "target": {"kind": "ConfigMap", "name": "rsieve-config"},
                "patch": yaml.safe_dump(
                    [{"op": "replace", "path": "/data/RSIEVE_WATCH_PREFIX", "value": prefix}]
                ),
            }
        )
    path.write_text(yaml.safe_dump(kust, sort_keys=False))


@pytest.fixture(scope="module")
def watch_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("k8s-watch") / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns(".env"))
    for overlay in OVERLAYS:
        shutil.copy(k8s.SECRETS_EXAMPLE, root / "overlays" / overlay / ".env")
        enable_watch(root / "overlays" / overlay, OPERATOR_PREFIX if overlay == "gpu" else None)
    return root


def kubectl_render(root: Path) -> Objs:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (Debian: apt-get install kubernetes-client)")
    out = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [o for o in yaml.safe_load_all(out.stdout) if o]


RENDERERS: dict[str, Callable[[Path], Objs]] = {"render": k8s.render, "kubectl": kubectl_render}


@pytest.fixture(scope="module", params=sorted(RENDERERS))
def watched(request: pytest.FixtureRequest, watch_copy: Path) -> dict[str, Objs]:
    """Each overlay with the watch component, by one of the two renderers."""
    renderer = RENDERERS[request.param]
    return {overlay: renderer(watch_copy / "overlays" / overlay) for overlay in OVERLAYS}


def beat_deployments(objs: Objs) -> list[dict[str, Any]]:
    """Every Deployment or StatefulSet whose pods would run a Celery beat, by whatever name."""
    found = []
    for obj in objs:
        if obj["kind"] not in k8s.POD_KINDS:
            continue
        for container in k8s._containers(obj):
            argv = [*container.get("command", []), *container.get("args", [])]
            if (
                argv[:1] == ["beat"]
                or any("services.cleaner.beat" in str(a) for a in argv)
                or ("beat" in argv and "celery" in " ".join(map(str, argv)))
            ):
                found.append(obj)
    return found


def beat_container(objs: Objs) -> dict[str, Any]:
    (container,) = get(objs, "Deployment", "beat")["spec"]["template"]["spec"]["containers"]
    return container


# ---------------------------------------------------------------------------- the beat


def test_exactly_one_beat_never_two_at_once(watched: dict[str, Objs]) -> None:
    for overlay, objs in watched.items():
        (beat,) = beat_deployments(objs)
        assert (beat["kind"], beat["metadata"]["name"]) == ("Deployment", "beat"), overlay
        assert beat["spec"]["replicas"] == 1, overlay
        # Recreate: the old pod is gone before the new one starts (a RollingUpdate, even with
        # maxSurge 0, is not a promise of that).
        assert beat["spec"]["strategy"] == {"type": "Recreate"}, overlay


def test_the_beat_runs_services_cleaner_beat(watched: dict[str, Objs], tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$PWD|$*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    for overlay, objs in watched.items():
        container = beat_container(objs)
        pod = get(objs, "Deployment", "beat")["spec"]["template"]["spec"]
        # The image's entrypoint, as every rsieve container: it maps `beat` to the module.
        assert "command" not in container, overlay
        args = container["args"]
        out = subprocess.run(
            [str(ENTRYPOINT), *args], env=env, cwd="/", capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        cwd, _, argv = out.stdout.strip().partition("|")
        assert cwd == str(REPO) and argv.split()[:2] == ["-m", "services.cleaner.beat"], out
        # The state file lies on an emptyDir (the root filesystem is read-only).
        schedule = args[args.index("--schedule") + 1]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = [
            m
            for m in container["volumeMounts"]
            if schedule.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        assert mounts, f"{overlay}: {schedule} is on no volume"
        deepest = max(mounts, key=lambda m: len(m["mountPath"]))
        assert "emptyDir" in volumes[deepest["name"]], (overlay, deepest)
        assert not deepest.get("readOnly"), overlay


def test_the_beat_gets_the_cleaners_settings(watched: dict[str, Objs]) -> None:
    for overlay, objs in watched.items():
        beat, cleaner = beat_container(objs), rsieve_container(objs, "cleaner")
        assert beat["image"] == cleaner["image"], overlay
        assert beat["envFrom"] == cleaner["envFrom"], overlay
        assert beat["env"] == cleaner["env"], overlay
        env = effective_env(objs, beat)
        assert env == effective_env(objs, cleaner), overlay
        settings = settings_of(env)
        assert settings.environment == "production"
        # Set through rsieve-config, so the cleaners that run the looks list the same prefix.
        config = config_data(objs, "rsieve-config")
        wanted = OPERATOR_PREFIX if overlay == "gpu" else DEFAULT_PREFIX
        assert config["RSIEVE_WATCH_PREFIX"] == wanted, overlay
        assert settings.watch_prefix == wanted and watch_prefix(settings.watch_prefix), overlay
        # A non-empty schedule, to the cleaner's queue (an empty one would exit 0 and the
        # pod would restart forever).
        schedule = beat_schedule(settings)
        assert set(schedule) == {"rsieve-watch", "rsieve-sweep"}, overlay
        assert schedule["rsieve-watch"]["task"] == "rsieve.watch", overlay
        for entry in schedule.values():
            assert entry["options"]["queue"] == k8s.WORKER_QUEUES["cleaner"], overlay


def test_nothing_scales_the_beat(watched: dict[str, Objs]) -> None:
    for overlay, objs in watched.items():
        scaled = of_kind(objs, "ScaledObject")
        assert scaled, f"{overlay}: no ScaledObjects at all: this check would be vacuous"
        for so in scaled:
            target = so["spec"]["scaleTargetRef"]
            assert target["name"] != "beat", (overlay, so["metadata"]["name"])
            assert find(objs, "Deployment", target["name"]) is not None, target
        for hpa in of_kind(objs, "HorizontalPodAutoscaler"):
            assert hpa["spec"]["scaleTargetRef"]["name"] != "beat", overlay


def test_the_beat_is_probed_small_and_reaches_redis(watched: dict[str, Objs]) -> None:
    for overlay, objs in watched.items():
        beat, cleaner = beat_container(objs), rsieve_container(objs, "cleaner")
        assert beat["livenessProbe"] == cleaner["livenessProbe"], overlay
        requests = beat["resources"]["requests"]
        assert k8s_cpu(requests["cpu"]) <= 0.1 and k8s_mebibytes(requests["memory"]) <= 256
        assert k8s_cpu(requests["cpu"]) <= k8s_cpu(cleaner["resources"]["requests"]["cpu"])
        labels = get(objs, "Deployment", "beat")["spec"]["template"]["metadata"]["labels"]
        redis = get(objs, "NetworkPolicy", "redis-ingress")
        sources = redis["spec"]["ingress"][0]["from"]
        assert any(
            "podSelector" in s and k8s._selects(s["podSelector"], labels) for s in sources
        ), f"{overlay}: the beat cannot reach Redis"


def k8s_cpu(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def k8s_mebibytes(value: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(value[:-2]) * units[value[-2:]]


# ---------------------------------------------------------------------------- the rest holds


INVARIANTS = (
    "test_objects_are_unique_and_namespaced",
    "test_every_service_has_a_deployment",
    "test_settings_env_and_configmap_keys_are_fields",
    "test_every_setting_is_deployed_and_valid",
    "test_every_reference_resolves",
    "test_secrets_example_matches_what_is_referenced",
    "test_every_queue_has_a_worker_and_a_scaledobject",
    "test_keda_reads_redis_as_the_workers_do",
    "test_gpus_only_where_intended",
    "test_probes",
    "test_workers_get_time_to_finish_their_shard",
    "test_pods_run_unprivileged",
    "test_resources_are_bounded",
    "test_every_workload_has_a_pdb",
    "test_network_policies",
    "test_redis_is_durable_and_where_the_settings_say",
    "test_s3_and_triton_endpoints",
    "test_images_agree_with_compose",
    "test_clients_read_the_tokenizer_of_the_served_checkpoint",
    "test_the_judges_are_language_models",
    "test_a_run_has_one_identity",
)


@pytest.mark.parametrize("check", INVARIANTS)
def test_the_component_keeps_every_invariant(check: str, watched: dict[str, Objs]) -> None:
    getattr(k8s, check)(watched)


def test_both_renderers_agree(watch_copy: Path) -> None:
    for overlay in OVERLAYS:
        root = watch_copy / "overlays" / overlay
        theirs = {(o["kind"], o["metadata"]["name"]): o for o in kubectl_render(root)}
        ours = {(o["kind"], o["metadata"]["name"]): o for o in k8s.render(root)}
        assert sorted(theirs) == sorted(ours), overlay
        for key, obj in ours.items():
            assert theirs[key] == obj, f"{overlay}: {key} differs from kubectl kustomize"


def test_beat_objects_match_the_kubernetes_schema(watch_copy: Path) -> None:
    validate = pytest.importorskip("kubernetes_validate")
    from tests.unit.test_k8s_schemas import KUBERNETES_VERSION

    objs = k8s.render(watch_copy / "overlays" / "gpu")
    for kind in ("Deployment", "PodDisruptionBudget"):
        validate.validate(get(objs, kind, "beat"), KUBERNETES_VERSION, strict=True)


# ---------------------------------------------------------------------------- off by default


def test_the_overlays_as_shipped_run_no_beat(rendered: dict[str, Objs]) -> None:
    for overlay, objs in rendered.items():
        assert beat_deployments(objs) == [], overlay
        assert find(objs, "PodDisruptionBudget", "beat") is None, overlay
        # Watching off: the cleaners do not look either.
        assert not config_data(objs, "rsieve-config").get("RSIEVE_WATCH_PREFIX"), overlay
        kust = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
        assert COMPONENT not in (kust.get("components") or []), overlay
