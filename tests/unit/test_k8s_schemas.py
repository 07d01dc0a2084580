"""The rendered Kubernetes manifests against the Kubernetes and KEDA schemas, and
docker-compose.yml against the Compose specification, all offline: the Kubernetes schemas
ship with PyPI kubernetes-validate, the Compose schema with PyPI check-jsonschema, the KEDA
schemas live in deploy/k8s/schemas (README.md there says where they come from)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from tests.unit.test_k8s_manifests import K8S, OVERLAYS, REPO

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (dev extra) not installed"
)

# The oldest Kubernetes the manifests must be valid for (unhealthyPodEvictionPolicy is GA in
# 1.31; every field used here exists there).
KUBERNETES_VERSION = "1.31.0"
KEDA_SCHEMAS = {
    "ScaledObject": K8S / "schemas" / "keda-scaledobject-v1alpha1.json",
    "TriggerAuthentication": K8S / "schemas" / "keda-triggerauthentication-v1alpha1.json",
}


def _keda_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads(KEDA_SCHEMAS[kind].read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_objects_match_their_schemas(
    overlay: str,
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    checked = 0
    for obj in rendered[overlay]:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(
                f"{overlay}: {obj['kind']}/{obj['metadata']['name']} at {path}: {exc.message}"
            )
        checked += 1
    assert checked >= 25


def test_kubernetes_schema_refuses_a_misspelt_field(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = next(o for o in rendered["gpu"] if o["kind"] == "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_objects_match_their_schemas(
    overlay: str,
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    validators = {kind: _keda_validator(kind) for kind in KEDA_SCHEMAS}
    keda = [o for o in rendered[overlay] if o["apiVersion"].startswith("keda.sh/")]
    assert {o["kind"] for o in keda} == set(KEDA_SCHEMAS)
    for obj in keda:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        errors = sorted(validators[obj["kind"]].iter_errors(obj), key=str)
        assert not errors, (obj["metadata"]["name"], [e.message for e in errors])


def test_keda_schema_refuses_a_misspelt_field(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    scaled = next(o for o in rendered["gpu"] if o["kind"] == "ScaledObject")
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["minReplicas"] = bad["spec"].pop("minReplicaCount")
    assert list(_keda_validator("ScaledObject").iter_errors(bad))
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["triggers"][0]["authenticationRef"] = "rsieve-redis"
    assert list(_keda_validator("ScaledObject").iter_errors(bad))


def test_compose_file_matches_the_compose_specification() -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema (dev extra) not installed")
    vendor = resources.files("check_jsonschema") / "builtin_schemas" / "vendor"
    schema = json.loads((vendor / "compose-spec.json").read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(compose), key=str)
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors]
