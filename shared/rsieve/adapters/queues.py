"""The Celery app: one queue per service, JSON only, late acks, prefetch 1.

Messages are claim checks (`ShardTask`: run, shard, line count), never images or item
bodies. A stage enqueues the next by task name, so no service imports another.

The broker is kombu's Redis transport with one fix (`RedisTransport`): a worker that loses
its connection while it holds an unacked message *and* is waiting on BRPOP for the next
one (a worker with more than one child, one busy and one idle) must survive it. Stock
kombu leaves that channel half closed (reading the BRPOP reply of a dead socket raises
before the channel is marked closed); Celery then closes the connection again after it
dropped the transport's client, the unacked restore dies on an AttributeError that is no
connection error, and the worker's main process exits ("Unrecoverable error:
AttributeError(\"'NoneType' object has no attribute 'hostname'\")"), its shard with it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from queue import Empty
from typing import Any

import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

from rsieve.schemas import TASK_QUEUES
from rsieve.settings import Settings

__all__ = ["QUEUES", "RedisTransport", "enqueue", "make_celery"]

QUEUES: dict[str, str] = TASK_QUEUES  # task -> queue (rsieve.schemas)


log = logging.getLogger(__name__)

# Messages popped whose unacked record could not be written: (payload, exchange, routing
# key), pushed back by the next channel that reaches Redis (module docstring).
_ORPHANS: list[tuple[dict[str, Any], str, str]] = []
_ORPHANS_LOCK = threading.Lock()


class _QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: Any) -> None:
        try:
            super().append(message, delivery_tag)
        except self.channel.connection_errors:
            info = message.delivery_info
            with _ORPHANS_LOCK:
                _ORPHANS.append((message._raw, info["exchange"], info["routing_key"]))
            raise


class _Channel(kombu_redis.Channel):
    QoS = _QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # pings Redis: it is reachable from here
        self._push_back_orphans()

    def _push_back_orphans(self) -> None:
        with _ORPHANS_LOCK:
            orphans = list(_ORPHANS)
            _ORPHANS.clear()
        if not orphans:
            return
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline()
                for payload, exchange, routing_key in orphans:
                    self._do_restore_message(payload, exchange, routing_key, pipe, leftmost=True)
                pipe.execute()
        except self.connection_errors:
            with _ORPHANS_LOCK:
                _ORPHANS.extend(orphans)  # for the next channel
            return
        log.warning("pushed back %d message(s) popped as the broker went away", len(orphans))

    def close(self) -> None:
        # kombu reads an outstanding BRPOP reply first, so that a message popped for this
        # channel is delivered rather than lost. On a dead connection there is no reply to
        # read, and the error it raises must not stop the close half way (the channel
        # still open, its unacked messages not restored): close the rest.
        if self._in_poll:
            with contextlib.suppress(Empty, *self.connection_errors):
                self._brpop_read()
        super().close()

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        # A channel whose connection is gone (closed, or its transport dropped) cannot
        # reach Redis: say so with a connection error, which every caller (close, the
        # unacked restore, an ack of a message it delivered) handles, never with an
        # AttributeError that stops the worker. Its unacked messages stay in Redis and
        # come back (restore on close, else after the visibility timeout).
        if self.connection is None or self.connection.client is None:
            raise redis.ConnectionError("the broker connection of this channel is closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        return params


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport whose channels survive a broker restart (module docstring)."""

    Channel = _Channel


def make_celery(settings: Settings, name: str = "rsieve") -> Celery:
    app = Celery(name, broker=settings.redis_url, backend=None)
    if settings.redis_url.startswith("redis://"):
        # Instead of kombu's own; other schemes (rediss, sentinel) keep kombu's handling.
        app.conf.broker_transport = f"{RedisTransport.__module__}:{RedisTransport.__name__}"
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_routes={name: {"queue": queue} for name, queue in QUEUES.items()},
        task_default_queue="clean",
        # Messages a dead worker held are restored once older than the visibility timeout;
        # kombu only looks every interval x throttle seconds (100 s by default), so the
        # sweep runs every `unacked_restore_interval_s` instead.
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": settings.unacked_restore_interval_s,
            "unacked_restore_throttle": 1,
        },
        task_time_limit=settings.task_time_limit_s,
        worker_soft_shutdown_timeout=settings.soft_shutdown_s,
        worker_enable_soft_shutdown_on_idle=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        # Ride out a broker outage of any length instead of exiting after 100 tries.
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


def enqueue(app: Celery, task: str, *, time_limit: int | None = None, **kwargs: Any) -> None:
    """Send `task` with `kwargs` to its queue; `time_limit`: its own hard limit, in place of
    task_time_limit_s (a generate or judge shard's, services/progress.py)."""
    options: dict[str, Any] = {} if time_limit is None else {"time_limit": time_limit}
    app.send_task(task, kwargs=kwargs, queue=QUEUES[task], **options)
