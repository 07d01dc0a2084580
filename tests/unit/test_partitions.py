"""Compaction in partitions (rsieve.run.partitions, services/compactor/steps.py), through every
stage's registered task wired by `bootstrap` with fakes (the stochastic stand-in of
test_best_of_n, named as one, at p = 0.6 so there are accepted and rejected items; an
abstaining judge): a run's export is the same dataset whether compacted in one partition
or many; the enqueued route, partition and commit tasks drain to one commit; a worker that
dies inside a partition leaves the dataset as it was, and the compaction completes when
the task comes again; a partition overtaken by another run's commit is done again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rsieve import redis_keys
from rsieve.compact.keyindex import keys_of
from rsieve.run.partitions import (
    merge_summaries,
    outcome_partition,
    partition_count,
    route_groups,
    sorted_lines,
)
from tests.fakes import MemoryStore
from tests.fakestack import FakeStack
from tests.unit.test_best_of_n import Abstain, StochasticStandIn, make_pool

ITEMS = 96


def test_partition_count_is_a_power_of_two_of_at_most_the_items() -> None:
    assert partition_count(10, 20) == 1
    assert partition_count(20, 20) == 1
    assert partition_count(21, 20) == 2
    assert partition_count(200_000, 20_000) == 16
    assert partition_count(10**9, 1) == 256
    assert {outcome_partition(f"{b:02x}" + "0" * 62, 16) for b in range(256)} == set(range(16))
    assert route_groups(["b", "a", "c"], 2) == [["a", "b"], ["c"]]


def test_quarantine_listings_merge_in_line_order() -> None:
    a = ['{"line": 1}\n', '{"line": 7}\n']
    b = ['{"line": 3}\n', '{"line": 12}\n']
    assert [json.loads(x)["line"] for x in sorted_lines([a, b])] == [1, 3, 7, 12]


def test_examples_are_the_runs_first_rows_by_line() -> None:
    def summary(examples: dict[str, list[Any]]) -> dict[str, Any]:
        return {
            "shards": [],
            "qa_keys": {},
            "promotions": [],
            "already_in_dataset": [],
            "models": {},
            "protocols": [],
            "families": [],
            "examples": examples,
            "dataset_keys": {"held": 3, "streamed": 2},
            "report": {},
        }

    merged = merge_summaries(
        [
            summary({"s": [[5, {"q": 5}, "e5"], [9, {"q": 9}, "e9"]]}),
            summary({"s": [[1, {"q": 1}, "e1"], [7, {"q": 7}, "e7"]]}),
        ]
    )
    assert [path for _, path in merged["examples"]["s"]] == ["e1", "e5", "e7"]
    assert merged["dataset_keys"] == {"held": 3, "streamed": 4}  # most held at once, all read


class Stack(FakeStack):
    """The FakeStack (tests/fakestack.py) with this module's models and small shards."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(
            judge=Abstain(), generator=StochasticStandIn(0.6), **({"shard_size": 8} | settings)
        )

    def rows(self, dataset: str, *, images: bool = True) -> dict[str, list[dict[str, Any]]]:
        out = super().rows(dataset, images=images)
        return {split: sorted(rows, key=lambda r: r["image_sha256"]) for split, rows in out.items()}


def _asked_again(pool: Path) -> Path:
    """The pool's images with questions of their own: new entries for the dataset."""
    lines = [json.loads(x) for x in (pool / "items.jsonl").read_text().splitlines()]
    for line in lines:
        line["question"] += ", please"
    (pool / "items.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return pool


def _index(stack: Stack) -> dict[str, list[bytes]]:
    manifest = json.loads(stack.store.get("datasets/d/manifest.json"))
    return {
        bucket: keys_of(stack.store.get("datasets/d/" + path))
        for bucket, path in manifest["qa_keys"].items()
    }


def _figures(store: MemoryStore, dataset: str) -> dict[str, Any]:
    report = json.loads(store.get(f"datasets/{dataset}/run_report.json"))
    report.pop("dataset_keys")  # what each partition read of the key index
    return dict(report)


def _card_text(store: MemoryStore, dataset: str) -> list[str]:
    """The card less the lines naming Parquet files (their names carry the partition)."""
    card = store.get(f"datasets/{dataset}/README.md").decode()
    return [line for line in card.splitlines() if ".parquet" not in line]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pool(tmp_path_factory.mktemp("parts") / "pool", ITEMS)


def test_one_partition_or_many_make_the_same_dataset(pool: Path) -> None:
    # The judge calibrated, on a sample smaller than a routing group's share, so that the
    # run's bottom-k is made from the groups' own.
    calibrated = {"judge_calibration_rate": 1.0, "judge_calibration_size": 5}
    one = Stack(**calibrated)
    run = one.run_until_compaction(pool, "d")
    one.ctx.app.tasks["rsieve.compact"](run=run)
    assert one.drain() == []  # one partition: compacted in the one task

    many = Stack(compact_partition_items=12, compact_route_shards=3, **calibrated)
    assert many.run_until_compaction(pool, "d") == run
    many.ctx.app.tasks["rsieve.compact"](run=run)
    ran = many.drain()
    plan = json.loads(many.store.get(f"runs/{run}/compact/plan.json"))
    assert plan["partitions"] == 8 and len(plan["groups"]) == 4  # 96 lines; 12 shards of 8
    assert ran.count("rsieve.compact_route") == 4
    assert ran.count("rsieve.compact_partition") == 8
    manifest = json.loads(many.store.get("datasets/d/manifest.json"))
    assert manifest["runs"] == [run]
    assert any("-p00" in s["path"] for s in manifest["shards"])

    assert many.rows("d") == one.rows("d")  # the same rows, images and all
    assert sum(len(r) for r in one.rows("d").values()) >= ITEMS  # think + nothink + rejected
    assert _figures(many.store, "d") == _figures(one.store, "d")
    calibration = _figures(one.store, "d")["calibration"]
    assert calibration and all(f["items"] == 5 for f in calibration.values())
    assert _figures(one.store, "d")["tokens"]["total"]["judge"]["calibration"]["calls"] > 5
    assert _card_text(many.store, "d") == _card_text(one.store, "d")
    for name in ("quarantine.jsonl", "run_spec.json"):
        assert many.store.get(f"datasets/d/{name}") == one.store.get(f"datasets/d/{name}")
    assert _index(many) == _index(one)  # the key index holds the same entries
    # Memory per task: each partition held about its share of the run's keys.
    held = json.loads(many.store.get("datasets/d/run_report.json"))["dataset_keys"]["held"]
    assert held < ITEMS / 2


def test_a_partition_that_dies_leaves_the_dataset_as_it_was(
    pool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = Stack(compact_partition_items=12, compact_route_shards=3)
    run = many.run_until_compaction(pool, "d")
    many.ctx.app.tasks["rsieve.compact"](run=run)
    many.drain("rsieve.compact_route")
    many.done = len(many.sent.tasks) - 1  # the coordinator the last route sent
    many.drain()  # ... which sends the partitions, which run; the commit follows
    assert json.loads(many.store.get("datasets/d/manifest.json"))["runs"] == [run]
    committed = dict(many.store.objects)

    # A second run's compaction where the worker dies inside partition 1's Parquet upload.
    second = _asked_again(make_pool(pool.parent / "second", 40))
    run2 = many.run_until_compaction(second, "d")
    many.ctx.app.tasks["rsieve.compact"](run=run2)
    many.drain("rsieve.compact_route")
    many.done = len(many.sent.tasks) - 1  # the coordinator the last route sent
    put_file = many.store.put_file

    def dies(key: str, path: str, **kw: Any) -> None:
        if "-p001-" in key:
            raise SystemExit("worker killed")
        put_file(key, path, **kw)

    monkeypatch.setattr(many.store, "put_file", dies)
    with pytest.raises(SystemExit):
        many.drain()
    assert many.store.get("datasets/d/manifest.json") == committed["datasets/d/manifest.json"]
    assert many.store.get("datasets/d/README.md") == committed["datasets/d/README.md"]
    monkeypatch.undo()
    # The partition's message comes back (late acks): it is done and the run committed.
    task, kw = many.sent.tasks[many.done - 1]
    assert (task, kw["partition"]) == ("rsieve.compact_partition", 1)
    many.ctx.app.tasks[task](**kw)
    many.drain()
    manifest = json.loads(many.store.get("datasets/d/manifest.json"))
    assert manifest["runs"] == [run, run2]
    report = json.loads(many.store.get(f"datasets/d/commits/{run2}/run_report.json"))
    assert report["adds_up"] is True


def test_a_coordinator_called_again_sends_each_fan_out_once(pool: Path) -> None:
    """The judge's last shards, redeliveries and the sweeper each call the coordinator;
    routes and partitions are sent once, and a lost one again once the key has expired."""
    many = Stack(compact_partition_items=12, compact_route_shards=3)
    run = many.run_until_compaction(pool, "d")
    for _ in range(3):
        many.ctx.app.tasks["rsieve.compact"](run=run)
    assert many.drain("rsieve.compact_route") == ["rsieve.compact_route"] * 4
    start = len(many.sent.tasks)  # the routes' own coordinator calls were passed over: ...
    for _ in range(3):
        many.ctx.app.tasks["rsieve.compact"](run=run)  # ... the coordinator, called 3 times
    sent = [kw["partition"] for t, kw in many.sent.tasks[start:] if t == "rsieve.compact_partition"]
    assert sorted(sent) == list(range(8))  # once each, not once per call
    lost = many.sent.tasks.pop(start)  # partition 0's message is lost
    assert lost[0] == "rsieve.compact_partition"
    ran = many.drain()
    assert ran.count("rsieve.compact_partition") == 7
    assert not many.store.exists("datasets/d/manifest.json")
    many.ctx.redis.delete(redis_keys.compact_sent(run, "g0"))  # sweep_after_s has passed
    many.ctx.app.tasks["rsieve.compact"](run=run)  # the sweeper's call
    assert many.drain() == ["rsieve.compact_partition", "rsieve.compact"]
    assert json.loads(many.store.get("datasets/d/manifest.json"))["runs"] == [run]


def test_a_partition_overtaken_by_another_commit_is_done_again(pool: Path) -> None:
    """Run A's partitions are sent against the empty dataset (generation 0); before they
    run, run B (A's first 40 items, a pool of its own) commits. A's partitions find the
    dataset moved on and A is compacted again against it: B's 40 entries are not added
    twice."""
    many = Stack(compact_partition_items=12, compact_route_shards=3)
    run_a = many.run_until_compaction(pool, "d")
    many.ctx.app.tasks["rsieve.compact"](run=run_a)
    many.drain("rsieve.compact_route")
    many.done = start = len(many.sent.tasks) - 1
    many.drain("rsieve.compact")  # the coordinator: it sends the partitions at generation 0
    pending = many.sent.tasks[start + 1 :]
    assert pending and all(t == "rsieve.compact_partition" and kw["gen"] == 0 for t, kw in pending)
    many.done = len(many.sent.tasks)

    run_b = many.run_until_compaction(make_pool(pool.parent / "b", 40), "d")
    many.ctx.app.tasks["rsieve.compact"](run=run_b)
    many.drain()
    assert json.loads(many.store.get("datasets/d/manifest.json"))["runs"] == [run_b]

    for task, kw in pending:  # A's partitions, delivered now
        many.ctx.app.tasks[task](**kw)
    ran = many.drain()
    assert "rsieve.compact_partition" in ran  # again, at generation 1
    manifest = json.loads(many.store.get("datasets/d/manifest.json"))
    assert manifest["runs"] == [run_b, run_a]
    report_a = json.loads(many.store.get(f"datasets/d/commits/{run_a}/run_report.json"))
    assert sorted(report_a["already_in_dataset"]) == sorted(f"bon-{i}" for i in range(40))
    assert report_a["adds_up"] is True
    ids = [r["qa"][0]["id"] for rows in many.rows("d").values() for r in rows]
    nothink = [
        i for split, rows in many.rows("d").items() if split.endswith("nothink") for i in rows
    ]
    assert len({r["image_sha256"] for r in nothink}) == len(nothink)  # each entry once
    assert ids


def test_a_fan_out_is_sent_again_by_its_own_message_redelivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coordinator whose worker dies while sending comes back with the same message id
    and sends again; another message's call does not (Context.send_once)."""
    import services.fanout as fanout

    ctx = Stack().ctx
    for message, sends in (("m1", True), ("m2", False), ("m1", True), (None, False)):
        monkeypatch.setattr(fanout, "delivery_id", lambda m=message: m)
        assert ctx.send_once(redis_keys.compact_sent("r", "g0")) is sends, message
    monkeypatch.setattr(fanout, "delivery_id", lambda: None)
    assert ctx.send_once(redis_keys.compact_sent("r", "g1")) is True
    assert ctx.send_once(redis_keys.compact_sent("r", "g1")) is False
