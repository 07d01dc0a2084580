"""A pool through every stage's task on fakes (the generator's replies made here: the
reference on even lines, "nothing" on odd ones; a judge that says CORRECT when the prompt
holds COFFEE): prints the run id and the sha256 of every committed Parquet shard, so two
checkouts' outputs can be compared byte for byte (e.g. that samples=1 is unchanged by
best-of-n, docs/sampling.md):

    git worktree add /tmp/old <commit>
    (cd /tmp/old && PYTHONPATH=/tmp/old/shared:/tmp/old \
        /work/main/.venv/bin/python /work/main/scripts/rows_digest.py /tmp/old [POOL]) > old.txt
    PYTHONPATH=shared:. .venv/bin/python scripts/rows_digest.py . [POOL] > new.txt
    diff old.txt new.txt

CHECKOUT: the repository whose examples/pool is the default POOL. Which checkout's code runs
(rsieve, services, tests/fakes.py) is PYTHONPATH's choice, as above: it comes before the
editable install; the first line printed on stderr names the rsieve used."""

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import fakeredis

import rsieve
from rsieve.adapters.pools import upload_pool
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
from services.cleaner.tasks import register as c
from services.compactor.tasks import register as k
from services.judge.tasks import register as j
from services.verifier.tasks import register as v
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent

print("rsieve from", rsieve.__file__, file=sys.stderr)


class Judge:
    info: ModelInfo | None = None

    def generate_many(self, reqs: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="table-judge", version="1", interface="rsieve", kind="llm")
        return [
            ModelReply(text="CORRECT" if "COFFEE" in r.prompt else "WRONG", finish_reason="stop")
            for r in reqs
        ]


store, sent = MemoryStore(), Sent()
ctx = bootstrap(
    Settings(purity_embedding=False, judge_calibration_rate=0.0),
    store=store,
    redis_client=fakeredis.FakeRedis(),
    send=sent,
    judge_model=lambda n: Judge(),
)
for r in (c, v, j, k):
    r(ctx)
run = submit(
    ctx,
    upload_pool(
        store, Path(sys.argv[2]) if len(sys.argv) > 2 else Path(sys.argv[1]) / "examples" / "pool"
    ),
    "golden",
)
ctx.app.tasks["rsieve.ingest"](run=run)
for task, kw in sent.tasks:  # a pool of several ranges is ingested in rounds (grows the list)
    if task == "rsieve.ingest_part" or (task == "rsieve.ingest" and kw):
        ctx.app.tasks[task](**kw)
for task, kw in list(sent.tasks):
    if task != "rsieve.clean":
        continue
    ctx.app.tasks["rsieve.clean"](**kw)
    items = ctx.load(run, "clean", kw["shard"]).items
    imgs = ctx.images(items)
    ready, q = ready_items(
        items, {s: prepare_image(b, max_side=2048, max_pixels=10**8) for s, b in imgs.items()}
    )
    replies = [
        ModelReply(
            text=f"<think>reading</think>{i.references[0] if i.line % 2 == 0 else 'nothing'}",
            finish_reason="stop",
        )
        for i, _ in ready
    ]
    gens, failed = record_generations(
        ready, replies, ModelInfo(name="fake-vlm", version="1", interface="rsieve")
    )
    ctx.save(
        ShardOutput(
            run=run,
            shard=kw["shard"],
            stage="generate",
            lines=kw["lines"],
            generations=gens,
            quarantined=q + failed,
        )
    )
    ctx.app.tasks["rsieve.verify"](**kw)
    ctx.app.tasks["rsieve.judge"](**kw)
ctx.app.tasks["rsieve.compact"](run=run)
m = json.loads(store.get("datasets/golden/manifest.json"))
print("run", run)
for s in m["shards"]:
    print(s["path"], hashlib.sha256(store.get("datasets/golden/" + s["path"])).hexdigest())
# The commit's report (less `dataset_keys`: what the key index read, newer than some
# checkouts), card and quarantine.
report = json.loads(store.get("datasets/golden/run_report.json"))
report.pop("dataset_keys", None)
print("run_report.json", hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest())
print("README.md", hashlib.sha256(store.get("datasets/golden/README.md")).hexdigest())
print("quarantine.jsonl", hashlib.sha256(store.get("datasets/golden/quarantine.jsonl")).hexdigest())
