"""Faults a long unattended run meets, each ending in a passing audit: workers killed
(child or whole), stopped for scale-in, Redis and Triton restarted mid-run, messages
delivered twice, the compactor dying before its commit, and a poison item."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from rsieve import keys, redis_keys
from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve.dataset.audit import audit_run
from rsieve.run.failures import RunFailure
from rsieve_cli.client import api_request, submit, wait_for_run
from rsieve_cli.local.stack import SERVICES, Stack
from services.worker import bootstrap
from tests.conftest import stack_settings
from tests.e2e.faults import (
    REDIS_GONE,
    SERVICE_OF,
    TASK_OF,
    LogMark,
    counter,
    held,
    starts,
    still_held,
    stopped_holding,
    wait_until,
)
from tests.e2e.pools import word_pool

ITEMS = 24  # 6 shards of 4
FAULT_INJECTION = Path(__file__).resolve().parents[1] / "fault_injection"


def _pool(
    folder: Path, tag: str, replay: dict[str, dict[str, str]], extra_ids: tuple[str, ...] = ()
) -> Path:
    return word_pool(folder, tag, replay, count=ITEMS, extra_ids=extra_ids)


@pytest.fixture(scope="module")
def fault_stack(
    start_stack: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Stack, dict[str, Path]]:
    root = tmp_path_factory.mktemp("faults")
    replay: dict[str, dict[str, str]] = {}
    pools = {
        tag: _pool(root / tag, tag, replay, ("poison-1",) if tag == "poison" else ())
        for tag in (
            "childkill",
            "workerkill",
            "sigterm",
            "redis",
            "triton",
            "twice",
            "compactor",
            "poison",
            "s3down",
            "corrupt",
            "partkill",
            "raise",
            "halt",
        )
    }
    # tests/fault_injection/sitecustomize.py: the verifier raises on raise-001, every time,
    # and on every item of "halt" while the file names it (test_every_item_failing...).
    raising = root / "raising.json"
    raising.write_text(json.dumps(["raise-001", "halt-"]))
    replay_file = root / "replay.json"
    replay_file.write_text(json.dumps(replay))
    stack = start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay_file), "RSIEVE_REPLAY_DELAY_S": "0.3"},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "4",
            "RSIEVE_VISIBILITY_TIMEOUT_S": "15",
            # The sweeper at this stack's scale (twice the visibility timeout, as by
            # default): a message lost with Redis (test_redis_restarted_mid_run once left a
            # shard in no queue) is sent again, not waited on for 30 minutes.
            "RSIEVE_SWEEP_INTERVAL_S": "5",
            "RSIEVE_SWEEP_AFTER_S": "30",
            "RSIEVE_MAX_DELIVERIES": "2",
            "RSIEVE_MODEL_RETRIES": "2",
            "RSIEVE_SOFT_SHUTDOWN_S": "30",
            # tests/fault_injection/sitecustomize.py: a worker dies on poison-1, every time.
            "RSIEVE_TEST_CRASH_ITEM_IDS": '["poison-1"]',
            # Every run is compacted in partitions (24 items: 4 of 8 lines, routed in 3
            # groups of 2 shards), so every fault here meets the partitioned compaction.
            "RSIEVE_COMPACT_PARTITION_ITEMS": "8",
            "RSIEVE_COMPACT_ROUTE_SHARDS": "2",
            # Every pool is ingested in rounds too (3 ranges of 8 lines, 4 partitions).
            "RSIEVE_INGEST_RANGE_ITEMS": "8",
            # ... and the compactor dies once inside a partition of "partkill".
            "RSIEVE_TEST_CRASH_PARTITION_OF": "partkill",
            "RSIEVE_TEST_CRASH_MARKS": str(root),
            "RSIEVE_TEST_RAISE_FILE": str(raising),
            # A shard that raises: tried twice more, 0.5 s apart, then its items isolated.
            "RSIEVE_STAGE_ERROR_RETRIES": "1",
            "RSIEVE_STAGE_ERROR_BACKOFF_S": "0.5",
            "PYTHONPATH": str(FAULT_INJECTION),
        },
    )
    return stack, pools


def _submit(stack: Stack, pool: Path) -> str:
    settings = stack_settings(stack)
    return submit(settings, upload_pool(S3Store(settings), pool), pool.name)


def _finish(stack: Stack, run: str, started: float) -> dict[str, Any]:
    """Wait for the run, then prove its accounting from storage."""
    settings = stack_settings(stack)
    wait_for_run(settings, run, timeout=240)
    ctx = bootstrap(settings)
    index, outputs = ctx.load_run(run)
    assert index is not None
    result = audit_run(index, outputs)
    assert result.ok, result.problems
    report = json.loads(S3Store(settings).get(f"datasets/{ctx.spec(run).dataset}/run_report.json"))
    assert report["adds_up"]
    print(f"{run}: recovered and compacted {time.monotonic() - started:.1f}s after submit")
    return report


def _wait_stage(stack: Stack, run: str, stage: str, count: int = 1, timeout: float = 60) -> None:
    ctx = bootstrap(stack_settings(stack))
    deadline = time.monotonic() + timeout
    while len(ctx.stored_shards(run, stage)) < count:
        assert time.monotonic() < deadline, f"{stage} never reached {count} shards"
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


def _accepted_all(report: dict[str, Any], expected: int = ITEMS) -> None:
    assert report["families"]["SynthWords"]["accepted"] == expected


def _pools_started(stack: Stack, names: tuple[str, ...], timeout: float = 60) -> None:
    """Every named worker has said it is ready (its pool of children is up): a child killed
    while Celery still starts its pool makes the worker exit ("Could not start worker
    processes"), which is a start-up failure, not the fault this test is about. Celery
    checks its pool once, in the same call that logs "ready." (celery.worker.loops), and
    the kill waits for a child holding a shard of a run submitted after this."""

    def ready(name: str) -> bool:
        log = stack.logs / f"{name}.log"
        return log.is_file() and " ready." in log.read_text(errors="replace")

    wait_until("a worker never became ready", lambda: all(map(ready, names)), timeout, 0.2)


def test_worker_child_killed_mid_shard(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    stack, pools = fault_stack
    services = ("cleaner", "verifier", "judge", "compactor")
    _pools_started(stack, services)
    started = time.monotonic()
    run = _submit(stack, pools["childkill"])

    # The prefork services' children (the generator runs threads: killing it is
    # test_whole_worker_killed_and_replaced), once one of them holds a shard of the run.
    def children() -> list[int]:
        return [c for name in services for c in _children(stack.pid(name) or 0)]

    stopped, caught = stopped_holding(stack, run, children, "no child held a shard of the run")
    for child in stopped:
        os.kill(child, signal.SIGKILL)
    assert still_held(stack, caught) == caught  # a killed child never deletes its holding
    _accepted_all(_finish(stack, run, started))
    # Noticed: each shard a killed child held was delivered again and done.
    for h in caught:
        service = SERVICE_OF[h.task]
        assert starts(stack, service, run)[str(h.shard)] >= 2, (service, h.shard)


def test_whole_worker_killed_and_replaced(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["workerkill"])
    pid = stack.pid("generator") or 0
    _, caught = stopped_holding(
        stack, run, lambda: [pid], "the generator never held a shard of the run"
    )
    stack.stop("generator", signal.SIGKILL)
    assert still_held(stack, caught) == caught
    stack.up()  # a new worker; the dead one's unacked shard returns after the timeout
    _accepted_all(_finish(stack, run, started))
    # Noticed: each shard the dead worker held was delivered again and done.
    again = starts(stack, "generator", run)
    assert all(again[str(h.shard)] >= 2 for h in caught), (again, [h.shard for h in caught])


def test_worker_stopped_for_scale_in(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["sigterm"])
    pid = stack.pid("generator") or 0
    holding = wait_until(
        "the generator never held a shard of the run", lambda: held(stack, run, [pid]), 120
    )
    mark = LogMark(stack, ["generator"])
    stack.stop("generator", signal.SIGTERM, timeout=60)
    done_by_it = bootstrap(stack_settings(stack)).stored_shards(run, "generate")
    assert "warm shutdown" in mark.since("generator").lower(), mark.since("generator")[-2000:]
    stack.up()
    _accepted_all(_finish(stack, run, started))
    # What it held when told to stop was finished before it exited, or delivered again.
    again = starts(stack, "generator", run)
    for h in holding:
        assert h.shard in done_by_it or again[str(h.shard)] >= 2, (h.shard, again)


def test_redis_restarted_mid_run(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["redis"])
    _wait_stage(stack, run, "clean")
    wait_until("no shard of the run was held", lambda: held(stack, run), 60)
    workers = {name: stack.pid(name) for name in SERVICES}
    mark = LogMark(stack)
    stack.stop("redis")
    # The outage lasts until a worker has met it (its log says the broker is gone).
    met = wait_until("no worker met the Redis outage", lambda: mark.find(REDIS_GONE), 60)
    print(f"{run}: Redis stopped; {met[0]} met it: {met[1][:200]}")
    stack.up()  # starts Redis again; it would also restart a worker that died
    _accepted_all(_finish(stack, run, started))
    # Every worker lived through the outage (a worker holding an unacked shard while it
    # waited for the next one used to die of it: rsieve.adapters.queues).
    assert {name: stack.pid(name) for name in SERVICES} == workers


def test_triton_restarted_mid_run(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["triton"])
    pid = stack.pid("generator") or 0
    wait_until("the generator never held a shard of the run", lambda: held(stack, run, [pid]), 120)
    models = ("rsieve.generate", "rsieve.judge")
    retries = counter(stack, "rsieve_task_retries", models)
    stack.stop("triton", signal.SIGKILL)
    # Down until a model stage has met it: its call failed and the task was retried.
    wait_until(
        "no model call met the stopped Triton",
        lambda: counter(stack, "rsieve_task_retries", models) > retries,
        120,
    )
    stack.up()
    _accepted_all(_finish(stack, run, started))


def test_messages_delivered_twice_change_nothing(
    fault_stack: tuple[Stack, dict[str, Path]], tmp_path: Path
) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["twice"])
    _finish(stack, run, started)
    settings = stack_settings(stack)
    store = S3Store(settings)
    before = export_dataset(store, "twice", tmp_path / "before")
    ctx = bootstrap(settings)
    index = ctx.shard_index(run)
    assert index is not None
    stages = ("cleaner", "generator", "verifier", "judge")
    seen = {name: starts(stack, name, run) for name in stages}
    compacted = starts(stack, "compactor", run)["None"]
    for shard, lines in index["shards"].items():
        for name in stages:
            ctx.next(TASK_OF[name], run=run, shard=shard, lines=lines)
    ctx.next("rsieve.compact", run=run)

    # Every message sent twice was delivered again, and the run is idle once more.
    def delivered_again() -> bool:
        now = {name: starts(stack, name, run) for name in stages}
        return (
            all(
                now[name][shard] > seen[name][shard] for name in stages for shard in index["shards"]
            )
            and starts(stack, "compactor", run)["None"] > compacted
        )

    wait_until("the messages sent twice were not all delivered", delivered_again, 180)
    wait_until("the run's shards are still held", lambda: not held(stack, run), 180)
    _accepted_all(_finish(stack, run, started))
    after = export_dataset(store, "twice", tmp_path / "after")
    for path in sorted(before.rglob("*.parquet")):
        assert path.read_bytes() == (after / path.relative_to(before)).read_bytes()


def test_compactor_dead_before_manifest_is_completed_by_reconcile(
    fault_stack: tuple[Stack, dict[str, Path]],
) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["compactor"])
    _finish(stack, run, started)
    settings = stack_settings(stack)
    ctx = bootstrap(settings)
    # The state a compactor leaves when it dies after the shards, before the commit.
    assert isinstance(ctx.store, S3Store)
    ctx.store._client.delete_object(
        Bucket=settings.s3_bucket, Key="datasets/compactor/manifest.json"
    )
    assert not ctx.compacted(run)
    plan = ctx.reconcile(run)
    assert plan == [("rsieve.compact", {})]
    _accepted_all(_finish(stack, run, started))
    assert ctx.reconcile(run) == []


def test_compactor_killed_inside_a_partition(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    """The compactor's child dies after writing a partition's Parquet shards, before its
    summary: nothing is committed until the partition is done again (its message comes
    back after the visibility timeout), and then the run is committed once."""
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["partkill"])
    report = _finish(stack, run, started)
    _accepted_all(report)
    assert (pools["partkill"].parent / f"partition-crash-{run}").exists()
    log = (stack.logs / "compactor.log").read_text(errors="replace")
    assert "crashing in p0" in log
    settings = stack_settings(stack)
    manifest = json.loads(S3Store(settings).get("datasets/partkill/manifest.json"))
    assert manifest["runs"] == [run]
    assert {s["path"].split(f"{run}-")[1][:4] for s in manifest["shards"]} <= {
        "p000",
        "p001",
        "p002",
        "p003",
    }


def test_poison_item_is_quarantined_after_max_deliveries(
    fault_stack: tuple[Stack, dict[str, Path]],
) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["poison"])
    report = _finish(stack, run, started)
    words = report["families"]["SynthWords"]
    assert words["quarantined_by_reason"] == {"max_deliveries": 1}
    _accepted_all(report)


def test_s3_stopped_mid_run_and_started_again(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["s3down"])
    _wait_stage(stack, run, "clean")
    wait_until("no shard of the run was held", lambda: held(stack, run), 60)
    retries = counter(stack, "rsieve_task_retries")
    stack.stop("s3")
    # Down until the workers have met it: a storage call failed and its task was retried.
    wait_until(
        "no task met the stopped S3",
        lambda: counter(stack, "rsieve_task_retries") > retries,
        120,
    )
    stack.up()
    _accepted_all(_finish(stack, run, started))


def test_an_item_the_verifier_raises_on_is_quarantined_and_the_run_completes(
    fault_stack: tuple[Stack, dict[str, Path]],
) -> None:
    stack, pools = fault_stack
    started = time.monotonic()
    run = _submit(stack, pools["raise"])
    report = _finish(stack, run, started)
    words = report["families"]["SynthWords"]
    assert words["quarantined_by_reason"] == {"stage_error": 1}
    _accepted_all(report, ITEMS - 1)
    ctx = bootstrap(stack_settings(stack))
    _, outputs = ctx.load_run(run)
    (q,) = [q for out in outputs["verify"].values() for q in out.quarantined]
    assert q.id == "raise-001" and q.stage == "verify"
    assert q.detail.startswith("verify: ValueError: injected failure on raise-001 (rsieve ")
    # The fault landed: the shard's tries raised and were counted before it was isolated.
    log = (stack.logs / "verifier.log").read_text(errors="replace")
    assert "raised ValueError (try 1)" in log and "quarantining an item that raises" in log


def test_every_item_failing_stops_the_run_until_reconcile_resumes_it(
    fault_stack: tuple[Stack, dict[str, Path]],
) -> None:
    """Every item of the pool raising at the verifier (what a broken setting does): the run
    stops with its reason, status says it cannot finish, nothing is quarantined item by
    item; once the cause is gone, `rsieve reconcile` resumes it and it completes."""
    stack, pools = fault_stack
    settings = stack_settings(stack)
    ctx = bootstrap(settings)
    started = time.monotonic()
    run = _submit(stack, pools["halt"])
    deadline = time.monotonic() + 120
    while not ctx.store.exists(keys.run_failed(run)):
        assert time.monotonic() < deadline, "the run never stopped"
        time.sleep(0.2)
    failure = RunFailure.model_validate_json(ctx.store.get(keys.run_failed(run)))
    assert failure.task == "rsieve.verify" and failure.error == "ValueError"
    status = api_request(settings, "GET", f"/runs/{run}").json()
    assert status["cannot_finish"], status
    assert any("ValueError" in f["reason"] for f in status["failed"]), status["failed"]
    assert not ctx.stored_shards(run, "verify"), "no verify output while it is stopped"
    # The cause fixed (the file no longer names the pool), then resumed by hand.
    (pools["halt"].parent / "raising.json").write_text(json.dumps(["raise-001"]))
    plan = ctx.reconcile(run)
    assert any(task == "rsieve.verify" for task, _ in plan)
    report = _finish(stack, run, started)
    assert report["families"]["SynthWords"]["quarantined"] == 0
    _accepted_all(report)
    assert not ctx.store.exists(keys.run_failed(run))


def test_stage_output_corrupted_in_s3_is_redone(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    """A generator output torn in SeaweedFS between stages (the verifier stopped until every
    shard is generated, so none is read before the fault): the verifier finds it, moves it
    aside with its record, counts it, and the generator does that shard again; the run
    completes and `rsieve audit` holds."""
    import redis

    from rsieve.keys import corrupt_prefix, stage_output
    from tests.e2e.cli import run_cli

    stack, pools = fault_stack
    settings = stack_settings(stack)
    ctx = bootstrap(settings)
    started = time.monotonic()
    stack.stop("verifier")
    try:
        run = _submit(stack, pools["corrupt"])
        _wait_stage(stack, run, "generate", count=ITEMS // 4, timeout=180)
        shard = sorted((ctx.shard_index(run) or {})["shards"])[0]
        key = stage_output(run, "generate", shard)
        written = ctx.store.get(key)
        ctx.store.put(key, written[: len(written) // 2])  # a partial write
    finally:
        stack.up()
    _accepted_all(_finish(stack, run, started))
    records = [
        json.loads(ctx.store.get(k))
        for k in ctx.store.list(corrupt_prefix(run))
        if k.endswith("json")
    ]
    assert [(r["stage"], r["shard"], r["reason"], r["read_by"]) for r in records] == [
        ("generate", shard, "unparsable", "rsieve.verify")
    ]
    assert records[0]["bytes"] == len(written) // 2
    counted = redis.Redis.from_url(settings.redis_url).hget(
        redis_keys.metric_counter("rsieve_corrupt_outputs"), json.dumps(["generate", "unparsable"])
    )
    assert counted is not None and float(counted) == 1.0
    # Redone: the shard's output is whole again, sealed, and read by every stage after it.
    assert ctx.store.get(key) != written[: len(written) // 2]
    assert len(ctx.load(run, "generate", shard).generations) == 4
    audit = run_cli(stack, "audit", run)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert ctx.reconcile(run) == []


def test_no_secret_in_any_log(fault_stack: tuple[Stack, dict[str, Path]]) -> None:
    """After every fault above (tracebacks included), no log of the stack holds the S3
    secret key."""
    stack, _ = fault_stack
    logs = sorted(stack.logs.glob("*.log"))
    assert len(logs) >= 8
    for log in logs:
        assert stack.config.secret_key not in log.read_text(errors="replace"), log.name
