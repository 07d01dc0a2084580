"""A stored stage output that is not what its writer stored (a partial write, a truncated
or garbled object) is found by the stage that reads it (rsieve.envelope), moved aside with
a record of why, counted, and its stage done again for that shard (Context.redo): the run
completes, every item placed once. On the FakeStack; tests/e2e/test_faults.py corrupts an
object in the real SeaweedFS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsieve import keys, redis_keys
from rsieve.dataset.audit import audit_run
from rsieve.errors import CorruptOutputError
from tests.e2e.pools import word_pool
from tests.fakes import MemoryStore
from tests.fakestack import FakeStack, ReplayModel

ITEMS = 12  # 3 shards of 4
DATASET = "corrupt"


class PartialWrites(MemoryStore):
    """The store, except that the first write of each key in `torn` keeps half its bytes
    and the first of each in `garbled` has one byte changed (the writer never knows)."""

    def __init__(self) -> None:
        super().__init__()
        self.torn: set[str] = set()
        self.garbled: set[str] = set()

    def put(self, key: str, data: bytes, **kwargs: Any) -> None:
        if key in self.torn:
            self.torn.discard(key)
            data = data[: len(data) // 2]
        elif key in self.garbled:
            self.garbled.discard(key)
            at = len(data) // 3
            data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
        super().put(key, data, **kwargs)


def _stack(tmp_path: Path, **settings: Any) -> tuple[FakeStack, PartialWrites, ReplayModel, Path]:
    replay: dict[str, dict[str, str]] = {}
    pool = word_pool(tmp_path / "pool", "corrupt", replay, count=ITEMS)
    store, model = PartialWrites(), ReplayModel(replay)
    stack = FakeStack(generator=model, judge=model, store=store, shard_size=4, **settings)
    return stack, store, model, pool


def _corrupt_records(stack: FakeStack, run: str) -> list[dict[str, Any]]:
    prefix = keys.corrupt_prefix(run)
    return [stack.json(k) for k in stack.store.list(prefix) if k.endswith(".json")]


def _counted(stack: FakeStack) -> dict[tuple[str, ...], float]:
    raw = stack.ctx.redis.hgetall(redis_keys.metric_counter("rsieve_corrupt_outputs"))
    return {tuple(json.loads(k)): float(v) for k, v in raw.items()}


def _placed_once(stack: FakeStack, run: str) -> None:
    index, outputs = stack.ctx.load_run(run)
    assert index is not None
    result = audit_run(index, outputs)
    assert result.ok, result.problems
    report = stack.report(DATASET, run)
    assert report["adds_up"]
    rows = stack.rows(DATASET)
    ids = [
        qa["id"]
        for name, split in rows.items()
        if not name.endswith("_RS_nothink")  # the same rows without their reasoning
        for row in split
        for qa in row["qa"]
    ]
    assert len(ids) == len(set(ids))
    assert report["families"]["SynthWords"]["accepted"] == ITEMS


@pytest.mark.parametrize("partitions", [False, True], ids=["one-partition", "routed"])
def test_a_corrupt_output_is_redone_and_the_run_completes(tmp_path: Path, partitions: bool) -> None:
    settings = {"compact_partition_items": 4, "compact_route_shards": 2} if partitions else {}
    stack, store, model, pool = _stack(tmp_path, **settings)
    run = stack.submit(pool, DATASET)
    # Between stages: generate's output for 00000 is torn (verify reads it next); the
    # judge's for 00002 is garbled (the compaction reads it); the calibration of 00001
    # is torn (the compaction reads it too).
    store.torn |= {
        keys.stage_output(run, "generate", "00000"),
        keys.calibration(run, "00001"),
    }
    store.garbled.add(keys.stage_output(run, "judge", "00002"))
    stack.drain()
    assert not store.torn and not store.garbled  # every fault happened
    _placed_once(stack, run)
    found = {(r["stage"], r["shard"]): r for r in _corrupt_records(stack, run)}
    assert set(found) == {("generate", "00000"), ("judge", "00001"), ("judge", "00002")}
    assert found["generate", "00000"]["reason"] == "unparsable"
    assert found["judge", "00002"]["reason"] == "checksum"
    assert found["judge", "00001"]["key"] == keys.calibration(run, "00001")
    # Each kept as it was read, beside its record.
    for r in found.values():
        assert stack.store.get(keys.corrupt_copy(run, r["stage"], r["shard"], r["sha256"]))
    assert _counted(stack) == {
        ("generate", "unparsable"): 1.0,
        ("judge", "unparsable"): 1.0,
        ("judge", "checksum"): 1.0,
    }
    # Redone: the one shard's generation again (its 4 items), no other (the verifier
    # accepts every answer: the judge is asked nothing).
    assert model.asked == ITEMS + 4
    assert stack.ctx.reconcile(run) == []


def test_a_reader_ends_and_sends_the_writer_again(tmp_path: Path) -> None:
    """The reading task ends (acked, no exception loop); the writer's stage is sent for the
    shard; the outputs after it are gone, so each later stage is done again in order."""
    stack, _, _, pool = _stack(tmp_path)
    run = stack.run(pool, DATASET)
    key = keys.stage_output(run, "verify", "00001")
    stack.store.put(key, stack.store.get(key)[:-40])
    stack.store.delete(keys.stage_output(run, "judge", "00001"))  # judge reads it next
    sent = len(stack.sent.tasks)
    assert stack.task("rsieve.judge", run=run, shard="00001", lines=4) is None
    assert stack.sent.tasks[sent:] == [
        ("rsieve.verify", {"run": run, "shard": "00001", "lines": 4})
    ]
    assert not stack.store.exists(key)
    stack.drain()
    _placed_once(stack, run)
    # Any reader (the audit, the API): the same, and it raises for its caller to say so.
    stack.store.put(key, b"\x00" + stack.store.get(key)[1:])
    with pytest.raises(CorruptOutputError, match="checksum"):
        stack.ctx.load_run(run)
    assert not stack.store.exists(keys.stage_output(run, "judge", "00001"))
    assert not stack.store.exists(keys.calibration(run, "00001"))
    assert stack.ctx.reconcile(run)[0] == ("rsieve.verify", {"shard": "00001", "lines": 4})
    stack.drain()
    _placed_once(stack, run)


def test_outputs_written_before_seals_are_read_and_counted(tmp_path: Path) -> None:
    stack, _, _, pool = _stack(tmp_path)
    run = stack.run(pool, DATASET)
    key = keys.stage_output(run, "judge", "00000")
    sealed = stack.ctx.load(run, "judge", "00000")
    stack.store.put(key, sealed.model_dump_json().encode())  # as stored before seals
    assert stack.ctx.load(run, "judge", "00000") == sealed
    raw = stack.ctx.redis.hgetall(redis_keys.metric_counter("rsieve_unsealed_outputs"))
    assert {tuple(json.loads(k)): float(v) for k, v in raw.items()} == {("judge",): 1.0}
    assert not _corrupt_records(stack, run)


def test_a_corrupt_pack_index_refuses_the_run_with_its_reason(tmp_path: Path) -> None:
    """Pool data is not a stage's to redo: a garbled pack index is refused at submission
    (the API answers 422), and one garbled after it stops the run at ingest (services/
    stage.py), the reason naming the object and the fix."""
    from rsieve.adapters.pools import upload_pool
    from rsieve.errors import PermanentError
    from rsieve.run.failures import RunFailure
    from rsieve.run.packs import INDEX

    stack, _, _, pool = _stack(tmp_path, stage_error_retries=0)
    uri = upload_pool(stack.store, pool)
    (index,) = [k for k in stack.store.list("pools/") if k.endswith(INDEX)]
    written = stack.store.get(index)
    stack.store.put(index, written[:-10])
    with pytest.raises(PermanentError, match=f"pack index {index} is corrupt"):
        stack.submit(uri, DATASET)
    assert not any(stack.store.list("runs/"))
    stack.store.put(index, written)
    run = stack.submit(uri, DATASET)
    stack.store.put(index, written[:-10])
    for _ in range(6):
        try:
            stack.drain()
            break
        except Exception:  # noqa: BLE001 - the failure being retried (Celery's retry)
            stack.done -= 1  # delivered again
    failure = RunFailure.model_validate_json(stack.store.get(keys.run_failed(run)))
    assert failure.error == "PermanentError", failure
    assert f"pack index {index} is corrupt" in failure.message, failure.message
    assert "upload the pool again" in failure.message
    assert not stack.store.exists(keys.shards(run))


def test_a_corrupt_bucket_of_the_pack_index_stops_ingest_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a pool ingested in rounds from a bucketed index (ingest's join reads
    its buckets): the run stops, the reason naming the bucket."""
    from rsieve.adapters import storage
    from rsieve.adapters.pools import upload_pool
    from rsieve.run.failures import RunFailure

    monkeypatch.setattr(storage, "INDEX_BUCKETED_FROM", 1)  # the upload writes buckets
    stack, _, _, pool = _stack(tmp_path, stage_error_retries=0, ingest_range_items=4)
    uri = upload_pool(stack.store, pool)
    run = stack.submit(uri, DATASET)
    buckets = [k for k in stack.store.list("pools/") if "/_packs/index/" in k]
    assert buckets
    for key in buckets:
        stack.store.put(key, b'{"version":1,"images":{"x"')
    for _ in range(12):
        try:
            stack.drain()
            break
        except Exception:  # noqa: BLE001 - the failure being retried (Celery's retry)
            stack.done -= 1  # delivered again
    failure = RunFailure.model_validate_json(stack.store.get(keys.run_failed(run)))
    assert failure.task.startswith("rsieve.ingest"), failure
    assert "pack index pools/" in failure.message and "is corrupt" in failure.message
    assert not stack.store.exists(keys.shards(run))
