"""KEDA JSON schemas from cloudcoil-models-keda (pydantic models generated from KEDA's CRDs).

Usage (not a dependency of rsieve; see README.md beside this file):
    PYTHONPATH=/tmp/keda python deploy/k8s/schemas/make_keda_schemas.py deploy/k8s/schemas
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

from cloudcoil.models.keda import v1alpha1 as keda


def strict(node):
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


out = Path(sys.argv[1])
for cls in (keda.ScaledObject, keda.TriggerAuthentication):
    schema = strict(cls.model_json_schema(by_alias=True, mode="validation"))
    schema["$comment"] = (
        f"Generated from cloudcoil-models-keda {version('cloudcoil-models-keda')} "
        f"({cls.__module__}.{cls.__name__}), additionalProperties false added: "
        "see deploy/k8s/schemas/README.md"
    )
    name = f"keda-{cls.__name__.lower()}-v1alpha1.json"
    (out / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(name)
