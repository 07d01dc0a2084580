"""The Celery app: one queue per service, JSON only, late acks, prefetch 1.

Messages are claim checks (`ShardTask`: run, shard, line count), never images or item
bodies. A stage enqueues the next by task name, so no service imports another.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from rsieve.settings import Settings

__all__ = ["QUEUES", "TASKS", "enqueue", "make_celery"]

# Service -> (queue, task name). The queue is the unit KEDA scales on.
TASKS: dict[str, str] = {
    "ingest": "rsieve.ingest",
    "clean": "rsieve.clean",
    "generate": "rsieve.generate",
    "verify": "rsieve.verify",
    "judge": "rsieve.judge",
    "compact": "rsieve.compact",
}
QUEUES: dict[str, str] = {
    "rsieve.ingest": "clean",
    "rsieve.clean": "clean",
    "rsieve.generate": "generate",
    "rsieve.verify": "verify",
    "rsieve.judge": "judge",
    "rsieve.compact": "compact",
}


def make_celery(settings: Settings, name: str = "rsieve") -> Celery:
    app = Celery(name, broker=settings.redis_url, backend=None)
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


def enqueue(app: Celery, task: str, **kwargs: Any) -> None:
    app.send_task(task, kwargs=kwargs, queue=QUEUES[task])
