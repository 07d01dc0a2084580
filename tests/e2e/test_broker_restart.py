"""Redis restarted under a worker with two children, one busy with a shard and one idle
(waiting on BRPOP for the next): the worker's main process lives on and the shard is
done. With kombu's own Redis transport the main process died here ("Unrecoverable error:
AttributeError ... 'hostname'") and took the shard with it: the generator's stall after a
Redis restart with `generator_concurrency` 2 (shared/rsieve/adapters/queues.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue
from kombu.transport import redis as kombu_redis

from rsieve.adapters.queues import RedisTransport, enqueue, make_celery
from rsieve.settings import Settings
from rsieve_cli.local import processes, redis_server
from rsieve_cli.local.ports import free_port
from rsieve_cli.local.stack import REPO_ROOT


def _wait(what: str, check: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _brpop_waiting(port: int) -> bool:
    """Some client of this Redis is blocked in BRPOP (a worker waiting for a message)."""
    client = redis.Redis(port=port, socket_timeout=5)
    return any(
        c.get("cmd") == "brpop" and "b" in str(c.get("flags", "")) for c in client.client_list()
    )


def _lost(log: Path, offset: int) -> bool:
    """The log says, after `offset`, that the broker's connection was lost."""
    with log.open("rb") as fh:
        fh.seek(offset)
        return "connection to broker lost" in fh.read().decode(errors="replace").lower()


def test_worker_survives_redis_restart_holding_a_shard(tmp_path: Path) -> None:
    port, state, redis_log = free_port(), tmp_path / "redis", tmp_path / "redis.log"
    redis = redis_server.start_redis(state_dir=state, port=port, log=redis_log)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        **os.environ,
        "RSIEVE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "RSIEVE_VISIBILITY_TIMEOUT_S": "5",
        "RSIEVE_UNACKED_RESTORE_INTERVAL_S": "1",
        "RSIEVE_TEST_MARKS": str(marks),
        "RSIEVE_TEST_HOLD_S": "3",
    }
    worker_log = tmp_path / "worker.log"
    worker = None
    try:
        redis_server.wait_redis(port, 30, proc=redis)
        with worker_log.open("ab") as log:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.e2e.broker_worker",
                    "worker",
                    "-Q",
                    "generate",
                    "-c",
                    "2",
                    "--without-gossip",
                    "--without-mingle",
                    "--loglevel",
                    "INFO",
                ],
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        app = make_celery(Settings.from_env_map({"RSIEVE_REDIS_URL": env["RSIEVE_REDIS_URL"]}))
        enqueue(app, "rsieve.generate", run="r", shard="00000", lines=1)
        _wait("the shard never started", lambda: list(marks.glob("start-00000-*")), 60)
        # One child holds the shard; the worker waits on BRPOP for the next message.
        _wait("the worker never waited for the next shard", lambda: _brpop_waiting(port), 30)

        logged = worker_log.stat().st_size
        processes.stop(redis)
        assert not list(marks.glob("done-00000-*")), "the shard was done before Redis stopped"
        # Down until the worker has met it (Celery's consumer logs the lost broker).
        _wait("the worker never met the Redis outage", lambda: _lost(worker_log, logged), 60)
        redis = redis_server.start_redis(state_dir=state, port=port, log=redis_log)
        redis_server.wait_redis(port, 30, proc=redis)

        # The shard held across the restart is done (by the child that held it, or
        # redelivered after it was cancelled on the connection loss: visibility timeout
        # 5 s), and the worker goes on taking shards.
        def done(shard: str) -> object:
            return list(marks.glob(f"done-{shard}-*")) or worker.poll() is not None

        _wait("the shard held across the restart was never done", lambda: done("00000"), 60)
        enqueue(app, "rsieve.generate", run="r", shard="00001", lines=1)
        _wait("a shard sent after the restart was never done", lambda: done("00001"), 60)
        assert worker.poll() is None, (
            "the worker's main process exited after the Redis restart:\n"
            + worker_log.read_text(errors="replace")[-3000:]
        )
    finally:
        processes.stop(worker, timeout=30)
        processes.stop(redis)


def test_a_message_popped_as_redis_goes_away_is_pushed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BRPOP took the message off its queue; recording it as unacked failed (Redis gone in
    between, simulated at that exact point). Stock kombu lost it: in neither the queue nor
    the unacked hash. The next channel that reaches Redis pushes it back."""
    port = free_port()
    redis_proc = redis_server.start_redis(
        state_dir=tmp_path / "redis", port=port, log=tmp_path / "log"
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        redis_server.wait_redis(port, 30, proc=redis_proc)
        client = redis.Redis.from_url(url)
        enqueue(
            make_celery(Settings.from_env_map({"RSIEVE_REDIS_URL": url})),
            "rsieve.generate",
            run="r",
            shard="s",
            lines=1,
        )
        assert client.llen("generate") == 1

        def lost(self: Any, message: Any, delivery_tag: Any) -> None:
            raise redis.ConnectionError("Redis went away between BRPOP and the unacked record")

        queue = Queue("generate", Exchange("generate"), "generate")
        received: list[Any] = []
        with Connection(url, transport=RedisTransport) as conn:
            with conn.Consumer(
                queue, callbacks=[lambda body, msg: received.append(msg)], accept=["json"]
            ):
                monkeypatch.setattr(kombu_redis.QoS, "append", lost)
                with pytest.raises(redis.ConnectionError):
                    conn.drain_events(timeout=5)
                monkeypatch.undo()
        assert received == [] and client.llen("generate") == 0 and client.hlen("unacked") == 0

        with Connection(url, transport=RedisTransport) as conn:
            with conn.Consumer(
                queue, callbacks=[lambda body, msg: received.append(msg)], accept=["json"]
            ):
                conn.drain_events(timeout=5)
            assert len(received) == 1
            message = received[0]
            assert message.headers["task"] == "rsieve.generate"
            assert message.headers["redelivered"] is True
            message.ack()
        assert client.llen("generate") == 0 and client.hlen("unacked") == 0
    finally:
        processes.stop(redis_proc)
