"""What every service shares: bootstrap (settings, storage, queue app, models), the
Context (shard I/O, run creation, caches) and the worker entry point. The base task class
and per-item poison isolation are services/stage.py. Services stay one screen each."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn, TypeVar, cast

import redis
from celery import Celery, current_task
from pydantic import BaseModel, ValidationError

from rsieve import keys, redis_keys
from rsieve.adapters.gate import EngineGate
from rsieve.adapters.metrics import JsonFormatter, RedisMetrics
from rsieve.adapters.model import Model, open_model
from rsieve.adapters.queues import enqueue, make_celery
from rsieve.adapters.storage import ObjectStore, S3Store, read_images
from rsieve.clean.profiles import PROFILES_FILE, FamilyProfile, profiles_of
from rsieve.compact.settle import dataset_conflict
from rsieve.dataset.audit import plan_reconcile
from rsieve.envelope import CorruptOutput, open_envelope, seal
from rsieve.errors import ConflictError, CorruptOutputError, NotFoundError
from rsieve.generate.generation import AsyncModel, ModelInfo
from rsieve.judge.calibration import CalibrationShard
from rsieve.run.submission import run_id
from rsieve.schemas import STAGES, Item, Quarantined, RunSpec, ShardOutput, ShardQuarantine
from rsieve.settings import SAMPLING, TRAINING, Settings, get_settings
from rsieve.verify import protocol_versions
from services.liveness import start_watcher
from services.progress import time_limit
from services.stage import ItemGuard, StageTask, clear_stop, observe_shard

log = logging.getLogger("rsieve")


def delivery_id() -> str | None:
    """The id of the message the running task came in (kept when it is redelivered); None
    outside a worker's task."""
    request = getattr(current_task, "request", None)
    task_id = getattr(request, "id", None)
    return str(task_id) if task_id else None


SPECS_KEPT = 1024  # run specs a worker process keeps (Context.spec); a few KB each
M = TypeVar("M", bound=BaseModel)

Send = Callable[[str, dict[str, Any]], None]  # (task name, its kwargs): enqueue it


class BoundedCache:
    """A thread-safe least-recently-used map of at most `size` entries: what a process
    keeps of objects written once (a run's spec, its judged items) while its thread pool
    reads them. An entry is read and evicted whole, so a reader never sees half of one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Any, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        # under the lock: a put holds one entry over the size until it evicts
        with self._lock:
            return len(self._data)


@dataclass
class Context:
    """The adapters a service uses, built once per process on first use (never at import).
    `bootstrap` wires the real ones, or the fakes it is given (unit tests)."""

    settings: Settings
    app: Celery
    send: Send
    given_store: ObjectStore | None = None
    given_redis: redis.Redis | None = None
    judge_model_of: Callable[[str], Model] | None = None
    generator_model_of: Callable[[EngineGate, Callable[[ModelInfo], None]], AsyncModel] | None = (
        None
    )
    _pid: int = field(default_factory=os.getpid)
    _run_settings: dict[str, Settings] = field(default_factory=dict)
    _specs: dict[str, RunSpec] = field(default_factory=dict)
    _caches: dict[str, BoundedCache] = field(default_factory=dict)

    @cached_property
    def store(self) -> ObjectStore:
        # boto3 clients are not fork-safe: each worker child builds its own on first use.
        return self.given_store or S3Store(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        return self.given_redis or redis.Redis.from_url(
            self.settings.redis_url, socket_timeout=30, health_check_interval=30
        )

    @cached_property
    def metrics(self) -> RedisMetrics:
        return RedisMetrics(self.redis)

    def task(self, name: str) -> Callable[[Callable[..., None]], Any]:
        """A stage task of this service's app, on the base class every stage shares
        (StageTask); not shared with other apps (each bootstrap is its own)."""
        return cast(
            Callable[[Callable[..., None]], Any],
            self.app.task(name=name, base=StageTask, shared=False, rsieve_ctx=self),
        )

    def guard(self, task: str, run: str, shard: str) -> ItemGuard:
        return ItemGuard(self, task, run, shard)

    def judge_model(self, name: str) -> Model:
        """The judge's model, on the judge's engine (one engine per role): Triton, or an
        OpenAI-compatible server (settings.judge_interface)."""
        if self.judge_model_of is not None:
            return self.judge_model_of(name)
        return open_model(self.settings, "judge")

    def generator_model(
        self, gate: EngineGate, on_ready: Callable[[ModelInfo], None], settings: Settings
    ) -> AsyncModel:
        """The generator's model on its engine (Triton or an OpenAI-compatible server),
        sampling as `settings` (the run's) say, feeding through `gate`; `on_ready` sees
        what the model is before any request."""
        if self.generator_model_of is not None:
            return self.generator_model_of(gate, on_ready)
        return open_model(settings, "generator", gate, on_ready=on_ready)

    def images(self, items: Iterable[Item]) -> dict[str, bytes]:
        """sha256 -> bytes of the items' images: ranged reads of the pool's packs."""
        return read_images(self.store, [i.image_at for i in items if i.image_at])

    def dataset_profiles(self, dataset: str) -> dict[str, FamilyProfile]:
        """The dataset's family profiles as its current commit holds them (the manifest's
        profiles.json; none before its first commit, or one made before profiles)."""
        manifest = self.load_json(keys.manifest(dataset)) or {}
        stored = (manifest.get("files") or {}).get(PROFILES_FILE)
        return profiles_of(self.load_json(keys.dataset_file(dataset, stored)) if stored else None)

    def load_json(self, key: str) -> dict[str, Any] | None:
        """A stored JSON object, None when the key is absent."""
        try:
            return dict(json.loads(self.store.get(key)))
        except NotFoundError:
            return None

    def fingerprint(self, settings: Settings | None = None) -> dict[str, object]:
        """A run's decision inputs beside its pool: every DECIDING setting (of `settings`,
        the run's, when it chose its own sampling), and the registered evaluation sets by
        their content's sha256 when there are any (adding or changing a set makes the next
        submission of a pool a new run)."""
        sets = {
            name: hashlib.sha256(self.store.get(key)).hexdigest()
            for key in self.store.list(keys.EVALSETS_PREFIX)
            if (name := keys.evalset_name(key)) is not None
        }
        return (settings or self.settings).fingerprint() | ({"evalsets": sets} if sets else {})

    def cache(self, name: str, size: int) -> BoundedCache:
        """This context's cache `name` (made on first use), never a module global: two
        contexts in one process (tests, or two stores) never share entries."""
        if name not in self._caches:
            self._caches.setdefault(name, BoundedCache(size))
        return self._caches[name]

    def create_run(
        self,
        *,
        pool_uri: str,
        pool_sha256: str,
        dataset: str,
        settings: Settings | None = None,
        index_extra: dict[str, Any] | None = None,
    ) -> str:
        """The one way a run comes to be (POST /runs and the watched folders): its id from
        the pool, the dataset and what decides it; refused (ConflictError) when the dataset
        was made with other sampling; written once (spec, then its index entry) and handed
        to ingest. Submitting it again returns the same id and writes nothing."""
        settings = settings or self.settings
        fingerprint, protocols = self.fingerprint(settings), protocol_versions()
        run = run_id(pool_sha256, dataset, fingerprint, protocols)
        conflict = dataset_conflict(self.load_json(keys.manifest(dataset)), settings.samples)
        if conflict:
            raise ConflictError(conflict)
        if self.store.exists(keys.run_spec(run)):
            return run
        spec = RunSpec(
            run=run,
            dataset=dataset,
            pool_uri=pool_uri,
            pool_sha256=pool_sha256,
            settings=fingerprint,
            protocols=protocols,
        )
        self.store.put(keys.run_spec(run), spec.model_dump_json(indent=1).encode())
        entry = {"run": run, "dataset": dataset, "pool_uri": pool_uri, "submitted_at": time.time()}
        self.store.put(
            keys.run_index(run),
            json.dumps(entry | (index_extra or {})).encode(),
            content_type="application/json",
        )
        self.next("rsieve.ingest", run=run)
        return run

    def spec(self, run: str) -> RunSpec:
        """The run's spec. run.json is written once, at submission, before any task of the
        run is sent (services/api/submission.py, services/cleaner/watch.py): read once per
        process, not once per task (a task of a 200,000-item run's ingest read it up to
        three times)."""
        spec = self._specs.get(run)
        if spec is None:
            spec = RunSpec.model_validate_json(self.store.get(keys.run_spec(run)))
            if len(self._specs) >= SPECS_KEPT:
                self._specs.clear()
            self._specs[run] = spec
        return spec

    def run_settings(self, run: str) -> Settings:
        """The service's settings with the run's own sampling and training acceptance, as
        its spec records them."""
        if run not in self._run_settings:
            spec = self.spec(run).settings
            chosen = self.settings.for_run({k: spec[k] for k in SAMPLING if k in spec})
            # Validated when the run was submitted (Settings' own validators).
            self._run_settings[run] = chosen.model_copy(
                update={k: spec[k] for k in TRAINING if k in spec}
            )
        return self._run_settings[run]

    def load(self, run: str, stage: str, shard: str) -> ShardOutput:
        """A stored stage output, its seal checked (Context.opened)."""
        return self.opened(run, stage, shard, keys.stage_output(run, stage, shard), ShardOutput)

    def quarantined(self, run: str, stage: str, shard: str) -> list[Quarantined]:
        """A stored output's quarantine alone (its items are not validated)."""
        key = keys.stage_output(run, stage, shard)
        return list(self.opened(run, stage, shard, key, ShardQuarantine).quarantined)

    def load_raw(self, run: str, stage: str, shard: str) -> dict[str, Any]:
        """A stored stage output as JSON, its seal checked, not validated."""
        key = keys.stage_output(run, stage, shard)
        data = self.store.get(key)
        return dict(json.loads(self._body(run, stage, shard, key, data)))

    def calibration_shard(self, run: str, shard: str) -> CalibrationShard | None:
        """A shard's calibration (the judge's, sealed like its output); None when absent."""
        try:
            return self.opened(run, "judge", shard, keys.calibration(run, shard), CalibrationShard)
        except NotFoundError:
            return None

    def save(self, out: ShardOutput) -> None:
        self.store.put(
            keys.stage_output(out.run, out.stage, out.shard),
            seal(out.model_dump_json().encode()),
            content_type="application/json",
        )
        observe_shard(self, out)

    def put_sealed(self, key: str, model: BaseModel) -> None:
        """A stage's other output (a calibration shard) stored sealed as `save` stores one."""
        self.store.put(key, seal(model.model_dump_json().encode()), content_type="application/json")

    def opened(self, run: str, stage: str, shard: str, key: str, model: type[M]) -> M:
        """The object at `key`, written by `stage` for `shard`, as `model`: its seal checked
        (rsieve.envelope) and validated. One that is not what was written is redone
        (Context.redo raises CorruptOutputError), never handed on or failed on for ever."""
        data = self.store.get(key)
        body = self._body(run, stage, shard, key, data)
        try:
            return model.model_validate_json(body)
        except ValidationError as exc:
            detail = " ".join(str(exc).split())[:500]
            self.redo(run, stage, shard, key, data, CorruptOutput("invalid", detail))

    def _body(self, run: str, stage: str, shard: str, key: str, data: bytes) -> bytes:
        opened = open_envelope(data)
        if isinstance(opened, CorruptOutput):
            self.redo(run, stage, shard, key, data, opened)
        if not opened.sealed:
            self._count("rsieve_unsealed_outputs", stage)
        return opened.body

    def _count(self, name: str, *labels: str) -> None:
        try:
            self.metrics.inc(name, *labels)
        except redis.RedisError as exc:
            log.warning("metrics not recorded: %s", exc)

    def redo(
        self, run: str, stage: str, shard: str, key: str, data: bytes, found: CorruptOutput
    ) -> NoReturn:
        """`stage`'s output for `shard`, found corrupt at `key`, done again: the object is
        moved aside (runs/<run>/corrupt/, with a record of why and who read it), the
        outputs of `stage` and every later stage for the shard are deleted (what followed
        from a lost output is not trusted, and a later stage must not see an earlier one
        twice), counted (rsieve_corrupt_outputs), and the shard's first missing stage is
        sent (plan_reconcile): each stage sends the next, the judge the compaction.
        Raises CorruptOutputError: the reading task ends there (StageTask)."""
        digest = hashlib.sha256(data).hexdigest()
        record = {
            "run": run,
            "stage": stage,
            "shard": shard,
            "key": key,
            "reason": found.reason,
            "detail": found.detail,
            "bytes": len(data),
            "sha256": digest,
            "read_by": getattr(current_task, "name", None),
            "at": time.time(),
        }
        self.store.put(keys.corrupt_copy(run, stage, shard, digest), data)
        self.store.put(
            keys.corrupt_record(run, stage, shard, digest),
            json.dumps(record).encode(),
            content_type="application/json",
        )
        redone = STAGES[STAGES.index(stage) :]
        for later in redone:
            self.store.delete(keys.stage_output(run, later, shard))
        if "judge" in redone:
            self.store.delete(keys.calibration(run, shard))
        self._count("rsieve_corrupt_outputs", stage, found.reason)
        log.error(
            "corrupt stored output %s (%s: %s): moved aside, %s redone for shard %s",
            key,
            found.reason,
            found.detail,
            stage,
            shard,
        )
        lines = ((self.shard_index(run) or {}).get("shards") or {}).get(shard)
        if lines is not None:
            present = {st: set() if st in redone else {shard} for st in STAGES}
            plan = plan_reconcile({"shards": {shard: lines}}, present, compacted=True)
            for task, kwargs in plan:
                self.next(task, run=run, **kwargs)
        raise CorruptOutputError(key, found.reason, found.detail)

    def done(self, run: str, stage: str, shard: str) -> bool:
        return self.store.exists(keys.stage_output(run, stage, shard))

    def next(self, task: str, **kwargs: Any) -> None:
        self.send(task, kwargs)

    def last_done(self, key: str, member: str | int, total: int) -> bool:
        """Marks `member` of a fan-out done (a Redis set); True once all `total` are, to
        whoever sees it first and to any redelivery after (what it sends next must be
        idempotent). A set lost with Redis leaves the run to the sweeper."""
        pipe = self.redis.pipeline()
        pipe.sadd(key, member)
        pipe.scard(key)
        pipe.expire(key, redis_keys.KEPT_S)
        _, done, _ = pipe.execute()
        return int(done) >= total

    def send_once(self, key: str) -> bool:
        """Whether this call sends a fan-out's tasks: once per `sweep_after_s` (a Redis key
        per fan-out). A coordinator is called more than once for one step (each last task
        of the step before, a redelivery, the sweeper), and each call that re-sent the
        step's unfinished tasks multiplied them. The key holds the id of the message that
        took it, so that message redelivered (its worker died while sending) sends again;
        any other call waits for the key to expire, and the sweeper's call after that sends
        what is still missing."""
        owner = delivery_id()
        ttl = max(1, int(self.settings.sweep_after_s))
        if self.redis.set(key, owner or "-", nx=True, ex=ttl):
            return True
        return owner is not None and self.redis.get(key) == owner.encode()

    def shard_index(self, run: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.store.get(keys.shards(run))))
        except NotFoundError:
            return None

    def stored_shards(self, run: str, stage: str) -> set[str]:
        prefix = keys.stage_prefix(run, stage)
        return {k[len(prefix) :].removesuffix(".json") for k in self.store.list(prefix)}

    def load_run(self, run: str) -> tuple[dict[str, Any] | None, dict[str, dict[str, ShardOutput]]]:
        """The shard index and every stored stage output of a run."""
        index = self.shard_index(run)
        outputs: dict[str, dict[str, ShardOutput]] = {}
        for stage in STAGES:
            outputs[stage] = {
                shard: self.load(run, stage, shard)
                for shard in sorted(self.stored_shards(run, stage))
            }
        return index, outputs

    def compacted(self, run: str) -> bool:
        spec = self.spec(run)
        try:
            manifest = json.loads(self.store.get(keys.manifest(spec.dataset)))
        except NotFoundError:
            return False
        return run in manifest.get("runs", [])

    def reconcile(self, run: str) -> list[tuple[str, dict[str, Any]]]:
        """Enqueue every shard's next missing stage; returns what was enqueued. A stopped
        run is resumed: its stop, failed record and counted errors are cleared first."""
        clear_stop(self, run)
        present = {stage: self.stored_shards(run, stage) for stage in STAGES}
        plan = plan_reconcile(self.shard_index(run), present, compacted=self.compacted(run))
        for task, kwargs in plan:
            self.next(task, run=run, **kwargs)
        return plan


def bootstrap(
    settings: Settings | None = None,
    *,
    app: Celery | None = None,
    store: ObjectStore | None = None,
    redis_client: redis.Redis | None = None,
    send: Send | None = None,
    judge_model: Callable[[str], Model] | None = None,
    generator_model: Callable[[EngineGate, Callable[[ModelInfo], None]], AsyncModel] | None = None,
) -> Context:
    """The one wiring of a service: real adapters by default (S3, Redis, the Celery app on
    Redis, Triton), or the fakes given, typed by what the services use (`ObjectStore`, a
    Redis client such as fakeredis's, `send` for the next task, `Model` for the judge)."""
    settings = settings or get_settings()
    app = app or make_celery(settings)

    def enqueued(task: str, kwargs: dict[str, Any]) -> None:
        # A generate or judge shard's limit follows its model's pace (services/progress.py).
        enqueue(app, task, time_limit=time_limit(ctx, task, kwargs), **kwargs)

    ctx = Context(
        settings=settings,
        app=app,
        send=send or enqueued,
        given_store=store,
        given_redis=redis_client,
        judge_model_of=judge_model,
        generator_model_of=generator_model,
    )
    return ctx


def run_worker(
    service: str,
    queue: str,
    register: Callable[[Context], None],
    concurrency_of: Callable[[Settings], int] | None = None,
    pool: str = "prefork",
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))  # one JSON object per line (run, shard, item)
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    ctx = bootstrap()
    register(ctx)  # in the main process, before the prefork children exist
    # botocore parses its S3 model on a session's first client (about 0.3 s of CPU); done
    # here, every child inherits the parsed model. The client itself is dropped: each child
    # builds its own (clients are not fork-safe).
    S3Store(ctx.settings)
    concurrency = str((concurrency_of or (lambda s: s.worker_concurrency))(ctx.settings))
    start_watcher(ctx.app, ctx.settings)  # dead workers' shards requeued (services/liveness.py)
    ctx.app.worker_main(
        [
            "worker",
            "-Q",
            queue,
            "-c",
            concurrency,
            "-P",
            pool,
            "-n",
            f"{service}@%h",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
    )
