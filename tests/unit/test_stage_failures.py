"""Shards that keep failing (issue 37, services/stage.py, rsieve.run.failures): a stage
that raises on one item retries, then isolates the items (a batch bisected) and
quarantines exactly the one that raises (`stage_error`), and the run completes with its
audit holding; a failure that hits every item stops the run with its reason, every later
task of the run is skipped (the sweeper leaves it alone), and `reconcile` resumes it
once the cause is gone. On the FakeStack: a redelivery is the task called again, as
Celery's retry would deliver it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from rsieve import __version__, keys
from rsieve.backoff import backoff_s
from rsieve.dataset.audit import audit_run
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.run.failures import RunFailure, bisect, stage_error_detail
from rsieve.schemas import STAGE_TASKS, ShardOutput
from services.cleaner.sweep import sweep
from services.stage import stopped
from tests.fakestack import FakeStack
from tests.rule_pools import picture

ITEMS = 6
POISON = "w-3"
TAG = re.compile(r"\[(w-\d+)\]")


# --- the pure rules -------------------------------------------------------------------------


def test_bisect_finds_the_failing_items_in_few_calls() -> None:
    calls: list[int] = []

    def call(part: Sequence[int]) -> list[int]:
        calls.append(len(part))
        if 37 in part or 90 in part:
            raise ValueError("bad")
        return [x * 2 for x in part]

    results, failed = bisect(list(range(128)), call)
    assert sorted(failed) == [37, 90] and all(isinstance(e, ValueError) for e in failed.values())
    assert results[36] == 72 and results[37] is None and results[127] == 254
    assert len(calls) <= 4 * 7 + 1  # two bad items: about 2 log2(128) calls each, not 128


def test_bisect_with_nothing_failing_calls_once_and_checks_the_count() -> None:
    assert bisect([1, 2, 3], lambda part: [x + 1 for x in part]) == ([2, 3, 4], {})
    with pytest.raises(ValueError, match="2 results for 3 items"):
        bisect([1, 2, 3], lambda part: [0, 0][: len(part) if len(part) < 3 else 2])


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [backoff_s(n, 2.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff_s(12, 2.0) == 60.0 and backoff_s(3, 0.0) == 0.0


def test_the_detail_names_stage_exception_and_version_in_bounded_length() -> None:
    detail = stage_error_detail("verify", KeyError("x" * 1000), "9.9")
    assert detail.startswith("verify: KeyError: 'xxx") and detail.endswith("(rsieve 9.9)")
    assert len(detail) < 360
    failure = RunFailure(
        run="r",
        task="rsieve.judge",
        shard="s-0",
        error="OSError",
        message="no such file",
        version="1",
        items=4,
    )
    assert (
        failure.reason() == "rsieve.judge shard s-0: every item failed with OSError: no such file"
    )


# --- on the FakeStack -------------------------------------------------------------------------


def pool(root: Path) -> Path:
    folder = root / "pool"
    folder.mkdir()
    lines = []
    for n in range(ITEMS):
        picture(n, (120, 60), blocks=9).save(folder / f"w-{n}.png")
        lines.append(
            json.dumps(
                {
                    "id": f"w-{n}",
                    "image": f"w-{n}.png",
                    "question": f"Read the word. [w-{n}]",
                    "answer": f"word{n}",
                    "family": "SynthWords",
                    "source": "sha256:" + "0" * 64,
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


class Reader:
    """A generator stand-in (not a model) that reads the item's tag from the prompt and
    answers its word; `raise_on(ids)` makes any batch holding one of them raise, as a
    model client that fails on one input would."""

    def __init__(self) -> None:
        self.poison: set[str] = set()
        self.batches: list[int] = []
        self.info = ModelInfo(name="reader", version="1", interface="rsieve", kind="stand-in")

    def bind(self, gate: Any, on_ready: Callable[[ModelInfo], None]) -> Reader:
        self.on_ready = on_ready
        return self

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        requests = singles(requests)  # one reply per sample, as an engine without n
        self.batches.append(len(requests))
        tags = [m.group(1) for r in requests if (m := TAG.search(r.prompt))]
        if self.poison & set(tags):
            raise ValueError("the client cannot encode this input")
        self.on_ready(self.info)
        await asyncio.sleep(0)
        return [ModelReply(text=f"word{t.split('-')[1]}", finish_reason="stop") for t in tags]


def redeliver(stack: FakeStack, task: str, tries: int, **kwargs: Any) -> int:
    """Call `task` until it returns (Celery's retry delivers it again); how many calls."""
    for n in range(1, tries + 1):
        try:
            stack.task(task, **kwargs)
            return n
        except Exception:  # noqa: BLE001 - the failure being retried, whatever it is
            continue
    raise AssertionError(f"{task} still raising after {tries} tries")


def shard_args(stack: FakeStack, run: str) -> list[dict[str, Any]]:
    return [a for t, a in stack.sent.tasks if t == "rsieve.clean" and a["run"] == run]


def outputs(stack: FakeStack, run: str) -> dict[str, dict[str, ShardOutput]]:
    return {stage: stack.outputs(run, stage) for stage in ("clean", "generate", "verify", "judge")}


def audit(stack: FakeStack, run: str) -> Any:
    return audit_run(stack.json(keys.shards(run)), outputs(stack, run))


def make_stack(reader: Reader) -> FakeStack:
    return FakeStack(
        generator=reader, shard_size=ITEMS, stage_error_retries=2, judge_calibration_rate=0.0
    )


def verifier_raising(
    monkeypatch: pytest.MonkeyPatch, error_for: Callable[[Any], Exception | None]
) -> None:
    """The verifier's rule raises `error_for(generation)` where it is not None."""
    import services.verifier.tasks as verifier

    real = verifier.verify_generation

    def verify_generation(gen: Any, policy: Any) -> Any:
        error = error_for(gen)
        if error is not None:
            raise error
        return real(gen, policy)

    monkeypatch.setattr(verifier, "verify_generation", verify_generation)


def generated(stack: FakeStack, tmp_path: Path, dataset: str) -> tuple[str, dict[str, Any]]:
    """The pool submitted, ingested, cleaned and generated: the run and its one shard."""
    run = stack.submit(pool(tmp_path), dataset)
    stack.drain("rsieve.ingest")
    (args,) = shard_args(stack, run)
    for stage in ("clean", "generate"):
        stack.task(STAGE_TASKS[stage], **args)
    return run, args


def test_a_verifier_raising_on_one_item_quarantines_exactly_it_and_the_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verifier_raising(
        monkeypatch,
        lambda gen: KeyError("a protocol bug on this answer") if gen.item.id == POISON else None,
    )
    stack = make_stack(Reader())
    run, args = generated(stack, tmp_path, "failures")
    # stage_error_retries 2: tries 1-3 raise (retried), the 4th isolates the items.
    assert redeliver(stack, "rsieve.verify", 6, **args) == 4
    verified = stack.outputs(run, "verify")[args["shard"]]
    (q,) = verified.quarantined
    assert q.id == POISON and q.reason == "stage_error" and q.stage == "verify"
    assert q.detail == f"verify: KeyError: 'a protocol bug on this answer' (rsieve {__version__})"
    assert sorted(o.generation.item.id for o in verified.verified) == [
        f"w-{n}" for n in range(ITEMS) if f"w-{n}" != POISON
    ]
    stack.task("rsieve.judge", **args)
    stack.task("rsieve.compact", run=run)
    stack.drain()
    result = audit(stack, run)
    assert result.ok, result.problems
    family = stack.report("failures", run)["families"]["SynthWords"]
    assert family["quarantined_by_reason"] == {"stage_error": 1} and family["adds_up"]
    assert not stopped(stack.ctx, run)


def test_a_generator_batch_that_raises_is_bisected_to_the_one_bad_item(tmp_path: Path) -> None:
    reader = Reader()
    reader.poison = {POISON}
    stack = make_stack(reader)
    run = stack.submit(pool(tmp_path), "bisected")
    stack.drain("rsieve.ingest")
    (args,) = shard_args(stack, run)
    stack.task("rsieve.clean", **args)
    assert redeliver(stack, "rsieve.generate", 6, **args) == 4
    generated = stack.outputs(run, "generate")[args["shard"]]
    assert [(q.id, q.reason) for q in generated.quarantined] == [(POISON, "stage_error")]
    assert "ValueError: the client cannot encode this input" in generated.quarantined[0].detail
    assert len(generated.generations) == ITEMS - 1
    # Three whole batches raised; then the isolating try bisected 6 items: one whole call,
    # halves and quarters down to the bad one, not one call per item.
    isolating = reader.batches[3:]
    assert isolating[0] == ITEMS and len(isolating) < 2 * ITEMS
    for stage in ("verify", "judge"):
        stack.task(STAGE_TASKS[stage], **args)
    stack.task("rsieve.compact", run=run)
    stack.drain()
    assert audit(stack, run).ok


def test_a_failure_of_every_item_stops_the_run_until_it_is_reconciled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {"on": True}
    verifier_raising(
        monkeypatch,
        lambda gen: (
            FileNotFoundError("/etc/rsieve/missing-tokenizer.json") if broken["on"] else None
        ),
    )
    stack = make_stack(Reader())
    run, args = generated(stack, tmp_path, "stopped")
    assert redeliver(stack, "rsieve.verify", 6, **args) == 4  # the 4th returns: stopped
    assert stopped(stack.ctx, run)
    failure = RunFailure.model_validate_json(stack.store.get(keys.run_failed(run)))
    assert failure.task == "rsieve.verify" and failure.shard == args["shard"]
    assert failure.error == "FileNotFoundError" and failure.items == ITEMS
    assert "every item failed with FileNotFoundError" in failure.reason()
    verify_output = keys.stage_output(run, "verify", args["shard"])
    assert not stack.store.exists(verify_output)  # nothing quarantined item by item
    # Every task of the stopped run is skipped, and the sweeper leaves it alone.
    stack.task("rsieve.verify", **args)
    assert not stack.store.exists(verify_output)
    assert sweep(stack.ctx, now=10**12) == []
    # Fixed, then resumed: the stop cleared, the missing stage enqueued and done.
    broken["on"] = False
    plan = stack.ctx.reconcile(run)
    assert ("rsieve.verify", args) in [(t, {**a, "run": run}) for t, a in plan]
    assert not stopped(stack.ctx, run) and not stack.store.exists(keys.run_failed(run))
    stack.drain()
    stack.task("rsieve.compact", run=run)
    stack.drain()
    result = audit(stack, run)
    assert result.ok, result.problems
    family = stack.report("stopped", run)["families"]["SynthWords"]
    assert family["quarantined"] == 0 and family["in"] == ITEMS and family["adds_up"]


# --- a shard killed at its hard time limit ---------------------------------------------------


def test_a_shard_killed_at_its_time_limit_is_sent_again_with_a_limit_from_its_pace() -> None:
    import fakeredis
    from celery.exceptions import TimeLimitExceeded

    from rsieve.settings import Settings
    from services.judge.tasks import register as judge_tasks
    from services.progress import observe_pace, time_limit
    from services.verifier.tasks import register as verifier_tasks
    from services.worker import bootstrap
    from tests.fakes import MemoryStore, Sent

    sent = Sent()
    ctx = bootstrap(
        Settings(judge_model="judge-m"),
        store=MemoryStore(),
        redis_client=fakeredis.FakeRedis(),
        send=sent,
        judge_model=lambda name: None,  # type: ignore[arg-type,return-value]
    )
    judge_tasks(ctx)
    verifier_tasks(ctx)
    shard = {"run": "r-000000000000", "shard": "00000", "lines": 128}
    # The killed delivery recorded its pace: 9 s a verdict, so 128 lines need far more
    # than the 600 s floor it was sent with.
    observe_pace(ctx, "judge", 900.0, 100)
    judge = ctx.app.tasks["rsieve.judge"]
    judge.on_failure(TimeLimitExceeded(600), "t-1", (), shard, None)
    assert sent.tasks == [("rsieve.judge", shard)]
    assert (time_limit(ctx, "rsieve.judge", shard) or 0) > 600
    # Any other failure Celery sees, or a task not paced by a model, is not sent again.
    judge.on_failure(RuntimeError("x"), "t-2", (), shard, None)
    ctx.app.tasks["rsieve.verify"].on_failure(TimeLimitExceeded(600), "t-3", (), shard, None)
    assert len(sent.tasks) == 1
