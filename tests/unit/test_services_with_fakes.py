"""The services' logic, wired by `bootstrap` with fakes (tests/fakes.py: an in-memory object
store, a recorder of enqueued tasks; fakeredis; a judge model that answers from a table):
the example pool through ingest, clean, verify, judge and compaction in one process, the
generator's replies made by `record_generations` (the real generator needs Triton:
tests/e2e). Every stage's task is the registered Celery task, called directly."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fakeredis
import pyarrow.parquet as pq
import pytest
from fastapi import HTTPException

from rsieve.dataset.audit import audit_run
from rsieve.generate.generation import (
    ModelInfo,
    ModelReply,
    ModelRequest,
    ready_items,
    record_generations,
)
from rsieve.images import prepare_image
from rsieve.schemas import ShardOutput
from rsieve.settings import Settings
from services.api.submission import submit
from services.cleaner.tasks import register as clean_tasks
from services.compactor.tasks import register as compact_tasks
from services.context import Context
from services.judge.tasks import register as judge_tasks
from services.verifier.tasks import register as verify_tasks
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent
from tests.fakestack import upload_once

ROOT = Path(__file__).resolve().parents[2]
JUDGE = ModelInfo(name="table-judge", version="1", interface="rsieve", kind="test")


class TableJudge:
    """Answers CORRECT to every judge prompt that holds `accept`, WRONG otherwise."""

    def __init__(self, accept: str) -> None:
        self.accept, self.asked = accept, 0
        self.info: ModelInfo | None = None

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = JUDGE
        self.asked += len(requests)
        return [
            ModelReply(
                text="CORRECT" if self.accept in r.prompt else "WRONG",
                finish_reason="stop",
                input_tokens=len(r.prompt.split()),
                output_tokens=1,
            )
            for r in requests
        ]


@pytest.fixture
def ctx() -> tuple[Context, MemoryStore, Sent, TableJudge]:
    store, sent, table = MemoryStore(), Sent(), TableJudge(accept="COFFEE")
    settings = Settings(purity_embedding=False, judge_calibration_rate=0.0)
    context = bootstrap(
        settings,
        store=store,
        redis_client=fakeredis.FakeRedis(),
        send=sent,
        judge_model=lambda name: table,
    )
    for register in (clean_tasks, verify_tasks, judge_tasks, compact_tasks):
        register(context)
    return context, store, sent, table


def run_task(context: Context, name: str, **kwargs: Any) -> None:
    context.app.tasks[name](**kwargs)


def _answer(reference: str, line: int) -> str:
    """The reference on even lines (every fourth with an explanation on a second line, which
    the verifier passes on the first line alone), "nothing" on odd ones, but for COFFEE (the
    table judge's CORRECT): a sentence holding it, which the verifier rejects and a judge
    may promote."""
    if line % 2:
        return "the word COFFEE, I think" if reference == "COFFEE" else "nothing"
    return f"{reference}\nThat is what the image shows." if line % 4 == 0 else reference


def fake_generate(context: Context, run: str, shard: str, lines: int) -> None:
    """What the generator stores, from replies made here: the first reference for every
    even line, "nothing" for the odd ones."""
    items = context.load(run, "clean", shard).items
    images = context.images(items)
    prepared = {sha: prepare_image(images[sha], max_side=2048, max_pixels=10**8) for sha in images}
    ready, quarantined = ready_items(items, prepared)
    replies: list[ModelReply | Exception] = [
        ModelReply(
            text=f"<think>reading</think>{_answer(i.references[0], i.line)}",
            finish_reason="stop",
        )
        for i, _ in ready
    ]
    info = ModelInfo(name="fake-vlm", version="1", interface="rsieve")
    generations, failed = record_generations(ready, replies, info)
    context.save(
        ShardOutput(
            run=run,
            shard=shard,
            stage="generate",
            lines=lines,
            generations=generations,
            quarantined=quarantined + failed,
        )
    )


def test_the_example_pool_through_every_stage_but_the_model(
    ctx: tuple[Context, MemoryStore, Sent, TableJudge],
) -> None:
    context, store, sent, table = ctx
    uri = upload_once(store, ROOT / "examples" / "pool")
    run = submit(context, uri, "fakes")
    assert sent.tasks == [("rsieve.ingest", {"run": run})]

    run_task(context, "rsieve.ingest", run=run)
    index = json.loads(store.get(f"runs/{run}/shards.json"))
    assert index["lines"] == 36 and sum(index["shards"].values()) == 36
    shards = [kw for task, kw in sent.tasks if task == "rsieve.clean"]
    assert [kw["shard"] for kw in shards] == sorted(index["shards"])

    for kw in shards:
        run_task(context, "rsieve.clean", **kw)
        fake_generate(context, **kw)
        run_task(context, "rsieve.verify", **kw)
        run_task(context, "rsieve.judge", **kw)
    assert ("rsieve.compact", {"run": run}) in sent.tasks
    outputs = {
        stage: {kw["shard"]: context.load(run, stage, kw["shard"]) for kw in shards}
        for stage in ("clean", "generate", "verify", "judge")
    }
    clean = [i for out in outputs["clean"].values() for i in out.items]
    assert clean and all(i.image_at is not None for i in clean)  # where each image lies
    verified = [o for out in outputs["verify"].values() for o in out.verified]
    rejected = [o for o in verified if o.place == "rejected"]
    assert rejected and table.asked >= len(rejected)  # every rejection went to the judge
    judged = [o for out in outputs["judge"].values() for o in out.outcomes]
    promoted = [o for o in judged if o.verdict is not None and o.verdict.verdict == "CORRECT"]
    assert all("COFFEE" in o.generation.item.references for o in promoted)

    run_task(context, "rsieve.compact", run=run)
    manifest = json.loads(store.get("datasets/fakes/manifest.json"))
    assert manifest["runs"] == [run] and manifest["adds_up"] is True
    rows: dict[str, int] = {}
    for entry in manifest["shards"]:
        data = io.BytesIO(store.get("datasets/fakes/" + entry["path"]))
        kind = entry["split"].rsplit("_", 1)[-1]  # think, nothink or rejected
        rows[kind] = rows.get(kind, 0) + pq.read_metadata(data).num_rows
    quarantine = store.get("datasets/fakes/quarantine.jsonl").decode().splitlines()
    # Every line ends in exactly one place: an accepted answer is in _RS_nothink (and in
    # _RS_think too when it reasoned), a rejected one in _rejected, the rest quarantined.
    assert rows["think"] <= rows["nothink"]
    assert rows["nothink"] + rows["rejected"] + len(quarantine) == 36
    assert audit_run(index, outputs).ok
    card = store.get("datasets/fakes/README.md").decode()
    assert "fakes" in card and "No judge promotion has been reviewed by a person yet." in card
    # Token usage: the judge's counts passed through to the verdicts and summed; the fake
    # generator returned none, so its calls are counted without usage, never as 0 tokens.
    verdicts = [o.verdict for o in judged if o.verdict is not None]
    assert verdicts and all(v.input_tokens == len(v.prompt.split()) for v in verdicts)
    tokens = json.loads(store.get("datasets/fakes/run_report.json"))["tokens"]["total"]
    assert tokens["judge"]["calls"] == len(verdicts) == tokens["judge"]["completion_tokens"]
    assert tokens["judge"]["prompt_tokens"] == sum(len(v.prompt.split()) for v in verdicts)
    assert tokens["judge"]["calls_without_usage"] == 0
    assert tokens["generator"]["calls"] == tokens["generator"]["calls_without_usage"] == len(judged)
    assert "## Cost" in card and "calls came back without token usage" in card

    # A second delivery of every message changes nothing (stages skip stored outputs).
    before = dict(store.objects)
    run_task(context, "rsieve.ingest", run=run)
    for kw in shards:
        for task in ("rsieve.clean", "rsieve.verify", "rsieve.judge"):
            run_task(context, task, **kw)
    run_task(context, "rsieve.compact", run=run)
    assert store.objects == before


def test_a_rejection_the_judge_calls_correct_is_promoted_and_wrong_stays_rejected(
    ctx: tuple[Context, MemoryStore, Sent, TableJudge],
) -> None:
    context, store, sent, table = ctx
    uri = upload_once(store, ROOT / "examples" / "pool")
    run = submit(context, uri, "fakes")
    run_task(context, "rsieve.ingest", run=run)
    kw = next(kw for task, kw in sent.tasks if task == "rsieve.clean")
    run_task(context, "rsieve.clean", **kw)
    fake_generate(context, **kw)
    run_task(context, "rsieve.verify", **kw)
    table.accept = "\u0000never"  # the judge says WRONG to everything
    run_task(context, "rsieve.judge", **kw)
    judged = context.load(run, "judge", kw["shard"]).outcomes
    rejected_first = [
        o for o in context.load(run, "verify", kw["shard"]).verified if o.place == "rejected"
    ]
    assert rejected_first
    by_id = {o.generation.item.id: o for o in judged}
    for o in rejected_first:
        after = by_id[o.generation.item.id]
        assert after.place == "rejected" and after.verdict is not None
        assert after.verdict.verdict == "WRONG"
        assert after.verdict.model == context.settings.judge_model
        assert after.verdict.model_kind == JUDGE.kind  # what the model declared


def test_the_run_id_comes_from_the_pools_content_never_from_its_marker(
    ctx: tuple[Context, MemoryStore, Sent, TableJudge],
) -> None:
    from services.api.submission import stored_pool_digest

    context, store, _sent, _table = ctx
    uri = upload_once(store, ROOT / "examples" / "pool")
    prefix = uri.split("/", 3)[3]
    marker = store.get(prefix + "_complete").decode()
    assert stored_pool_digest(context, prefix) == marker  # the uploader's digest, recomputed
    run = submit(context, uri, "fakes")
    # Someone with write access rewrites the marker to squat another pool's run id.
    store.put(prefix + "_complete", b"f" * 64)
    assert submit(context, uri, "fakes") == run
    # A pack index that lies about an image changes the digest (and the cleaner would
    # quarantine the image as image_digest_mismatch).
    index = json.loads(store.get(prefix + "_packs/index.json"))
    first = next(iter(index["images"]))
    index["images"][first]["sha256"] = "0" * 64
    store.put(prefix + "_packs/index.json", json.dumps(index).encode())
    assert stored_pool_digest(context, prefix) != marker


def test_a_pool_written_without_packs_is_digested_from_its_objects(
    ctx: tuple[Context, MemoryStore, Sent, TableJudge],
) -> None:
    from services.api.submission import stored_pool_digest

    context, store, _sent, _table = ctx
    uri = upload_once(store, ROOT / "examples" / "pool")
    prefix = uri.split("/", 3)[3]
    by_hand = "by-hand/"
    index = json.loads(store.get(prefix + "_packs/index.json"))
    for path, ref in index["images"].items():  # the same files, laid out by hand
        pack = store.get(ref["pack"])
        store.put(by_hand + path, pack[ref["offset"] : ref["offset"] + ref["length"]])
    store.put(by_hand + "items.jsonl", store.get(prefix + "items.jsonl"))
    store.put(by_hand + "_complete", b"written by hand")
    assert stored_pool_digest(context, by_hand) == stored_pool_digest(context, prefix)


def test_the_watcher_never_fetches_an_image_over_the_byte_limit() -> None:
    """A watched folder's image over image_max_bytes is refused by its listed size: its
    bytes are never read from the store, and the upload lists it as image_too_large."""
    from services.cleaner.watch import look

    class CountingStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.fetched: list[str] = []

        def get(self, key: str) -> bytes:
            self.fetched.append(key)
            return super().get(key)

    store = CountingStore()
    settings = Settings(watch_prefix="inbox/", image_max_bytes=4096, purity_embedding=False)
    context = bootstrap(
        settings, store=store, redis_client=fakeredis.FakeRedis(), send=Sent(), judge_model=None
    )
    items = [
        {"id": "a", "family": "SynthWords", "image": "a.png", "question": "Word?", "answer": "A"},
        {"id": "b", "family": "SynthWords", "image": "b.png", "question": "Word?", "answer": "B"},
    ]
    store.put("inbox/p/items.jsonl", "".join(json.dumps(i) + "\n" for i in items).encode())
    store.put("inbox/p/a.png", b"\x89PNG small")
    store.put("inbox/p/b.png", b"\0" * 5000)
    store.put("inbox/p/_complete", b"")
    assert look(context) != []
    assert "inbox/p/b.png" not in store.fetched and "inbox/p/a.png" in store.fetched
    (pool,) = {k.split("/")[1] for k in store.objects if k.startswith("pools/")}
    refused = json.loads(store.get(f"pools/{pool}/_refused.json"))
    assert refused["b.png"]["reason"] == "image_too_large"
    assert "5000 bytes" in refused["b.png"]["detail"]


def test_an_export_rechecks_from_its_files_alone_and_a_tampered_decision_shows(
    ctx: tuple[Context, MemoryStore, Sent, TableJudge], tmp_path: Path
) -> None:
    """`rsieve recheck DIR` on the exported example pool: every verifier decision agrees,
    training targets are the forms that passed, the hold-back is consistent; run_spec.json
    holds every DECIDING setting. Tampering with a stored decision or a target shows."""
    import pyarrow as pa

    from rsieve.adapters.exports import export_dataset
    from rsieve.settings import DECIDING
    from rsieve_cli.commands.recheck import recheck_folder

    context, store, sent, _ = ctx
    run = submit(context, upload_once(store, ROOT / "examples" / "pool"), "fakes")
    run_task(context, "rsieve.ingest", run=run)
    for kw in [kw for task, kw in sent.tasks if task == "rsieve.clean"]:
        run_task(context, "rsieve.clean", **kw)
        fake_generate(context, **kw)
        run_task(context, "rsieve.verify", **kw)
        run_task(context, "rsieve.judge", **kw)
    run_task(context, "rsieve.compact", run=run)
    folder = export_dataset(store, "fakes", tmp_path)

    spec = json.loads((folder / "run_spec.json").read_text())
    assert set(spec["settings"]) == DECIDING and spec["run"] == run
    assert spec["models"]["generator"] == {
        "fake-vlm": {"interfaces": ["rsieve"], "versions": ["1"]}
    }
    assert "## Run specification" in (folder / "README.md").read_text()

    summary = recheck_folder(folder)
    assert summary["differences"] == [] and summary["agreement"] == 1.0
    assert summary["decisions"] >= 20 and summary["hold_back_checked"] >= 1
    shards = sorted((folder / "data").glob("*_RS_nothink-*.parquet"))
    rows = [r for p in shards for r in pq.read_table(p).to_pylist()]
    entries = [qa for r in rows for qa in r["qa"]]
    first_line = [qa for qa in entries if (qa["verification"] or {}).get("variant") == "first_line"]
    assert first_line and all(
        qa["answer"] == qa["full_answer"].split("\n")[0] != qa["full_answer"] for qa in first_line
    )

    # Tamper: one accepted entry's decision says it scored less, another's target changes.
    path = shards[0]
    table = pq.read_table(path).to_pylist()
    table[0]["qa"][0]["verification"]["score"] = 0.25
    table[-1]["qa"][-1]["answer"] = "something else"
    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(path)), path)
    checks = {d["check"] for d in recheck_folder(folder)["differences"]}
    assert checks == {"decision", "answer"}


def test_a_watched_folder_and_post_runs_create_runs_one_way(tmp_path: Path) -> None:
    """services.runs.create_run is the only way a run is made: a folder the
    watcher takes and the same pool submitted as POST /runs does give the same run, written
    once; and the watcher now refuses a dataset made with other sampling, as the API does
    (before, only the API checked it)."""
    from services.cleaner.watch import look

    store = MemoryStore()
    settings = Settings(watch_prefix="inbox/", purity_embedding=False, watch_dataset="watched")
    sent = Sent()
    context = bootstrap(
        settings, store=store, redis_client=fakeredis.FakeRedis(), send=sent, judge_model=None
    )
    pool = ROOT / "examples" / "pool"
    for path in sorted(pool.iterdir()):
        store.put(f"inbox/p/{path.name}", path.read_bytes())
    store.put("inbox/p/_complete", b"")
    [run] = look(context)
    index = json.loads(store.get(f"index/runs/{run}.json"))
    assert index["watched"] == "inbox/p/" and index["dataset"] == "watched"
    assert [kw for task, kw in sent.tasks if task == "rsieve.ingest"] == [{"run": run}]
    spec = store.get(f"runs/{run}/run.json")
    # The same pool through POST /runs: the same run, nothing written again, not re-queued.
    assert submit(context, upload_once(store, pool), "watched") == run
    assert store.get(f"runs/{run}/run.json") == spec
    assert len([1 for task, _ in sent.tasks if task == "rsieve.ingest"]) == 1
    # A dataset whose rows carry the best-of-n fields refuses a one-sample run, both ways.
    store.put(
        "datasets/sampled/manifest.json",
        json.dumps({"dataset": "sampled", "sampled": True}).encode(),
    )
    with pytest.raises(HTTPException) as refused:
        submit(context, upload_once(store, pool), "sampled")
    assert refused.value.status_code == 409 and "best-of-n" in str(refused.value.detail)
    other = bootstrap(
        settings.model_copy(update={"watch_dataset": "sampled"}),
        store=store,
        redis_client=fakeredis.FakeRedis(),
        send=Sent(),
        judge_model=None,
    )
    for path in sorted(pool.iterdir()):
        store.put(f"inbox/q/{path.name}", path.read_bytes())
    store.put("inbox/q/_complete", b"")
    assert look(other) == []
    marker = json.loads(store.get("inbox/q/_taken.json"))
    assert "best-of-n" in marker["error"] and "run" not in marker


def test_a_contexts_caches_are_its_own_and_bounded() -> None:
    """API caches live on the Context (services.cache.BoundedCache), not in module globals:
    two contexts never share entries, a full cache drops its least recently used entry, and
    readers on many threads never see a missing or partial one."""
    import threading

    from services.cache import BoundedCache

    a = bootstrap(Settings(), store=MemoryStore(), redis_client=fakeredis.FakeRedis(), send=Sent())
    b = bootstrap(Settings(), store=MemoryStore(), redis_client=fakeredis.FakeRedis(), send=Sent())
    a.cache("x", 2).put("k", 1)
    assert a.cache("x", 2).get("k") == 1 and b.cache("x", 2).get("k") is None
    cache = BoundedCache(2)
    cache.put("a", 1), cache.put("b", 2)
    assert cache.get("a") == 1  # now the most recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)
    shared, missing = BoundedCache(4), []

    def churn(worker: int) -> None:
        for i in range(2000):
            key = (worker, i % 8)
            value = shared.get(key) or shared.put(key, (worker, i % 8, "whole"))
            if value[:2] != key or len(shared) > 4:
                missing.append(key)

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert missing == []
