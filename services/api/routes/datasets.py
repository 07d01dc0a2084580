"""Published datasets (datasets/<name>/manifest.json, written last by the compactor)."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, HTTPException

from rsieve import keys
from rsieve.errors import NotFoundError
from rsieve.schemas import DATASET_PATTERN
from services.api.deps import Authorised
from services.api.models import DatasetPublic, DatasetsPublic

router = APIRouter(prefix="/datasets", tags=["datasets"])


def _public(name: str, manifest: dict[str, Any]) -> DatasetPublic:
    return DatasetPublic(
        dataset=name,
        run=manifest["run"],
        adds_up=manifest.get("adds_up"),
        runs=manifest.get("runs") or [manifest["run"]],
        splits=manifest.get("splits", {}),
        files=list(manifest.get("files", [])),
    )


@router.get("", response_model=DatasetsPublic)
def list_datasets(ctx: Authorised) -> DatasetsPublic:
    names = sorted(
        name
        for k in ctx.store.list(keys.DATASETS_PREFIX)
        if (name := keys.dataset_of_manifest(k)) is not None
    )
    data = [_public(n, json.loads(ctx.store.get(keys.manifest(n)))) for n in names]
    return DatasetsPublic(data=data, count=len(data))


@router.get("/{name}", response_model=DatasetPublic)
def dataset(name: str, ctx: Authorised) -> DatasetPublic:
    if not re.match(DATASET_PATTERN, name):
        raise HTTPException(404, f"no published dataset {name!r}")
    try:
        manifest = json.loads(ctx.store.get(keys.manifest(name)))
    except NotFoundError:
        raise HTTPException(404, f"no published dataset {name!r}") from None
    return _public(name, manifest)
