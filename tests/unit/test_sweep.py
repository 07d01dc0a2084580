"""The sweeper (services/cleaner/sweep.py) on fakes: a run whose messages were lost is
reconciled once nothing has happened to it for sweep_after_s; a live or compacted run is
left alone."""

from __future__ import annotations

import time
from pathlib import Path

import fakeredis

from rsieve.dataset.audit import stalled
from rsieve.settings import Settings
from services.api.submission import submit
from services.cleaner.sweep import DONE, sweep
from services.cleaner.tasks import register as clean_tasks
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent
from tests.fakestack import upload_once

ROOT = Path(__file__).resolve().parents[2]


def test_stalled_counts_from_the_last_activity_or_the_submission() -> None:
    assert stalled(None, submitted_at=100.0, now=200.0, after_s=50.0)
    assert not stalled(None, submitted_at=100.0, now=140.0, after_s=50.0)
    assert not stalled(180.0, submitted_at=100.0, now=200.0, after_s=50.0)
    assert stalled(120.0, submitted_at=100.0, now=200.0, after_s=50.0)


def test_a_run_whose_messages_were_lost_is_reconciled() -> None:
    store, sent, redis = MemoryStore(), Sent(), fakeredis.FakeRedis()
    ctx = bootstrap(
        Settings(purity_embedding=False, sweep_after_s=600),
        store=store,
        redis_client=redis,
        send=sent,
    )
    clean_tasks(ctx)
    run = submit(ctx, upload_once(store, ROOT / "examples" / "pool"), "swept")
    ctx.app.tasks["rsieve.ingest"](run=run)
    first = next(kw for task, kw in sent.tasks if task == "rsieve.clean")
    ctx.app.tasks["rsieve.clean"](**first)
    sent.tasks.clear()  # the queue lost every message (a broker restarted without its data)

    assert sweep(ctx, now=time.time() + 60) == []  # recent activity: not stalled
    assert sent.tasks == []
    assert sweep(ctx, now=time.time() + 3600) == [run]
    tasks = [(task, kw["shard"]) for task, kw in sent.tasks]
    assert ("rsieve.generate", first["shard"]) in tasks  # the cleaned shard goes on
    assert all(task in ("rsieve.clean", "rsieve.generate") for task, _ in tasks)
    assert len(tasks) == len({shard for _, shard in tasks})  # each shard once

    redis.sadd(DONE, run)  # compacted runs are never looked at again
    sent.tasks.clear()
    assert sweep(ctx, now=time.time() + 3600) == [] and sent.tasks == []
