"""Issue 37 (a): the generator worker SIGKILLed with shards in flight. Its shards are back
in work within a minute (the watchers requeue them once its heartbeat lapses), not after
the 900 s visibility timeout, which this stack keeps; status shows them orphaned, then
requeued; the run completes and its audit holds."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from rsieve import redis_keys
from rsieve.adapters.holdings import Holdings
from rsieve_cli.client import api_request
from rsieve_cli.local.stack import Stack
from services.worker import bootstrap
from tests.conftest import stack_settings
from tests.e2e.cli import run_cli
from tests.e2e.faults import stopped_holding
from tests.e2e.pools import word_pool
from tests.e2e.test_faults import _accepted_all, _finish, _submit

ITEMS = 24  # 6 shards of 4
BACK_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def slow_stack(start_stack: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Stack, Path]:
    root = tmp_path_factory.mktemp("orphans")
    replay: dict[str, dict[str, str]] = {}
    pool = word_pool(root / "orphans", "orphans", replay, count=ITEMS)
    (root / "replay.json").write_text(json.dumps(replay))
    stack = start_stack(
        ["replay"],
        # Each model batch takes 2 s: the generator holds its shards long enough to be
        # killed with them in flight.
        triton_env={"RSIEVE_REPLAY_FILE": str(root / "replay.json"), "RSIEVE_REPLAY_DELAY_S": "2"},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "4",
            "RSIEVE_MODEL_RETRIES": "2",
        },
    )
    return stack, pool


def test_generator_killed_with_shards_in_flight_gets_them_back_within_a_minute(
    slow_stack: tuple[Stack, Path],
) -> None:
    stack, pool = slow_stack
    settings = stack_settings(stack)
    # The visibility timeout would hide the bug: the stack keeps the default.
    assert settings.visibility_timeout_s >= 600
    ctx = bootstrap(settings)
    holdings = Holdings(redis.Redis.from_url(settings.redis_url), settings.holder_lapse_s)
    started = time.monotonic()
    run = _submit(stack, pool)

    # The condition: the generator worker (a thread pool: its main process) holds shards;
    # it is frozen with them (SIGSTOP), so what it held is exactly what the kill orphans.
    _, holding = stopped_holding(
        stack,
        run,
        lambda: [stack.pid("generator") or 0],
        "the generator never held a shard",
        timeout=180,
    )
    held = {str(h.shard) for h in holding if h.task == "rsieve.generate"}
    stack.stop("generator", signal.SIGKILL)
    killed = time.monotonic()
    at_kill = set(held)
    # Any finished just before the kill: stored, perhaps not yet acknowledged (then it is
    # requeued too, and its redelivery finds its output stored).
    held -= ctx.stored_shards(run, "generate")
    assert held, "every held shard finished before the kill"

    stack.up()  # a new generator worker

    # Status shows the shards orphaned from the dead holder's lapse (its heartbeat key's
    # TTL) until a watcher's next tick requeues them: a window of 0 to heartbeat_s, which a
    # poll can miss. So the workers whose watchers could requeue them are frozen from just
    # before the lapse until status has shown it: about a second, far less than their own
    # heartbeats' lapse, so none of them is taken for dead.
    client = redis.Redis.from_url(settings.redis_url)
    dead = {h.holder for h in holding if h.task == "rsieve.generate"}
    lapse_at = time.monotonic() + max(client.pttl(redis_keys.holder(d)) for d in dead) / 1000
    time.sleep(max(0.0, lapse_at - 1.0 - time.monotonic()))
    names = ("cleaner", "generator", "verifier", "judge", "compactor")
    watchers = [pid for n in names if (pid := stack.pid(n))]
    for pid in watchers:
        os.killpg(pid, signal.SIGSTOP)
    try:
        saw_pending = False
        while not saw_pending:
            assert time.monotonic() < lapse_at + 10, "status never showed the orphaned shards"
            status = api_request(settings, "GET", f"/runs/{run}").json()
            saw_pending = any(
                f["orphaned"] and f["shard"] in held
                for f in status["in_flight"].get("generate", [])
            )
            time.sleep(0.05)
    finally:
        for pid in watchers:
            os.killpg(pid, signal.SIGCONT)

    # Until every held shard is generated again: requeued, then stored.
    requeued: set[str] = set()
    back_after: float | None = None
    while back_after is None:
        elapsed = time.monotonic() - killed
        assert elapsed < BACK_WITHIN_S, (
            f"shards {sorted(held - ctx.stored_shards(run, 'generate'))} not generated "
            f"again {BACK_WITHIN_S:.0f} s after the kill (requeued: {sorted(requeued)})"
        )
        status = api_request(settings, "GET", f"/runs/{run}").json()
        requeued |= {o["shard"] for o in status["orphaned"] if o["requeued"]}
        if held <= ctx.stored_shards(run, "generate"):
            back_after = elapsed
        time.sleep(0.25)
    print(
        f"{run}: {len(held)} shard(s) held by the killed generator generated again "
        f"{back_after:.1f} s after the kill; requeued {sorted(requeued)}; "
        f"status showed them orphaned before: {saw_pending}"
    )
    assert saw_pending, "status never showed the dead worker's shards orphaned"
    assert held <= requeued, f"status shows {sorted(requeued)} requeued, held {sorted(held)}"

    shown = run_cli(stack, "status", run, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "orphaned by a dead worker and requeued" in shown.stdout, shown.stdout
    assert all(shard in shown.stdout for shard in held), shown.stdout

    report = _finish(stack, run, started)
    _accepted_all(report, ITEMS)
    # Each requeued shard was generated once more, never twice: one orphan record each.
    records = holdings.requeued(run)
    shards = [r["shard"] for r in records if r["requeued"]]
    assert len(shards) == len(set(shards)) and held <= set(shards) <= at_kill, (shards, held)
