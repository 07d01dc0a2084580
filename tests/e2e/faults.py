"""Waits and checks for the fault tests (docs/testing.md, "Fault tests"): a fault is
injected once a condition shows it will land where the test says (a shard held by the
process about to die, a worker at work when its backend goes away), never after a fixed
sleep; the test then asserts the fault happened and was noticed (the shard started again,
a retry counted, the outage met in a worker's log)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import redis

from rsieve import redis_keys
from rsieve.adapters.holdings import Holdings
from rsieve.run import holdings as run_holdings
from rsieve.run.holdings import Holding
from rsieve_cli.local.stack import SERVICES, Stack
from tests.conftest import stack_settings

T = TypeVar("T")
POLL_S = 0.05
# Service -> its stage task (rsieve.clean, ...).
TASK_OF = {service: f"rsieve.{queue}" for service, queue in SERVICES.items()}
SERVICE_OF = {task: service for service, task in TASK_OF.items()}
# What a worker writes once Redis is gone: Celery's consumer, kombu, redis-py, the
# heartbeat thread (services/liveness.py).
REDIS_GONE = (
    "connection to broker lost",
    "cannot connect to redis",
    "error 111 connecting",
    "connection refused",
    "connectionerror",
)


def wait_until(
    what: str, check: Callable[[], T | None], timeout: float, interval: float = POLL_S
) -> T:
    """Poll `check` until it returns something true, and return it; fail with `what`
    once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} (waited {timeout:.0f} s)"
        time.sleep(interval)


def _redis(stack: Stack) -> redis.Redis:
    return redis.Redis.from_url(stack_settings(stack).redis_url, socket_timeout=5)


def holder_pid(h: Holding) -> int:
    """The process of a holding's holder."""
    return run_holdings.holder_pid(h.holder)


def held(stack: Stack, run: str, pids: Iterable[int] | None = None) -> list[Holding]:
    """The holdings of `run` in rsieve:holdings (of those processes, when named)."""
    settings = stack_settings(stack)
    found = Holdings(_redis(stack), settings.holder_lapse_s).all()
    wanted = None if pids is None else set(pids)
    return [h for h in found if h.run == run and (wanted is None or holder_pid(h) in wanted)]


def stopped_holding(
    stack: Stack, run: str, processes: Callable[[], list[int]], what: str, timeout: float = 120
) -> tuple[list[int], list[Holding]]:
    """Wait until one of `processes` holds a shard of `run`, then SIGSTOP them all and
    return them with the holdings still recorded: they are frozen with exactly those shards
    in flight, ready to be killed. Looking and killing are not atomic (under load a shard
    finishes, or another starts, between the two): the stop is what fixes the set. A look
    whose shards all finished before the stop resumes the processes and waits on."""
    deadline = time.monotonic() + timeout
    while True:
        pids = processes()
        if any("shard" in h.kwargs for h in held(stack, run, pids)):
            _signal(pids, signal.SIGSTOP)
            holding = [h for h in held(stack, run, pids) if "shard" in h.kwargs]
            if holding:
                return pids, holding
            _signal(pids, signal.SIGCONT)
        assert time.monotonic() < deadline, f"{what} (waited {timeout:.0f} s)"
        time.sleep(POLL_S)


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        if pid <= 0:  # os.kill(0, ...) would signal the test's own process group
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # a child the pool replaced meanwhile
            pass


def still_held(stack: Stack, holdings: Iterable[Holding]) -> list[Holding]:
    """Those of `holdings` still recorded (a killed process never deletes its own)."""
    client = _redis(stack)
    return [h for h in holdings if client.hexists(redis_keys.HOLDINGS, h.field)]


def starts(stack: Stack, service: str, run: str) -> Counter[str]:
    """How many deliveries of `run`'s shards the service's tasks began, by shard (StageTask
    logs `start <task> run=<run> shard=<shard>` for each, before it records a holding):
    a shard started twice was delivered again."""
    log = stack.logs / f"{service}.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    head = f"start {TASK_OF[service]} run={run} shard="
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if head in line:
            try:
                msg = str(json.loads(line).get("msg", ""))
            except ValueError:
                msg = line
            if msg.startswith(head):
                out[msg[len(head) :].split()[0]] += 1
    return out


def counter(stack: Stack, name: str, tasks: Iterable[str] | None = None) -> float:
    """A metrics counter (rsieve.adapters.metrics), summed over its labels (those whose
    first label is one of `tasks`, when named: rsieve_task_retries is by task and error)."""
    wanted = None if tasks is None else set(tasks)
    total = 0.0
    for field, value in _redis(stack).hgetall(redis_keys.metric_counter(name)).items():
        labels = json.loads(field)
        if wanted is None or (labels and labels[0] in wanted):
            total += float(value)
    return total


class LogMark:
    """The workers' logs as they are now; `since` reads what was written after."""

    def __init__(self, stack: Stack, services: Iterable[str] = SERVICES) -> None:
        self.paths = {name: stack.logs / f"{name}.log" for name in services}
        self.sizes = {n: p.stat().st_size if p.is_file() else 0 for n, p in self.paths.items()}

    def since(self, service: str) -> str:
        path: Path = self.paths[service]
        if not path.is_file():
            return ""
        with path.open("rb") as fh:
            fh.seek(self.sizes[service])
            return fh.read().decode(errors="replace")

    def find(self, needles: Iterable[str]) -> tuple[str, str] | None:
        """The first (service, line) written since the mark holding any of `needles`
        (case-insensitive)."""
        lowered = [n.lower() for n in needles]
        for service in self.paths:
            for line in self.since(service).splitlines():
                if any(n in line.lower() for n in lowered):
                    return service, line
        return None
