"""Checkpoints built on the spot, for tests and benches (no hub is reachable): the tiny
random-weight LLaVA of scripts/build_tiny_vlm.py, the one place it is written."""

from __future__ import annotations

from pathlib import Path


def build_tiny_vlm(out: Path) -> Path:
    """Write the tiny LLaVA checkpoint (weights, processor, chat template) into `out`."""
    from scripts import build_tiny_vlm as script

    return Path(script.build_tiny_vlm(out))
