"""Issue 37: a dead worker's shards are requeued at once, exactly once, whatever the number
of watchers; a live worker's long shard is never taken from it (rsieve.run.holdings,
rsieve.adapters.holdings, services/liveness.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import fakeredis
import redis
from celery import Celery

from rsieve.adapters.holdings import Holdings
from rsieve.redis_keys import HOLDINGS
from rsieve.redis_keys import holder as heartbeat_key
from rsieve.redis_keys import run_failed as failed_key
from rsieve.run.holdings import Holding, orphaned, run_liveness, stage_eta
from rsieve.settings import Settings
from services import liveness as liveness_module
from services.api.main import create_app
from services.liveness import Held, Liveness

LAPSE = 20.0


def _holding(
    holder: str = "gen-1:42", shard: str = "00003", tag: str = "tag-3", **kw: Any
) -> Holding:
    return Holding(
        holder=holder,
        task="rsieve.generate",
        queue="generate",
        kwargs={"run": "r1", "shard": shard, "lines": 4},
        delivery_id=f"id-{shard}",
        delivery_tag=tag,
        started_at=kw.get("started_at", time.time() - 5),
    )


def _unacked(r: redis.Redis, h: Holding, delivered_at: float) -> bytes:
    """The message as kombu's Redis transport keeps it while a worker holds it."""
    payload = {
        "body": "e30=",
        "headers": {"id": h.delivery_id, "task": h.task},
        "properties": {
            "delivery_tag": h.delivery_tag,
            "delivery_info": {"routing_key": "generate"},
        },
    }
    entry = json.dumps([payload, "generate", "generate"]).encode()
    r.hset("unacked", str(h.delivery_tag), entry)
    r.zadd("unacked_index", {str(h.delivery_tag): delivered_at})
    return entry


def test_orphaned_is_a_lapsed_heartbeat_only() -> None:
    old = _holding(holder="a:1", started_at=time.time() - 10_000)  # a long shard
    dead = _holding(holder="b:2")
    assert orphaned([old, dead], {"a:1": True, "b:2": False}) == [dead]
    assert orphaned([dead], {}) == [dead]  # never beat, or its key expired


def test_two_watchers_requeue_an_orphan_once() -> None:
    r = fakeredis.FakeRedis()
    h = _holding()
    _unacked(r, h, h.started_at - 0.01)
    first, second = Holdings(r, LAPSE), Holdings(r, LAPSE)
    first.hold(h)
    r.delete(heartbeat_key(h.holder))  # the holder died: its heartbeat lapsed
    # Both watchers saw the orphan before either claimed it.
    seen_by_both = first.all()
    assert seen_by_both == second.all() == [h]
    assert [first.claim(h), second.claim(h)] == [True, False]
    assert second.reap() == [] and first.reap() == []
    queued = r.lrange("generate", 0, -1)
    assert len(queued) == 1
    message = json.loads(queued[0])
    assert message["headers"]["id"] == h.delivery_id and message["headers"]["redelivered"]
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0  # no later redelivery
    assert r.hlen(HOLDINGS) == 0
    [record] = first.requeued("r1")
    assert record["shard"] == "00003" and record["holder"] == h.holder and record["requeued"]


def test_a_live_long_shard_is_never_stolen() -> None:
    r = fakeredis.FakeRedis()
    h = _holding(started_at=time.time() - 3 * 3600)
    _unacked(r, h, h.started_at - 0.01)
    watcher = Holdings(r, LAPSE)
    watcher.hold(h)  # beats with it
    for _ in range(3):
        watcher.beat(h.holder)
        assert watcher.reap() == []
    assert r.hlen(HOLDINGS) == 1 and r.hlen("unacked") == 1 and r.llen("generate") == 0


def test_a_message_already_back_is_not_pushed_again() -> None:
    r = fakeredis.FakeRedis()
    restored, redelivered = _holding(shard="00001", tag="t1"), _holding(shard="00002", tag="t2")
    watcher = Holdings(r, LAPSE)
    watcher.hold(restored)
    watcher.hold(redelivered)
    # t1 restored by the visibility timeout (or acked): no unacked entry; t2 restored and
    # delivered again to another worker since the holding started.
    _unacked(r, redelivered, redelivered.started_at + 30)
    r.delete(heartbeat_key(restored.holder))
    assert sorted(h.shard or "" for h in watcher.reap()) == ["00001", "00002"]
    assert r.llen("generate") == 0 and r.hlen("unacked") == 1
    assert [rec["requeued"] for rec in watcher.requeued("r1")] == [False, False]


def test_liveness_reaps_only_after_a_whole_lapse_connected() -> None:
    r = fakeredis.FakeRedis()
    settings = Settings(heartbeat_s=5, holder_lapse_s=LAPSE)
    watcher = Liveness(r, settings)
    h = _holding(holder="gone:1")
    _unacked(r, h, h.started_at - 0.01)
    Holdings(r, LAPSE).hold(h)
    r.delete(heartbeat_key(h.holder))
    assert watcher.tick(now=100.0) == []  # just connected: live holders may not have beaten
    assert r.exists(heartbeat_key(watcher.holder))
    assert watcher.tick(now=110.0) == []
    assert watcher.tick(now=120.0) == [h]
    assert r.llen("generate") == 1


def test_a_worker_task_is_held_while_it_runs() -> None:
    r = fakeredis.FakeRedis()
    app = Celery("t", broker="memory://")
    key = (os.getpid(), str(app.conf.broker_url))
    liveness_module._LIVENESS[key] = Liveness(r, Settings())
    seen: list[int] = []
    try:

        @app.task(name="rsieve.generate", base=Held, shared=False)
        def generate(run: str, shard: str, lines: int) -> None:
            seen.append(r.hlen(HOLDINGS))

        generate.apply(kwargs={"run": "r1", "shard": "00000", "lines": 4})
        generate(run="r1", shard="00001", lines=4)  # called directly: holds nothing
    finally:
        liveness_module._LIVENESS.pop(key).stop()
    assert seen == [1, 0]
    assert r.hlen(HOLDINGS) == 0


def test_status_shows_in_flight_orphans_and_failures() -> None:
    r = fakeredis.FakeRedis()
    now = time.time()
    live, dead = _holding(holder="a:1", shard="00001"), _holding(holder="b:2", shard="00002")
    other_run = _holding(holder="a:1", shard="00009").model_copy(
        update={"kwargs": {"run": "r2", "shard": "00009"}}
    )
    r.hset(
        failed_key("r1"),
        "rsieve.judge:00004",
        json.dumps({"shard": "00004", "error": "E", "message": "m"}),
    )
    view = run_liveness(
        "r1",
        [live, dead, other_run],
        {"a:1": True},
        [{"shard": "00000"}],
        Holdings(r, LAPSE).failed("r1"),
        now,
    )
    gen = view["in_flight"]["generate"]
    assert [(x["shard"], x["holder"], x["orphaned"]) for x in gen] == [
        ("00001", "a:1", False),
        ("00002", "b:2", True),
    ]
    assert all(4 <= x["age_s"] <= 6 for x in gen)
    assert view["orphaned"] == [{"shard": "00000"}]
    assert view["failed"] == [{"shard": "00004", "reason": "E: m"}]
    assert "00004" in view["cannot_finish"]


def test_eta_counts_orphans_and_failures() -> None:
    assert stage_eta(10, 1.0, pending_orphans=0, orphan_wait_s=25, failed=0) == 10.0
    assert stage_eta(10, 1.0, pending_orphans=2, orphan_wait_s=25, failed=0) == 35.0
    assert stage_eta(10, 1.0, pending_orphans=0, orphan_wait_s=25, failed=1) is None
    assert stage_eta(0, None, pending_orphans=0, orphan_wait_s=25, failed=0) == 0.0


def test_get_run_shows_held_orphaned_and_failed_shards(tmp_path: Path) -> None:
    """GET /runs/RUN (what `rsieve status` prints): the shards in flight with holder and
    age, an orphan pending then requeued, a failed shard, and no ETA while it cannot
    finish."""
    from tests.fakestack import FakeStack
    from tests.rule_pools import bad_pool
    from tests.unit.test_api_guard import InProcess

    stack = FakeStack(shard_size=5, model_retries=0, api_dev_open=True)
    run = stack.submit(bad_pool(tmp_path)[0], "liveness")
    stack.drain("rsieve.ingest")
    r = stack.ctx.redis
    client = InProcess(create_app(stack.ctx))
    watcher = Holdings(r, LAPSE)
    live = _holding(holder="live:1", shard="00000").model_copy(
        update={"kwargs": {"run": run, "shard": "00000"}}
    )
    dead = _holding(holder="dead:2", shard="00001", tag="t-dead").model_copy(
        update={"kwargs": {"run": run, "shard": "00001"}}
    )
    _unacked(r, dead, dead.started_at - 0.01)
    watcher.hold(live)
    watcher.hold(dead)
    r.delete(heartbeat_key(dead.holder))
    status = client.get(f"/runs/{run}").json()
    assert [(f["shard"], f["holder"], f["orphaned"]) for f in status["in_flight"]["generate"]] == [
        ("00000", "live:1", False),
        ("00001", "dead:2", True),
    ]
    assert status["progress"]["generate"]["in_flight"] == 2
    assert status["progress"]["generate"]["orphaned"] == 1
    assert status["cannot_finish"] is None
    assert watcher.reap() == [dead]
    status = client.get(f"/runs/{run}").json()
    assert [f["shard"] for f in status["in_flight"]["generate"]] == ["00000"]
    [requeued] = status["orphaned"]
    assert (requeued["shard"], requeued["holder"], requeued["requeued"]) == (
        "00001",
        "dead:2",
        True,
    )
    r.hset(failed_key(run), "rsieve.generate:00002", json.dumps({"shard": "00002", "error": "E"}))
    status = client.get(f"/runs/{run}").json()
    assert status["failed"] == [{"shard": "00002", "reason": "E"}]
    assert "00002" in status["cannot_finish"]
    assert status["progress"]["generate"]["eta_s"] is None


def test_a_restarted_process_is_a_new_holder() -> None:
    """In a container the restarted service is PID 1 again under the same hostname: its id
    must differ from the dead process's, or its heartbeat would keep the dead one's
    holdings alive and their shards would never be requeued."""
    from rsieve.run.holdings import holder_id, holder_pid

    before, after = holder_id("c0ffee", 1, "1a2b3c4d"), holder_id("c0ffee", 1, "5e6f7a8b")
    assert before != after
    assert holder_pid(before) == holder_pid(after) == 1
    assert holder_pid(holder_id("host:with:colons", 4242, "00ff00ff")) == 4242


def test_two_liveness_in_one_process_lifetime_are_distinct_holders() -> None:
    """Each Liveness (one per process incarnation) draws its own token."""
    import fakeredis

    from rsieve.settings import Settings
    from services.liveness import Liveness

    client = fakeredis.FakeRedis()
    a, b = Liveness(client, Settings()), Liveness(client, Settings())
    assert a.holder != b.holder
    assert a.holder.split(":")[:2] == b.holder.split(":")[:2]
