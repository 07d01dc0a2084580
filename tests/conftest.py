"""Fixtures that start the real local stack (Redis, SeaweedFS, Triton, the workers and the
API) on free ports in a temporary folder, and stop it after."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest

from rsieve.local.stack import REPO_ROOT, Stack, StackConfig
from rsieve.settings import Settings

TRITON_MODELS = {
    "rapidocr": REPO_ROOT / "deploy" / "triton" / "cpu" / "rapidocr",
    "judge-abstain": REPO_ROOT / "deploy" / "triton" / "cpu" / "judge-abstain",
    "replay": REPO_ROOT / "tests" / "triton_models" / "replay",
    "vlm": REPO_ROOT / "deploy" / "triton" / "hf" / "vlm",
    "vllm-mimic": REPO_ROOT / "tests" / "triton_models" / "vllm-mimic",
    "inflight-probe": REPO_ROOT / "tests" / "triton_models" / "inflight-probe",
    "obedient-judge": REPO_ROOT / "tests" / "triton_models" / "obedient-judge",
}


def stack_settings(stack: Stack) -> Settings:
    return Settings.from_env_map(stack.config.env())


@pytest.fixture(scope="session")
def start_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Stack]]:
    """start_stack(models, settings_env, triton_env) -> a running Stack on free ports."""
    started: list[Stack] = []

    def start(models: list[str], *, settings_env: dict[str, str] | None = None,
              triton_env: dict[str, str] | None = None) -> Stack:
        root = tmp_path_factory.mktemp("stack")
        repo = root / "models"
        for name in models:
            shutil.copytree(TRITON_MODELS[name], repo / name)
        config = StackConfig.free_ports(root / "state", model_repository=repo, models=models,
                                        settings_env=settings_env or {},
                                        triton_env=triton_env or {})
        stack = Stack(config)
        started.append(stack)
        stack.up()
        return stack

    yield start
    for stack in started:
        stack.down()
