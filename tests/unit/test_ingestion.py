"""Ingest in rounds (rsieve.clean.ingestion, services/cleaner/ingest.py): the plan numbers lines
and cuts shards as `split_pool` does, whatever the chunks it streams; a messy pool ingested
in one task (the rounds in process, `ingest_in_process`: one range, one partition) and in
round tasks of many ranges and partitions gives the same clean-stage inputs, cleaning.json
and shard index, byte for byte, so partitioning changes no decision; and no round task
reads the pool file whole."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from rsieve import redis_keys
from rsieve.adapters import storage
from rsieve.adapters.pools import upload_pool
from rsieve.clean.decontam import (
    answer_key,
    build_evalset,
    dataset_keys,
    evalset_key,
    near_keys_key,
    question_key,
)
from rsieve.clean.ingestion import plan_ingest, range_lines
from rsieve.run.shards import split_pool
from rsieve.run.submission import digest_of, pool_digest
from rsieve.settings import Settings
from services.api import submission as api_submission
from services.api.submission import submit
from services.cleaner import ingest as ingest_steps
from services.cleaner.tasks import register as clean_tasks
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent
from tests.unit.test_decontam import _bytes, _sign

MESSY = (
    b'{"id": "a"}\n'
    b"\n"
    b"   \r\n"
    b'{"id": "b", "x": "\xff"}\n'
    b'{"id": "a"}\r\n'
    b"not json\n"
    b"\t\n"
    b'{"id": "c"}\n'
    b'{"id": "d"}\n'
    b'{"id": "e"}'  # no final newline
)


@pytest.mark.parametrize("chunk", [1, 3, 16, 1 << 20])
@pytest.mark.parametrize("range_items", [1, 2, 3, 100])
def test_the_plan_cuts_lines_and_shards_as_split_pool(chunk: int, range_items: int) -> None:
    shards, blank = split_pool(MESSY, 2)
    chunks = [MESSY[i : i + chunk] for i in range(0, len(MESSY), chunk)]
    plan = plan_ingest(chunks, shard_size=2, range_items=range_items)
    assert plan.blank_lines == blank == [2, 3, 7]
    assert plan.lines == sum(map(len, shards)) == 7
    assert plan.shards() == {f"{n:05d}": len(s) for n, s in enumerate(shards)}
    expected = [(pl.line, pl.raw, pl.utf8) for s in shards for pl in s]
    got = [
        (pl.line, pl.raw, pl.utf8)
        for r in plan.ranges
        for pl, _ in range_lines(MESSY[r.start : r.end], r.first_line)
    ]
    assert got == expected
    assert all(r.lines <= max(2, -(-range_items // 2) * 2) for r in plan.ranges)
    if range_items == 1:
        assert len(plan.ranges) == 4 and plan.partitions == 8
    assert plan.range_of(10) == len(plan.ranges) - 1


def test_an_empty_pool_is_one_empty_range() -> None:
    plan = plan_ingest([b""], shard_size=4, range_items=10)
    assert len(plan.ranges) == 1 and plan.lines == 0 and plan.shards() == {}


WORDS_Q = "What word is written in the image?"


def messy_pool(folder: Path) -> Path:
    """Every whole-pool decision, several times over, spread over the pool."""
    folder.mkdir(parents=True)
    outside = folder.parent / "outside.png"
    outside.write_bytes(_bytes(_sign("outside")))
    os.symlink(outside, folder / "link.png")
    lines: list[str] = []

    def add(**rec: Any) -> None:
        lines.append(json.dumps(rec))

    for i in range(48):
        name = f"w{i}.png"
        (folder / name).write_bytes(_bytes(_sign(f"word-{i}")))
        origin = "other-set" if i % 16 == 5 else "signs"
        question = "What colour is the car?" if i % 12 == 7 else WORDS_Q
        source = {"dataset": origin} if question == WORDS_Q else {"row": i}  # no origin
        add(
            id=f"w{i}",
            family="SynthWords",
            image=name,
            question=question,
            answer=f"W{i}",
            source=source,
        )
        if i % 10 == 3:  # the same image and question again: an exact duplicate
            add(
                id=f"dup{i}",
                family="SynthWords",
                image=name,
                question=WORDS_Q,
                answer=f"W{i}",
                source={"dataset": "signs"},
            )
        if i % 10 == 4:  # a re-encoded copy, same question and answer: a near-duplicate
            copy = f"copy{i}.jpg"
            (folder / copy).write_bytes(_bytes(_sign(f"word-{i}").resize((200, 80)), "JPEG"))
            add(
                id=f"near{i}",
                family="SynthWords",
                image=copy,
                question=WORDS_Q,
                answer=f"W{i}",
                source={"dataset": "signs"},
            )
        if i % 9 == 2:
            lines.append("")  # blank lines shift numbers, not shards
        if i % 11 == 6:  # a repeated id first, then a line whose (image, question) only
            # the repeated-id line shares: it keeps the item
            (folder / f"x{i}.png").write_bytes(_bytes(_sign(f"x-{i}")))
            add(
                id=f"w{i}",
                family="SynthWords",
                image=f"x{i}.png",
                question=WORDS_Q,
                answer="X",
                source={"dataset": "signs"},
            )
            add(
                id=f"y{i}",
                family="SynthWords",
                image=f"x{i}.png",
                question=WORDS_Q,
                answer="X",
                source={"dataset": "signs"},
            )
    for i in range(12):
        name = f"c{i}.png"
        (folder / name).write_bytes(_bytes(_sign(f"choice-{i}")))
        add(
            id=f"c{i}",
            family="SynthChoice",
            image=name,
            protocol="mc",
            question=f"Which sign is it? {i}",
            options=["A. one", "B. two"],
            answer="A",
        )
    add(id="bad-image", family="SynthWords", image="../w1.png", question=WORDS_Q, answer="Q")
    add(id="missing", family="SynthWords", image="nowhere.png", question=WORDS_Q, answer="Q")
    add(id="linked", family="SynthWords", image="link.png", question=WORDS_Q, answer="Q")
    add(id="later-linked", family="SynthWords", image="link.png", question="Hm?", answer="Q")
    lines.append("{not json")
    add(id="no-protocol", family="Unknown", image="w2.png", question="Who?", answer="Q")
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


# Settings takes each value as its field's type (Any: a test's overrides are of every type).
INGEST_DEFAULTS: dict[str, Any] = {
    "purity_embedding": False,
    "shard_size": 4,
    "provenance_policy": "lenient",
}


class Ingest:
    """The cleaner's tasks on fakes; `run` submits the pool and drains every ingest task."""

    def __init__(self, **settings: Any) -> None:
        self.store, self.sent = ReadLog(), Sent()
        self.ctx = bootstrap(
            Settings(**(INGEST_DEFAULTS | settings)),
            store=self.store,
            redis_client=fakeredis.FakeRedis(),
            send=self.sent,
        )
        clean_tasks(self.ctx)

    def run(self, pool: Path) -> tuple[str, list[str]]:
        uri = upload_pool(self.store, pool)
        prefix = uri.split("/", 3)[3]
        index = json.loads(self.store.get(prefix + "_packs/index.json"))["images"]
        # An evaluation set holding one image; the dataset already holding another.
        es, _ = build_evalset(
            "held-out",
            json.dumps({"image": "w9.png", "question": "?"}).encode(),
            lambda p: (pool / p).read_bytes(),
        )
        self.store.put(evalset_key("held-out"), es.to_json())
        committed = [(index["w20.png"]["phash"], question_key(WORDS_Q), answer_key("W20"), ())]
        self.store.put(near_keys_key("grow", "earlier"), dataset_keys(committed))
        run = submit(self.ctx, uri, "grow")
        self.store.reads.clear()
        self.store.keys.clear()
        ran, done = [], 0
        while done < len(self.sent.tasks):
            task, kw = self.sent.tasks[done]
            done += 1
            if task.startswith("rsieve.ingest"):
                self.ctx.app.tasks[task](**kw)
                ran.append(task if task == "rsieve.ingest" else f"{task}:{kw['step']}")
        return run, ran

    def outputs(self, run: str) -> dict[str, bytes]:
        keep = (f"runs/{run}/input/", f"runs/{run}/cleaning.json", f"runs/{run}/shards.json")
        return {k: v for k, v in self.store.objects.items() if k.startswith(keep)}


class ReadLog(MemoryStore):
    """A MemoryStore that records what is read of items.jsonl, (start, end) per read, and
    the keys read whole."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int]] = []
        self.keys: list[str] = []

    def get(self, key: str) -> bytes:
        data = super().get(key)
        self.keys.append(key)
        if key.endswith("items.jsonl"):
            self.reads.append((0, len(data)))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if key.endswith("items.jsonl"):
            self.reads.append((start, end))
        return MemoryStore.get(self, key)[start:end]


def test_a_pool_ingested_in_round_tasks_is_the_pool_ingested_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_steps, "SCAN_BYTES", 64)
    monkeypatch.setattr(storage, "INDEX_BUCKETED_FROM", 16)  # the upload writes buckets
    pool = messy_pool(tmp_path / "pool")
    whole, rounds = Ingest(), Ingest(ingest_range_items=10)
    run, ran_whole = whole.run(pool)
    run_r, ran = rounds.run(pool)
    assert run == run_r  # ingest_range_items decides nothing
    assert ran_whole == ["rsieve.ingest"]  # every round in that task, in memory
    assert not any(f"runs/{run}/ingest/" in key for key in whole.store.objects)
    steps = {name: ran.count(name) for name in ran}
    plan = json.loads(rounds.store.get(f"runs/{run}/ingest/plan.json"))
    ranges, partitions = len(plan["ranges"]), plan["partitions"]
    assert ranges >= 6 and partitions == 16
    assert steps["rsieve.ingest_part:map"] == steps["rsieve.ingest_part:apply"] == ranges
    for step in ("ids", "join", "exact", "screen", "purity"):
        assert steps[f"rsieve.ingest_part:{step}"] == partitions

    expected, got = whole.outputs(run), rounds.outputs(run)
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert json.loads(got[key]) == json.loads(expected[key]), key
        assert got[key] == expected[key], key

    # The pool exercised every decision taken across lines.
    lines = [
        pl for key, data in expected.items() if "/input/" in key for pl in json.loads(data)["lines"]
    ]
    verdicts = [pl["verdict"][0] for pl in lines if pl["verdict"]]
    assert {"duplicate_item", "contaminated", "off_task", "image_symlink"} <= set(verdicts)
    details = " ".join(pl["verdict"][1] for pl in lines if pl["verdict"])
    assert "already in the dataset" in details and "within" in details
    assert "same image and question as line" in details
    assert sum(pl["duplicate_of"] is not None for pl in lines) == 4
    rules = {pl["purity"] for pl in lines if pl["purity"]}
    assert {"origin_on", "origin_off", "template_off"} <= rules
    by_id = {json.loads(pl["raw"]).get("id"): pl for pl in lines if pl["raw"].startswith('{"')}
    assert by_id["y6"]["verdict"] is None  # its (image, question) is a repeated id's alone

    # Rounds read the pool file by range (and the plan by chunk), never whole.
    size = len((pool / "items.jsonl").read_bytes())
    assert (0, size) in whole.store.reads
    largest = max(r["end"] - r["start"] for r in plan["ranges"])
    assert largest < size / 4
    assert all(end - start <= max(64, largest) for start, end in rounds.store.reads)
    # ... and the pack index by bucket: each join task its partition's 16 of 256.
    assert not any(k.endswith("_packs/index.json") for k in rounds.store.keys)
    buckets = [k for k in rounds.store.keys if "/_packs/index/" in k]
    assert len(buckets) == len(set(buckets)) == 256


def test_a_round_task_that_dies_or_is_lost_is_done_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task that dies after writing part of its records leaves no `done` record, so its
    redelivery writes them again; a task whose message is lost leaves the run to the
    sweeper's reconcile, which sends `rsieve.ingest`, which sends what is missing. The
    result is the pool ingested whole."""
    pool = messy_pool(tmp_path / "pool")
    whole, rounds = Ingest(), Ingest(ingest_range_items=10)
    run, _ = whole.run(pool)
    real_put = ingest_steps._put
    deaths: list[str] = []

    def dies_once(ctx: Any, run_: str, kind: str, src: str, by_dest: Any) -> None:
        real_put(ctx, run_, kind, src, by_dest)
        if kind == "joined" and by_dest and not deaths:
            deaths.append(src)
            raise SystemExit("the worker died")  # the join's records written, not `done`

    monkeypatch.setattr(ingest_steps, "_put", dies_once)
    uri = upload_pool(rounds.store, pool)
    rounds.store.put(evalset_key("held-out"), whole.store.get(evalset_key("held-out")))
    near = near_keys_key("grow", "earlier")
    rounds.store.put(near, whole.store.get(near))
    assert submit(rounds.ctx, uri, "grow") == run
    rounds.ctx.app.tasks["rsieve.ingest"](run=run)  # called twice (a redelivery)
    sent, done = rounds.sent.tasks, 0
    died: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    while done < len(sent):
        task, kw = sent[done]
        done += 1
        if not task.startswith("rsieve.ingest"):
            continue
        if kw.get("step") == "screen" and kw["part"] == 3 and not lost:
            lost.append(kw)  # the message is lost
            continue
        try:
            rounds.ctx.app.tasks[task](**kw)
        except SystemExit:
            died.append(kw)
            sent.append((task, kw))  # redelivered
    assert died and died[0]["step"] == "join" and lost
    assert not rounds.store.exists(f"runs/{run}/shards.json")  # stalled: screen 3 never ran
    maps = [kw for task, kw in sent if kw.get("step") == "map"]
    assert len(maps) == len({kw["part"] for kw in maps})  # each range's task sent once
    reconciled = rounds.ctx.reconcile(run)
    assert reconciled == [("rsieve.ingest", {})]  # sent with the run
    rounds.ctx.app.tasks["rsieve.ingest"](run=run)
    assert sent[-1][0] == "rsieve.ingest"  # the screen round was sent within sweep_after_s
    rounds.ctx.redis.delete(redis_keys.ingest_sent(run, "screen"))  # ... which has passed
    rounds.ctx.app.tasks["rsieve.ingest"](run=run)
    assert sent[-1] == ("rsieve.ingest_part", {"run": run, "step": "screen", "part": 3})
    while done < len(sent):
        task, kw = sent[done]
        done += 1
        if task.startswith("rsieve.ingest"):
            rounds.ctx.app.tasks[task](**kw)
    assert rounds.outputs(run) == whole.outputs(run)


def test_the_api_digests_a_large_pool_without_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST /runs recomputes the pool's digest: items.jsonl in ranged reads, a bucketed
    index bucket by bucket (never index.json), and the digest is the uploader's, the same
    as from the whole index."""
    monkeypatch.setattr(storage, "INDEX_BUCKETED_FROM", 16)
    monkeypatch.setattr(api_submission, "DIGEST_CHUNK", 64)
    pool = messy_pool(tmp_path / "pool")
    ingest = Ingest()
    uri = upload_pool(ingest.store, pool)
    prefix = uri.split("/", 3)[3]
    assert ingest.store.exists(prefix + "_refused.json")  # the refused link is digested too
    marker = ingest.store.get(prefix + "_complete").decode()
    ingest.store.reads.clear()
    ingest.store.keys.clear()

    opened: list[int] = []
    real_merged = api_submission._merged

    def merged(paths: list[Path]) -> Any:
        opened.append(len(paths))
        return real_merged(paths)

    monkeypatch.setattr(api_submission, "_merged", merged)
    assert api_submission.stored_pool_digest(ingest.ctx, prefix) == marker
    assert max(opened) <= api_submission.MERGE_FAN_IN and len(opened) == 16 + 1  # 256 -> 16 -> 1
    assert ingest.store.reads and all(end - start <= 64 for start, end in ingest.store.reads)
    assert not any(k.endswith("_packs/index.json") for k in ingest.store.keys)
    assert sum(k.startswith(prefix + "_packs/index/") for k in ingest.store.keys) == 256

    # The same pool with its index whole (a small pool, or one packed before buckets).
    for key in [k for k in ingest.store.objects if k.startswith(prefix + "_packs/index/")]:
        ingest.store.delete(key)
    assert api_submission.stored_pool_digest(ingest.ctx, prefix) == marker


def test_a_streamed_digest_is_the_pool_digest_and_wants_name_order() -> None:
    items, files = b'{"id": "1"}\n', {"b.png": "11" * 32, "a.png": "22" * 32}
    streamed = [(name, bytes.fromhex(files[name])) for name in ("a.png", "b.png")]
    items_sha = hashlib.sha256(items).digest()
    assert digest_of(items_sha, streamed, None) == pool_digest(items, files)
    assert digest_of(items_sha, streamed, bytes(32)) != pool_digest(items, files)
    with pytest.raises(ValueError, match="out of name order"):
        digest_of(items_sha, streamed[::-1], None)
