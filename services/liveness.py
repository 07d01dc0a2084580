"""The heartbeat and the watcher of every worker process (issue 37; the rules are
rsieve.run.holdings, the Redis side rsieve.adapters.holdings).

A process that runs stage tasks (a prefork child, the generator's thread-pool worker) is a
holder, `hostname:pid`. On its first task it starts one daemon thread (a forked child
starts its own: the pid is checked), which every `heartbeat_s` refreshes the holder's
heartbeat key and then requeues the holdings of every holder whose heartbeat has lapsed.
Each worker's main process runs the same thread from start-up (`start_watcher`), so a
worker that replaces a dead one requeues the dead one's shards before it has any task.

StageTask (services/stage.py) records a holding when a task starts and deletes it when the
task ends, however it ends. A watcher reaps only once it has reached Redis for a whole
lapse: after an outage (Redis restarted, the network cut) the live holders have beaten
again before anyone judges them dead."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

import redis
from celery import Celery, Task

from rsieve.adapters.holdings import Holdings
from rsieve.run.holdings import Holding, holder_id
from rsieve.settings import Settings, get_settings

log = logging.getLogger("rsieve")


class Liveness:
    """One per process: its holder id, its heartbeat thread, its holdings."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.holder = holder_id(socket.gethostname(), os.getpid(), secrets.token_hex(4))
        self.heartbeat_s = settings.heartbeat_s
        self.lapse_s = settings.holder_lapse_s
        self.holdings = Holdings(client, settings.holder_lapse_s)
        self._held: dict[str, str] = {}  # task id -> holding field
        self._lock = threading.Lock()
        self._connected_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="rsieve-heartbeat", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.heartbeat_s)

    def tick(self, now: float | None = None) -> list[Holding]:
        """Beat, then (once connected for a whole lapse) requeue the orphans; never
        raises. The orphans this call requeued."""
        now = time.monotonic() if now is None else now
        try:
            self.holdings.beat(self.holder)
        except Exception as exc:  # noqa: BLE001 - the thread must outlive any outage
            self._connected_since = None
            log.warning("heartbeat of %s not written: %s", self.holder, exc)
            return []
        if self._connected_since is None:
            self._connected_since = now
        if now - self._connected_since < self.lapse_s:
            return []
        try:
            return self.holdings.reap()
        except Exception as exc:  # noqa: BLE001
            log.warning("orphaned shards not reaped: %s", exc)
            return []

    def hold(self, task: str, task_id: str, kwargs: dict[str, Any], request: Any) -> None:
        """Record that this process runs `task` (its heartbeat in the same round trip)."""
        self.start()
        info = getattr(request, "delivery_info", None) or {}
        properties = getattr(request, "properties", None) or {}
        h = Holding(
            holder=self.holder,
            task=task,
            queue=str(info.get("routing_key") or ""),
            kwargs={k: v for k, v in kwargs.items() if isinstance(v, str | int | float)},
            delivery_id=task_id,
            delivery_tag=properties.get("delivery_tag"),
            started_at=time.time(),
        )
        self.holdings.hold(h)
        self._held[task_id] = h.field

    def release(self, task_id: str) -> None:
        field = self._held.pop(task_id, None)
        if field is not None:
            self.holdings.release(field)


class Held(Task):
    """A task base whose every delivery run by a worker is a holding of this process
    (recorded before the body runs, deleted after it, however it ends). A task called
    directly (unit tests) holds nothing. Redis unreachable: the delivery runs unrecorded
    (the visibility timeout is its last resort)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        task_id = None if request.called_directly else request.id
        if task_id:
            try:
                liveness(self.app).hold(self.name, task_id, kwargs, request)
            except Exception as exc:  # noqa: BLE001 - a record, never the task's failure
                log.warning("holding of %s not recorded: %s", self.name, exc)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            if task_id:
                try:
                    liveness(self.app).release(task_id)
                except Exception as exc:  # noqa: BLE001
                    log.warning("holding of %s not deleted: %s", self.name, exc)


_LIVENESS: dict[tuple[int, str], Liveness] = {}
_LIVENESS_LOCK = threading.Lock()


def liveness(app: Celery, settings: Settings | None = None) -> Liveness:
    """This process's Liveness (a forked child makes its own), on the app's broker."""
    key = (os.getpid(), str(app.conf.broker_url))
    with _LIVENESS_LOCK:
        if key not in _LIVENESS:
            client = redis.Redis.from_url(key[1], socket_timeout=10)
            _LIVENESS[key] = Liveness(client, settings or get_settings())
        return _LIVENESS[key]


def start_watcher(app: Celery, settings: Settings) -> None:
    """The worker's main process watches from start-up (once its pool is up: no thread
    of this kind is running while prefork children are forked)."""
    from celery.signals import worker_ready

    def ready(**_: Any) -> None:
        liveness(app, settings).start()

    worker_ready.connect(ready, weak=False)
