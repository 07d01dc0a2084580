"""Checkpoints built on the spot, for tests and benches (no hub is reachable): the tiny
random-weight LLaVA of scripts/build_tiny_vlm.py, the one place it is written. The script is
loaded from its file, since scripts/ is not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_tiny_vlm(out: Path) -> Path:
    """Write the tiny LLaVA checkpoint (weights, processor, chat template) into `out`."""
    spec = importlib.util.spec_from_file_location(
        "build_tiny_vlm", ROOT / "scripts" / "build_tiny_vlm.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.build_tiny_vlm(out))
