"""Long shards make progress that survives (issue 37, "Nothing stalls"; docs/decisions.md,
"Long shards resume"): a generate shard stores its replies per batch and a redelivery asks
only the rest, with the same output; a judge shard's verdicts are in the verdict cache as
each batch returns; a shard's time limit follows its model's observed pace."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from rsieve import keys
from rsieve.adapters.gate import EngineGate
from rsieve.adapters.model import ModelRequest
from rsieve.envelope import CorruptOutput, open_envelope
from rsieve.generate.generation import ModelInfo, ModelReply, singles
from rsieve.generate.progress import ShardProgress, asked_digest, batches, resumed, to_ask
from rsieve.run.limits import ewma, limit_ceiling, shard_time_limit
from rsieve.schemas import STAGE_TASKS, STAGES
from services.progress import observe_pace, pace, time_limit
from tests.fakestack import FakeStack
from tests.unit.test_best_of_n import StochasticStandIn, make_pool

SETTINGS: dict[str, Any] = {
    "shard_size": 64,
    "samples": 2,
    "temperature": 0.7,
    "progress_batch_items": 8,
}


class Killed(BaseException):
    """The worker died mid-shard (not an exception a task handles)."""


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


class DyingGenerator(StochasticStandIn):
    """Answers `answered` batches; every later batch waits until those are stored, then
    kills its worker. `alive()` makes it answer everything from then on."""

    def __init__(self, stored: Callable[[], int], answered: int) -> None:
        super().__init__(0.3)
        self.stored, self.answered, self.calls, self.dying = stored, answered, 0, True

    def bind(self, gate: EngineGate, on_ready: Callable[[ModelInfo], None]) -> DyingGenerator:
        self.on_ready = on_ready
        return self

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        requests = singles(requests)  # one reply per sample, as an engine without n
        self.calls += 1
        if self.dying and self.calls > self.answered:
            while self.stored() < self.answered * SETTINGS["progress_batch_items"]:
                await asyncio.sleep(0.01)
            raise Killed
        return await super().generate_many_async(requests)


def shards_sent(stack: FakeStack, task: str) -> list[dict[str, Any]]:
    return [kw for name, kw in stack.sent.tasks if name == task]


def through(stack: FakeStack, run: str, last: str) -> dict[str, Any]:
    """The run's only shard through every stage before `last`; its task arguments."""
    stack.drain("rsieve.ingest")
    (args,) = shards_sent(stack, "rsieve.clean")
    for stage in STAGES[: STAGES.index(last)] if last in STAGES else STAGES:
        stack.task(STAGE_TASKS[stage], **args)
    return args


def generations(stack: FakeStack, run: str, shard: str) -> list[dict[str, Any]]:
    out = stack.ctx.load(run, "generate", shard).model_dump(mode="json")
    for g in out["generations"]:
        g["latency_s"] = None  # how long a call took is the only thing that may differ
    return list(out["generations"]) + list(out["quarantined"])


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pool(tmp_path_factory.mktemp("progress") / "pool", count=40)


@pytest.mark.parametrize("enough", [0, None], ids=["every-sample", "adaptive"])
def test_a_generate_shard_killed_mid_way_resumes_and_asks_only_the_rest(
    pool: Path, enough: int | None
) -> None:
    """Killed after 3 batches of 8 and redelivered: the rest asked once, and the shard's
    generations are an uninterrupted run's. Adaptive (rounds of 1 sample, stopping at the
    first pass) resumes exactly where it was: its decisions are taken on whole rounds."""
    settings = SETTINGS | {"enough": enough}
    reference = FakeStack(generator=StochasticStandIn(0.3), **settings)
    run = reference.submit(pool, "ref")
    args = through(reference, run, "verify")

    def stored() -> int:
        key = keys.progress(run, "generate", args["shard"])
        if not stack.store.exists(key):
            return 0
        opened = open_envelope(stack.store.get(key))
        assert not isinstance(opened, CorruptOutput)
        return len(ShardProgress.model_validate_json(opened.body).replies)

    model = DyingGenerator(stored, answered=3)
    stack = FakeStack(generator=model, **settings)
    assert stack.submit(pool, "ref") == run
    through(stack, run, "generate")
    with pytest.raises(Killed):
        stack.task("rsieve.generate", **args)
    assert not stack.ctx.done(run, "generate", args["shard"])
    first = list(model.asked)
    assert len(first) == 3 * 8 and stored() == 24

    model.dying = False  # the redelivery, on a worker that lives
    stack.task("rsieve.generate", **args)
    again = model.asked[len(first) :]
    identity = [(r.prompt, r.seed) for r in first + again]
    assert len(set(identity)) == len(identity)  # nothing asked twice
    if enough == 0:
        assert len(again) == 80 - 24 and len(identity) == 80  # 40 items x 2 samples, once
    else:  # the second sample only for items whose first did not pass
        asked = reference.ctx.load(run, "generate", args["shard"]).generations
        assert len(identity) == len(asked) < 80
    assert generations(stack, run, args["shard"]) == generations(reference, run, args["shard"])
    assert not stack.store.exists(keys.progress(run, "generate", args["shard"]))


def test_a_progress_of_other_requests_is_not_reused() -> None:
    reply = ModelReply(text="a", finish_reason="stop")
    stored = ShardProgress(
        run="r", shard="s", stage="generate", asked=asked_digest(["a", "b"]), replies={0: reply}
    )
    assert resumed(stored, asked_digest(["a", "b"]), 2) == {0: reply}
    assert resumed(stored, asked_digest(["a", "c"]), 2) == {}
    assert resumed(None, asked_digest(["a"]), 1) == {}
    assert to_ask(4, {1: reply, 3: reply}) == [0, 2]
    assert batches([0, 2, 5, 6, 7], 2) == [[0, 2], [5, 6], [7]]
    assert batches([1, 2], 0) == [[1, 2]] and batches([], 3) == []


VERDICTS = ("CORRECT", "INCORRECT", "UNSURE")


class DyingJudge:
    """A judge whose verdict follows its prompt; it dies on the batch after `answered`
    prompts were asked, while `dying`."""

    def __init__(self, answered: int) -> None:
        self.info: ModelInfo | None = None
        self.asked: list[str] = []
        self.answered, self.dying = answered, True

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        if self.dying and len(self.asked) >= self.answered:
            raise Killed
        self.info = ModelInfo(name="judge", version="1", interface="rsieve", kind="stand-in")
        self.asked += [r.prompt for r in requests]
        return [
            ModelReply(text=VERDICTS[sum(r.prompt.encode()) % 3], finish_reason="stop")
            for r in requests
        ]


def outcomes(stack: FakeStack, run: str, shard: str) -> list[dict[str, Any]]:
    out = stack.ctx.load(run, "judge", shard).model_dump(mode="json")
    text = json.dumps(out["outcomes"] + out["quarantined"], sort_keys=True)
    return list(json.loads(text.replace('"reused": true', '"reused": false')))


def test_a_judge_shard_killed_mid_way_finds_its_verdicts_and_asks_only_the_rest(
    pool: Path,
) -> None:
    settings = SETTINGS | {"samples": 1}
    whole = DyingJudge(10**9)
    reference = FakeStack(generator=StochasticStandIn(0.3), judge=whole, **settings)
    run = reference.submit(pool, "ref")
    args = through(reference, run, "compact")
    asked = len(whole.asked)
    assert asked > 16  # more than two batches to judge

    judge = DyingJudge(answered=16)
    stack = FakeStack(generator=StochasticStandIn(0.3), judge=judge, **settings)
    stack.submit(pool, "ref")
    through(stack, run, "judge")
    with pytest.raises(Killed):
        stack.task("rsieve.judge", **args)
    assert len(judge.asked) == 16 and not stack.ctx.done(run, "judge", args["shard"])

    judge.dying = False
    stack.task("rsieve.judge", **args)
    assert len(judge.asked) == asked and len(set(judge.asked)) == asked  # none asked twice
    assert outcomes(stack, run, args["shard"]) == outcomes(reference, run, args["shard"])


def test_the_time_limit_follows_the_pace_between_the_floor_and_the_ceiling() -> None:
    assert shard_time_limit(None, 128, factor=3, floor_s=600, ceiling_s=890) == 600
    assert shard_time_limit(0.5, 128, factor=3, floor_s=600, ceiling_s=890) == 600
    assert shard_time_limit(2.0, 128, factor=3, floor_s=600, ceiling_s=890) == 768
    assert shard_time_limit(5.0, 128, factor=3, floor_s=600, ceiling_s=890) == 890
    # A ceiling under the floor never shortens a task's limit.
    assert shard_time_limit(5.0, 128, factor=3, floor_s=600, ceiling_s=15) == 600
    assert limit_ceiling(3600, 900, 5) == 895 and limit_ceiling(890, 900, 5) == 890
    assert ewma(None, 2.0, 0.3) == 2.0
    assert ewma(2.0, 4.0, 0.5) == 3.0


def test_a_shard_is_sent_with_the_limit_its_stage_s_pace_gives() -> None:
    stack = FakeStack(task_time_limit_s=600, shard_time_limit_max_s=890)
    ctx = stack.ctx
    assert time_limit(ctx, "rsieve.judge", {"run": "r", "shard": "s", "lines": 128}) == 600
    observe_pace(ctx, "judge", 384.0, 128)  # 3 s per item, as a slow server
    assert pace(ctx, "judge") == 3.0
    assert time_limit(ctx, "rsieve.judge", {"run": "r", "shard": "s", "lines": 128}) == 890
    assert time_limit(ctx, "rsieve.judge", {"run": "r", "shard": "s", "lines": 64}) == 600
    assert time_limit(ctx, "rsieve.generate", {"run": "r", "shard": "s", "lines": 128}) == 600
    assert time_limit(ctx, "rsieve.verify", {"run": "r", "shard": "s", "lines": 128}) is None


def test_a_judge_shard_observes_its_pace(pool: Path) -> None:
    stack = FakeStack(generator=StochasticStandIn(0.3), judge=DyingJudge(10**9), **SETTINGS)
    run = stack.submit(pool, "pace")
    through(stack, run, "compact")
    assert pace(stack.ctx, "judge") is not None and pace(stack.ctx, "generate") is not None


def test_the_worker_s_send_carries_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import fakeredis

    from rsieve.adapters.queues import make_celery
    from rsieve.settings import Settings
    from services.worker import bootstrap
    from tests.fakes import MemoryStore

    settings = Settings(task_time_limit_s=600, shard_time_limit_max_s=890)
    app = make_celery(settings)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: sent.append({"name": name} | kw))
    ctx = bootstrap(settings, app=app, store=MemoryStore(), redis_client=fakeredis.FakeRedis())
    observe_pace(ctx, "judge", 4.0, 1)
    ctx.next("rsieve.judge", run="r", shard="s", lines=100)
    ctx.next("rsieve.verify", run="r", shard="s", lines=100)
    assert sent[0]["time_limit"] == 890 and sent[0]["kwargs"]["lines"] == 100
    assert "time_limit" not in sent[1]
