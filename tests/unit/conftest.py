"""Fixtures the unit modules share (a fixture imported from another test module needs a
noqa at every test that names it)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_k8s_manifests import K8S, OVERLAYS, SECRETS_EXAMPLE, render


@pytest.fixture(scope="module")
def k8s_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/k8s with each overlay's `.env` made from secrets.env.example, as a user does."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns(".env"))
    for overlay in OVERLAYS:
        shutil.copy(SECRETS_EXAMPLE, root / "overlays" / overlay / ".env")
    return root


@pytest.fixture(scope="module")
def rendered(k8s_copy: Path) -> dict[str, list[dict[str, Any]]]:
    """Each overlay rendered by `kubectl kustomize`: overlay -> its objects."""
    return {overlay: render(k8s_copy / "overlays" / overlay) for overlay in OVERLAYS}
