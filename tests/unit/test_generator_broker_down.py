"""The generator's shard with Redis unreachable in its child: requeued (Reject with
requeue), never failed, because a failed shard is acked and nothing generates it again.
Redis here is a port nothing listens on; no other service is needed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from rsieve.errors import RetryableError
from rsieve.schemas import ShardOutput
from rsieve.settings import Settings
from rsieve_cli.local.ports import free_port
from services.generator.tasks import register
from services.stage import BROKER_DOWN
from services.worker import bootstrap


@pytest.fixture(scope="module")
def ctx() -> Iterator[object]:
    # One app for the module: Celery shares a registered task with every app finalized
    # after it, so a second `register` here would collide with the first.
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", model_retries=0)
    context = bootstrap(settings)
    context.app.conf.broker_connection_timeout = 1
    context.app.conf.task_publish_retry_policy = {
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.1,
        "interval_max": 0.1,
    }
    register(context)
    # No stored run here: its settings are the services' (no sampling of its own).
    context.run_settings = lambda run: settings  # type: ignore[method-assign]
    yield context
    context.app.close()


def _requeued(ctx: object, **kwargs: object) -> Reject:
    task = ctx.app.tasks["rsieve.generate"]  # type: ignore[attr-defined]
    with pytest.raises(Reject) as caught:
        task(run="r", shard="00000", lines=4, **kwargs)
    assert caught.value.requeue is True
    assert isinstance(caught.value.reason, BROKER_DOWN)
    return caught.value


def test_next_stage_unpublishable_requeues_the_shard(
    ctx: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ctx, "done", lambda *a: True)  # stored; only the next message left
    assert isinstance(_requeued(ctx).reason, OperationalError)


def test_item_guard_without_redis_requeues_the_shard(
    ctx: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ctx, "done", lambda *a: False)
    monkeypatch.setattr(
        ctx,
        "load",
        lambda run, stage, shard: ShardOutput(run=run, shard=shard, stage=stage, lines=4),
    )
    _requeued(ctx)


def test_retry_unpublishable_requeues_the_shard(
    ctx: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    def triton_down(*a: object) -> bool:
        raise RetryableError("Triton not ready")

    monkeypatch.setattr(ctx, "done", triton_down)
    task = ctx.app.tasks["rsieve.generate"]  # type: ignore[attr-defined]
    # As a worker runs it (not called directly), so the retry is published, and fails.
    task.push_request(id="t-1", called_directly=False, retries=0, delivery_info={})
    try:
        _requeued(ctx)
    finally:
        task.pop_request()


def test_other_failures_are_requeued_while_redis_cannot_count_them(
    ctx: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any other failure is counted in Redis and retried (tests/unit/test_stage_failures.py);
    with Redis unreachable it cannot be counted, so the shard goes back to its queue."""

    def broken(*a: object) -> bool:
        raise ValueError("a bug")

    monkeypatch.setattr(ctx, "done", broken)
    rejected = _requeued(ctx)
    assert isinstance(rejected.reason, BROKER_DOWN)
    assert isinstance(rejected.__cause__, ValueError)
