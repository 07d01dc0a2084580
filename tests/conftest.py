"""Fixtures that start the real local stack (Redis, SeaweedFS, Triton, the workers and the
API) on free ports in a temporary folder, and stop it after."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from rsieve.settings import Settings
from rsieve_cli.local.checkpoints import smollm2_checkpoint
from rsieve_cli.local.ports import PORT_RANGE_ENV
from rsieve_cli.local.stack import (
    JUDGE_CHECKPOINT_ENV,
    LLAMA_JUDGES,
    REPO_ROOT,
    SMOLLM2_MODEL,
    Stack,
    StackConfig,
)

TRITON_MODELS = {
    "rapidocr": REPO_ROOT / "deploy" / "triton" / "cpu" / "rapidocr",
    "judge-abstain": REPO_ROOT / "deploy" / "triton" / "cpu" / "judge-abstain",
    # SmolLM2-135M-Instruct; needs RSIEVE_JUDGE_CHECKPOINT (triton_model_env; a Stack sets it).
    SMOLLM2_MODEL: REPO_ROOT / "deploy" / "triton" / "cpu" / SMOLLM2_MODEL,
    "replay": REPO_ROOT / "tests" / "triton_models" / "replay",
    "vlm": REPO_ROOT / "deploy" / "triton" / "hf" / "vlm",
    "vllm-mimic": REPO_ROOT / "tests" / "triton_models" / "vllm-mimic",
    "inflight-probe": REPO_ROOT / "tests" / "triton_models" / "inflight-probe",
    "obedient-judge": REPO_ROOT / "tests" / "triton_models" / "obedient-judge",
    "stochastic-standin": REPO_ROOT / "tests" / "triton_models" / "stochastic-standin",
    # The benchmark's continuous-batching engine stand-in (bench/README.md).
    "vllm-engine-standin": REPO_ROOT / "bench" / "triton_models" / "vllm-engine-standin",
}


TESTS = Path(__file__).resolve().parent


# The suite's tiers: what a test needs beyond Python. `make test-fast` runs the tests with
# none of them (the edit-test loop, no service started); `make test` runs everything.
TIERS = {
    "stack": "starts the real local stack (Redis, SeaweedFS, Triton, the workers, the API)",
    "triton": "starts a Triton server of its own",
    "model": "runs a real model (SmolLM2, Qwen, a tiny VLM, transformers serve, TRL)",
    "deploy": "runs kubectl (kustomize) or docker on the deployment files",
    "browser": "drives Chromium",
}
# By module path under tests/, where the module as a whole needs the tier (tests/e2e is
# `stack` by folder). By path, not by name: tests/unit/test_engine_standin.py (pure rules)
# and tests/integration/test_engine_standin.py (a Triton of its own) share a name.
_TIER_MODULES = {
    "integration/test_compose_s3.py": ("stack",),
    "compose/test_compose_stack.py": ("deploy", "stack"),
    "integration/test_engine_standin.py": ("triton",),
    "integration/test_generator_models.py": ("triton", "model"),
    "integration/test_judge_qwen_stack.py": ("model",),
    "integration/test_judge_real_smollm2.py": ("triton", "model"),
    "integration/test_judge_smollm2.py": ("triton", "model"),
    "integration/test_triton_models.py": ("triton",),
    "unit/test_k8s_engines.py": ("deploy",),
    "unit/test_k8s_manifests.py": ("deploy",),
    "unit/test_k8s_watch.py": ("deploy",),
    "unit/test_models_chat.py": ("model",),
    "unit/test_purity_embedder.py": ("model",),
    "unit/test_trainer_collation.py": ("model",),
    "unit/test_training_loop_trainers.py": ("model",),
    "unit/test_verl_layout.py": ("model",),
    "e2e/test_review_page.py": ("stack", "browser"),
}


def pytest_configure(config: pytest.Config) -> None:
    # Hugging Face datasets caches what load_dataset reads under ~/.cache, keyed by the
    # folder's name and its files: a test's export loaded from a path an earlier session
    # used came back from that session's cache. Each session (each xdist worker) gets its
    # own, set before any test module imports datasets (which reads it on import).
    hf_cache = tempfile.mkdtemp(prefix="rsieve-tests-hf-")
    os.environ["HF_DATASETS_CACHE"] = hf_cache
    atexit.register(shutil.rmtree, hf_cache, ignore_errors=True)
    # Each pytest-xdist worker (and a run without workers, as gw0) takes its stacks' ports
    # from 1,000 of its own, below the kernel's ephemeral range (32768 and up here): two
    # workers never pick one port, nor does an outgoing connection meanwhile. SeaweedFS's
    # gRPC port is its port + 10000, still below the ephemeral range for ten workers.
    # The controller of a run with workers starts no stack and sets nothing: its
    # environment is the workers', and a range set there would be every worker's.
    controller = bool(config.getoption("numprocesses", None)) and not hasattr(config, "workerinput")
    if not controller:
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        low = 12000 + 1000 * (worker % 10)
        os.environ.setdefault(PORT_RANGE_ENV, f"{low}-{low + 999}")
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


# `make test` runs the suite on pytest-xdist workers, a group to a worker, the groups
# handed out in the suite's order (docs/testing.md). A group is a module, so its
# module-scoped stack starts once, except:
# - the modules that run a real model on the CPU: one group, one after another on one
#   worker, since side by side they only share the two cores and each takes longer;
# - the modules that share a stack (`SHARED_STACK`): one group per stack.
# The groups are xdist's work units (GroupScheduling below), not `xdist_group` marks:
# xdist 3.8 tells a mark's group by a suffix it writes into the item's node id, which
# pytest 9.2 no longer reads from there, so marked tests were spread one by one.
_CPU_MODELS = "cpu-models"
_CPU_MODEL_MODULES = (
    "test_openai_judge",
    "test_cli_qwen_judge",
    "test_judge_smollm2",
    "test_cli_smollm2_judge",
    "test_judge_qwen_stack",
    "test_judge_real_smollm2",
    "test_generator_models",
)
# The longest groups first, so that none starts last and runs alone at the end (measured,
# docs/testing.md). Only the order depends on this list.
_LONGEST_FIRST = (_CPU_MODELS, "test_faults", "test_orphans", "test_generator_engine")
_SHARED_STACK = re.compile(r'^SHARED_STACK\s*=\s*"([^"]+)"', re.MULTILINE)


@functools.cache
def _group(module: str) -> str:
    """The work unit of the module at `module` (a path relative to the suite's root)."""
    path = Path(module)
    if path.stem in _CPU_MODEL_MODULES:
        return _CPU_MODELS
    source = REPO_ROOT / path
    shared = _SHARED_STACK.search(source.read_text()) if source.is_file() else None
    return f"stack-{shared.group(1)}" if shared else module


def _start_rank(item: pytest.Item) -> int:
    group = _group(item.nodeid.split("::")[0])
    stem = group.rsplit("/", 1)[-1].removesuffix(".py")
    return _LONGEST_FIRST.index(stem) if stem in _LONGEST_FIRST else len(_LONGEST_FIRST)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope`: each worker takes whole groups (`_group`), in the order
    collected (add `--no-loadscope-reorder`, or xdist puts the groups of most tests first)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::")[0])

    return GroupScheduling(config, log)


def _path_tiers(path: Path) -> set[str]:
    """The tiers a module or folder under tests/ has by its path alone."""
    tiers = set(_TIER_MODULES.get(path.relative_to(TESTS).as_posix(), ()))
    if "e2e" in path.relative_to(TESTS).parts:
        tiers.add("stack")
    return tiers


_MARK_WORDS = re.compile(r"\w+|\S")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Not even imported: a module whose tiers by path `-m` deselects, when
    `-m` names only tiers. `make test-fast` then imports no e2e or integration module and
    assertion-rewrites none (about 1.5 s a process). A test can gain one tier beyond its
    path's, `stack` through `start_stack`: the module is kept if that would select it."""
    expression = config.getoption("markexpr", "")
    if not expression or not collection_path.is_relative_to(TESTS):
        return None
    words = _MARK_WORDS.findall(expression)
    if not set(words) <= {*TIERS, "and", "or", "not", "(", ")"}:
        return None
    if not collection_path.is_file():  # a folder's modules may have tiers of their own
        return None
    tiers = _path_tiers(collection_path)

    def selects(present: set[str]) -> bool:
        python = " ".join(str(w in present) if w in TIERS else w for w in words)
        return bool(eval(python, {"__builtins__": {}}))  # only True/False, and, or, not

    return None if selects(tiers) or selects(tiers | {"stack"}) else True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: within a group, and among the rest, as collected
    for item in items:
        tiers = _path_tiers(item.path)
        if "start_stack" in getattr(item, "fixturenames", ()):
            tiers.add("stack")
        for tier in sorted(tiers):
            item.add_marker(getattr(pytest.mark, tier))


def triton_model_env(models: Iterable[str]) -> dict[str, str]:
    """The environment Triton needs for ``models`` beyond the defaults: the SmolLM2 judge's
    checkpoint folder (prepared once, cached in var/models) when judge-smollm2 is among them.
    For tests that start tritonserver themselves; ``Stack.up`` does the same."""
    if SMOLLM2_MODEL in models:
        return {JUDGE_CHECKPOINT_ENV: str(smollm2_checkpoint())}
    return {}


def stack_settings(stack: Stack) -> Settings:
    return Settings.from_env_map(stack.config.env())


def stack_starter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Stack]]:
    """start_stack(models, settings_env, triton_env) -> a running Stack on free ports.

    Triton loads only ``models``; the generator and the judge the services are set to use
    must be among them (name them in ``settings_env``; without RSIEVE_JUDGE_MODEL the stack
    picks the CPU judge it serves, judge-smollm2 or judge-abstain).

    Module-scoped: a module's stacks stop when the module ends. Kept to the session's end,
    seventeen stacks (about 170 processes, a llama.cpp judge among them) shared two cores
    and 24 GB by the last module, and Triton's Python stubs were killed for memory."""
    started: list[Stack] = []

    def start(
        models: list[str],
        *,
        settings_env: dict[str, str] | None = None,
        triton_env: dict[str, str] | None = None,
    ) -> Stack:
        root = tmp_path_factory.mktemp("stack")
        repo = root / "models"
        for name in models:
            if name not in LLAMA_JUDGES:  # a llama.cpp judge has a server of its own
                shutil.copytree(TRITON_MODELS[name], repo / name)
        config = StackConfig.free_ports(
            root / "state",
            model_repository=repo,
            models=models,
            settings_env=settings_env or {},
            triton_env=triton_env or {},
        )
        settings = Settings.from_env_map(config.env())
        roles: tuple[tuple[Literal["generator", "judge"], str], ...] = (
            ("generator", settings.generator_model),
            ("judge", settings.judge_model),
        )
        for role, model in roles:
            # A role on an OpenAI-compatible server is served outside the stack.
            if model not in models and settings.interface_of(role) != "openai":
                raise ValueError(
                    f"start_stack: the {role} model {model!r} is not among the "
                    f"stack's models {models}; name it in settings_env"
                )
        stack = Stack(config)
        started.append(stack)
        stack.up()
        return stack

    yield start
    for stack in started:
        stack.down()


# The module-scoped fixture; tests/e2e/conftest.py's `shared_stacks` keeps one stack for
# the modules that name the same configuration.
start_stack = pytest.fixture(stack_starter, scope="module", name="start_stack")
