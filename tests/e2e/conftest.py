"""One real stack shared by the e2e modules that need the same configuration.

A module names its configuration in `SHARED_STACK = "<key>"` and gets its stack from
`shared_stacks.get(key, models, ...)`: the stack is started by the first module that asks
and kept while the next modules name the same key. At most one shared stack is alive,
and it is stopped as soon as a module that does not name its key starts (an autouse
fixture, before the module's own stack), or when a module asks for another key, or at
the session's end: never more than two stacks at once (a shared one and a module's)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from rsieve_cli.local.stack import Stack
from tests.conftest import stack_starter


class SharedStacks:
    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._factory = tmp_path_factory
        self._starter: Iterator[Callable[..., Stack]] | None = None
        self.key: str | None = None
        self.stack: Stack | None = None

    def get(
        self,
        key: str,
        models: list[str],
        *,
        settings_env: dict[str, str] | None = None,
        triton_env: dict[str, str] | None = None,
    ) -> Stack:
        """The live stack of `key`, or a new one (the previous shared stack stopped)."""
        if self.key == key and self.stack is not None:
            return self.stack
        self.release()
        self._starter = stack_starter(self._factory)
        start = next(self._starter)
        self.key = key
        self.stack = start(models, settings_env=settings_env, triton_env=triton_env)
        return self.stack

    def release(self, keep: str | None = None) -> None:
        """Stop the shared stack unless its key is `keep`."""
        if self._starter is not None and (keep is None or self.key != keep):
            next(self._starter, None)  # stack_starter's teardown: every stack it started
            self._starter, self.key, self.stack = None, None, None


@pytest.fixture(scope="session")
def shared_stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStacks]:
    shared = SharedStacks(tmp_path_factory)
    yield shared
    shared.release()


@pytest.fixture(scope="module", autouse=True)
def _stop_a_shared_stack_no_longer_needed(
    request: pytest.FixtureRequest, shared_stacks: SharedStacks
) -> None:
    shared_stacks.release(keep=getattr(request.module, "SHARED_STACK", None))


# The scenario's stack (tests/e2e/scenario.py), shared by test_replay_pipeline and
# test_review_page (adjacent in the suite's order): the replay model answering the
# scenario, shards of 4, one retry, the API behind a token, and the judge trusted (the
# replay model has no recording of calibration probes; test_judge_obedient covers
# calibration).
SCENARIO_API_TOKEN = "7f3c9a1e5b2d4f6081a3c5e7092b4d6f8a1c3e50"  # 40 hex: a token the API accepts


@pytest.fixture(scope="module")
def scenario_stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    from tests.e2e.scenario import build

    if shared_stacks.key == "scenario" and shared_stacks.stack is not None:
        return shared_stacks.stack
    root = tmp_path_factory.mktemp("scenario-stack")
    replay = root / "replay.json"
    replay.write_text(json.dumps(build(root / "pool").replay))
    return shared_stacks.get(
        "scenario",
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "4",
            "RSIEVE_MODEL_RETRIES": "1",
            "RSIEVE_JUDGE_FALSE_PROMOTION_BOUND": "1.0",
            "RSIEVE_API_TOKEN": SCENARIO_API_TOKEN,
        },
    )
