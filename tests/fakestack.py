"""The one in-process stack of the suite's fast tier (docs/testing.md): every service's
registered task (cleaner, generator, verifier, judge, compactor) and the API's `submit`,
wired by the one bootstrap (`services.worker.bootstrap`) with fakes: an in-memory object
store (tests/fakes.py), fakeredis, a recorder of what each stage enqueues, and models
given in Python. `run` drives a pool through ingest, clean, generate, verify, judge and
compaction by draining what the stages enqueue, in order, as the workers would.

The models are stand-ins, never models: `ReplayModel` answers from a table of recorded
replies keyed as the Triton `replay` model keys them (rsieve_cli.local.replay), so a
tests/e2e scenario runs here unchanged; tests bring their own (a stochastic stand-in,
an abstaining judge, a table judge)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fakeredis
import pyarrow.parquet as pq

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.gate import EngineGate
from rsieve.adapters.pools import upload_pool
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.schemas import STAGE_TASKS, ShardOutput
from rsieve.settings import Settings
from rsieve_cli.local.replay import replay_key
from services.api.submission import submit
from services.cleaner.tasks import register as clean_tasks
from services.compactor.tasks import register as compact_tasks
from services.context import Context
from services.generator.tasks import register as generate_tasks
from services.judge.tasks import register as judge_tasks
from services.verifier.tasks import register as verify_tasks
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent

STAGES = ("clean", "generate", "verify", "judge")
# What a FakeStack's settings default to (each can be given): no embedding model for task
# purity and no calibration probes, as no real model answers.
DEFAULTS: dict[str, Any] = {"purity_embedding": False, "judge_calibration_rate": 0.0}


class _Recording(MemoryStore):
    """A MemoryStore that keeps its writes in order, to be written again elsewhere."""

    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.writes: list[tuple[str, bytes, str]] = []

    def put(self, key: str, data: bytes, *, content_type: str = "") -> None:
        super().put(key, data, content_type=content_type)
        self.writes.append((key, bytes(data), content_type))

    def put_file(self, key: str, path: str, *, content_type: str = "") -> None:
        self.put(key, Path(path).read_bytes(), content_type=content_type)


# A folder's upload, by what upload_pool reads of it: (its URI, its `_complete` key, its writes
# in order). Uploading hashes every image (upload_pool's perceptual hashes, about 10 ms an
# image), and the fast tier submits the same pools dozens of times.
_UPLOADS: dict[str, tuple[str, str, list[tuple[str, bytes, str]]]] = {}


def _folder_digest(folder: Path, bucket: str) -> str:
    """Every name, link target and byte under `folder` (resolved), and the bucket."""
    digest = hashlib.sha256(f"{folder.resolve()}\0{bucket}".encode())
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(root) / name
            digest.update(f"\0{path.relative_to(folder)}\0".encode())
            if path.is_symlink():
                digest.update(b"link:" + os.readlink(path).encode())
            elif path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def upload_once(store: MemoryStore, folder: Path) -> str:
    """upload_pool(store, folder), its writes made by the real upload the first time the
    suite meets the folder's contents and replayed in the same order after: a store that
    fails on purpose sees the same writes. Like upload_pool, nothing is written when the
    store has the pool already."""
    key = _folder_digest(folder, store.bucket)
    if key not in _UPLOADS:
        recording = _Recording(store.bucket)
        uri = upload_pool(recording, folder)
        _UPLOADS[key] = (uri, recording.writes[-1][0], recording.writes)
    uri, complete, writes = _UPLOADS[key]
    if not store.exists(complete):
        for name, data, content_type in writes:
            store.put(name, data, content_type=content_type)
    return uri


class ReplayModel:
    """The Triton `replay` model's contract in Python (tests/triton_models/replay): a
    request is answered with the reply recorded under replay_key(prompt, image); a request
    with none recorded fails, as it does on Triton. Serves as generator (`bind`) and as
    judge (`generate_many`); `asked` counts the requests, as Triton's counters do."""

    def __init__(self, replay: dict[str, dict[str, str]] | None = None) -> None:
        self.replay = replay if replay is not None else {}
        self.info: ModelInfo | None = None
        self.asked = 0

    def bind(self, gate: EngineGate, on_ready: Callable[[ModelInfo], None]) -> ReplayModel:
        self.on_ready = on_ready
        return self

    def _answer(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="replay", version="1", interface="rsieve", kind="stand-in")
        self.asked += len(requests)
        out: list[ModelReply | Exception] = []
        for r in requests:
            rec = self.replay.get(replay_key(r.prompt, r.image))
            if rec is None:
                out.append(RuntimeError("replay: no recorded output for this request"))
            else:
                out.append(ModelReply(text=rec["text"], finish_reason=rec["finish_reason"]))
        return out

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        return self._answer(requests)

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        requests = singles(requests)  # one reply per sample, as an engine without n
        replies = self._answer(requests)
        assert self.info is not None
        self.on_ready(self.info)
        return replies


class FakeStack:
    """Every service's tasks on fakes, one store. `judge`: the judge model (anything with
    `generate_many`); `generator`: the generator (anything with `bind(gate, on_ready)`
    returning an object with `generate_many_async`); `settings`: the services' settings
    over DEFAULTS. `store` may be given (a MemoryStore subclass that fails on purpose)."""

    def __init__(
        self,
        *,
        judge: Any = None,
        generator: Any = None,
        store: MemoryStore | None = None,
        **settings: Any,
    ) -> None:
        self.store = store if store is not None else MemoryStore()
        self.sent = Sent()
        replay = ReplayModel()
        self.judge = judge if judge is not None else replay
        self.generator = generator if generator is not None else replay
        self.settings = Settings(**(DEFAULTS | settings))
        self.ctx: Context = bootstrap(
            self.settings,
            store=self.store,
            redis_client=fakeredis.FakeRedis(),
            send=self.sent,
            judge_model=lambda name: self.judge,
            generator_model=self.generator.bind,
        )
        for register in (clean_tasks, generate_tasks, verify_tasks, judge_tasks, compact_tasks):
            register(self.ctx)
        self.done = 0  # how many of sent.tasks have been run (or skipped by `drain(only)`)

    def task(self, name: str, **kwargs: Any) -> Any:
        """Run one registered task now (as a worker would on its message)."""
        return self.ctx.app.tasks[name](**kwargs)

    def submit(self, pool: Path | str, dataset: str, sampling: dict[str, Any] | None = None) -> str:
        """POST /runs's logic: `pool` a folder (uploaded first) or an s3:// URI."""
        uri = pool if isinstance(pool, str) else upload_once(self.store, pool)
        return str(submit(self.ctx, uri, dataset, sampling))

    def drain(self, only: str = "") -> list[str]:
        """Run enqueued tasks in order until none is left (of them, the task named `only`
        alone when given: the others are passed over); their names."""
        ran = []
        while self.done < len(self.sent.tasks):
            task, kw = self.sent.tasks[self.done]
            self.done += 1
            if not only or task == only:
                self.task(task, **kw)
                ran.append(task)
        return ran

    def run_until_compaction(self, pool: Path | str, dataset: str, **kw: Any) -> str:
        """A run through every stage of every shard, the compaction left undone (its
        enqueued tasks are passed over: run them with `task`)."""
        run = self.submit(pool, dataset, **kw)
        self.drain("rsieve.ingest")
        for task, args in list(self.sent.tasks):
            if task == "rsieve.clean" and args["run"] == run:
                for stage in STAGES:
                    self.task(STAGE_TASKS[stage], **args)
        self.done = len(self.sent.tasks)
        return run

    def run(self, pool: Path | str, dataset: str, **kw: Any) -> str:
        """A run from submission to its commit in `dataset`; the run id."""
        run = self.run_until_compaction(pool, dataset, **kw)
        self.task("rsieve.compact", run=run)
        self.drain()
        return run

    # What a run left, read back.

    def outputs(self, run: str, stage: str) -> dict[str, ShardOutput]:
        index = json.loads(self.store.get(f"runs/{run}/shards.json"))
        return {shard: self.ctx.load(run, stage, shard) for shard in index["shards"]}

    def clean_outputs(self, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The cleaner's items and quarantine, as stored (JSON), in shard order."""
        items: list[dict[str, Any]] = []
        quarantined: list[dict[str, Any]] = []
        for key in sorted(self.store.list(f"runs/{run}/clean/")):
            out = json.loads(self.store.get(key))
            items += out["items"]
            quarantined += out["quarantined"]
        return items, quarantined

    def json(self, key: str) -> Any:
        return json.loads(self.store.get(key))

    def report(self, dataset: str, run: str) -> dict[str, Any]:
        return dict(self.json(f"datasets/{dataset}/commits/{run}/run_report.json"))

    def rows(self, dataset: str, *, images: bool = False) -> dict[str, list[dict[str, Any]]]:
        """The dataset's rows by split, in manifest order (without the image column unless
        `images`)."""
        manifest = self.json(f"datasets/{dataset}/manifest.json")
        out: dict[str, list[dict[str, Any]]] = {}
        for shard in manifest["shards"]:
            table = pq.read_table(io.BytesIO(self.store.get(f"datasets/{dataset}/{shard['path']}")))
            if not images:
                table = table.drop(["image"])
            out.setdefault(shard["split"], []).extend(table.to_pylist())
        return out

    def export(self, dataset: str, to: Path) -> Path:
        """The dataset exported as `rsieve export` writes it; its folder."""
        return Path(export_dataset(self.store, dataset, to))
