"""Ingest in rounds (rsieve.clean.ingestion): what each round's task reads and writes.
`rsieve.ingest` (tasks.py) plans the run; a pool of one range (`ingest_range_items` lines)
runs every round in that task (`in_process`: rsieve.clean.ingestion.ingest_in_process); a
larger one gets each round's tasks once the round before is stored, each
`rsieve.ingest_part` task running one step here for one range or partition.

Storage (rsieve.keys), under runs/<run>/ingest/: `plan.json`; `<kind>/<to>/<from>.json`,
the records one task hands the tasks of the next rounds (`to`: the range or partition that
reads them); `done/<round>/<part>.json`, written last by each task, with its summary."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, TypeAdapter

from rsieve import keys, redis_keys
from rsieve.adapters.embedder import load_embedder
from rsieve.clean.cleaning import cleaning_report, family_items, line_image_path
from rsieve.clean.decontam import screen_summary
from rsieve.clean.ingestion import (
    DupId,
    DupLine,
    IdRecord,
    ImageRecord,
    IngestPlan,
    Joined,
    LineRef,
    LineRule,
    LineVerdict,
    PurityRecord,
    apply_range,
    exact_duplicates,
    first_ids,
    ingest_in_process,
    join_images,
    map_range,
    plan_ingest,
    purity,
    range_lines,
    screen_partition,
    screened,
)
from rsieve.clean.provenance import verify_source
from rsieve.errors import NotFoundError
from rsieve.run.packs import INDEX, INDEX_BUCKETS, index_bucket_key, read_index
from rsieve.run.submission import ITEMS, REFUSED
from rsieve.schemas import ImageRef
from services.cleaner.screen import load_screen
from services.cleaner.sources import pack_index, resolver
from services.context import Context

__all__ = [
    "ROUNDS",
    "commit",
    "count",
    "first_send",
    "in_process",
    "lazy_embed",
    "missing",
    "packs",
    "plan",
    "pool_key",
    "report",
    "step",
]

SCAN_BYTES = 8 * 1024 * 1024  # the plan reads the pool file this much at a time

M = TypeVar("M", bound=BaseModel)


def pool_key(ctx: Context, run: str) -> str:
    return ctx.spec(run).pool_uri.split("/", 3)[3]


def plan(ctx: Context, run: str) -> IngestPlan:
    """The run's plan: stored, or made by streaming the pool file once (and stored when
    the pool needs more than one range)."""
    key = keys.ingest_plan(run)
    if ctx.store.exists(key):
        return IngestPlan.model_validate_json(ctx.store.get(key))
    items = pool_key(ctx, run) + ITEMS
    size = ctx.store.size(items) or 0

    def chunks() -> Iterator[bytes]:
        for at in range(0, size, SCAN_BYTES):
            yield ctx.store.get_range(items, at, min(size, at + SCAN_BYTES))

    s = ctx.settings
    made = plan_ingest(chunks(), shard_size=s.shard_size, range_items=s.ingest_range_items)
    if len(made.ranges) > 1:
        ctx.store.put(key, made.model_dump_json().encode())
    return made


def packs(ctx: Context, run: str) -> None:
    """A pool written without packs (by another tool) is packed first, its paths read
    from the whole pool file (sources.pack_index)."""
    prefix = pool_key(ctx, run)
    if ctx.store.exists(prefix + INDEX):
        return
    lines = range_lines(ctx.store.get(prefix + ITEMS), 1)
    paths = [p for pl, _ in lines if (p := line_image_path(pl)) is not None]
    pack_index(ctx, prefix, list(dict.fromkeys(paths)))


def in_process(ctx: Context, run: str, the_plan: IngestPlan) -> None:
    """A pool of one range: every round in this task, in memory (ingest_in_process), then
    cleaning.json, the clean stage's inputs and the shard index, as the rounds write them."""
    s, prefix = ctx.settings, pool_key(ctx, run)
    pool = ctx.store.get(prefix + ITEMS)
    paths = [p for pl, _ in range_lines(pool, 1) if (p := line_image_path(pl)) is not None]
    images = pack_index(ctx, prefix, list(dict.fromkeys(paths))).images
    sources = resolver(ctx)
    got = ingest_in_process(
        run,
        pool,
        images,
        shard_size=the_plan.shard_size,
        refused=ctx.load_json(prefix + REFUSED) or {},
        provenance=lambda source, sha: verify_source(source, sha, s.provenance_policy, sources),
        provenance_policy=s.provenance_policy,
        text_max_chars=s.text_max_chars,
        purity_threshold=s.purity_threshold,
        purity_min_items=s.purity_min_items,
        purity_origins=s.purity_origins,
        embed=lazy_embed if s.purity_embedding else None,
        screen=load_screen(ctx, ctx.spec(run).dataset),
        profiles=ctx.dataset_profiles(ctx.spec(run).dataset),
    )
    _write_report(ctx, run, got.report)
    for shard_in in got.inputs:
        ctx.store.put(keys.shard_input(run, shard_in.shard), shard_in.model_dump_json().encode())
    commit(ctx, run, the_plan)


def count(the_plan: IngestPlan, round_: str) -> int:
    return len(the_plan.ranges) if round_ in ("map", "apply") else the_plan.partitions


def first_send(ctx: Context, run: str, round_: str) -> bool:
    """Whether this call sends the round's tasks (Context.send_once)."""
    return ctx.send_once(redis_keys.ingest_sent(run, round_))


def missing(ctx: Context, run: str, round_: str, total: int) -> list[int]:
    done = set(ctx.store.list(keys.ingest_done_prefix(run, round_)))
    return [p for p in range(total) if keys.ingest_done(run, round_, p) not in done]


@functools.cache
def _records(model: type[BaseModel]) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def _put(
    ctx: Context, run: str, kind: str, src: str, by_dest: Mapping[int, Sequence[BaseModel]]
) -> None:
    """Records for the tasks that read them: one JSON array per reader."""
    for dest, records in sorted(by_dest.items()):
        data = _records(type(records[0])).dump_json(list(records))
        ctx.store.put(keys.ingest_part(run, kind, dest, src), data)


def _read(ctx: Context, run: str, kind: str, dest: int, model: type[M]) -> list[M]:
    out: list[M] = []
    for key in sorted(ctx.store.list(keys.ingest_part_prefix(run, kind, dest))):
        out.extend(_records(model).validate_json(ctx.store.get(key)))
    return out


def _range_bytes(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> bytes:
    r = the_plan.ranges[part]
    return ctx.store.get_range(pool_key(ctx, run) + ITEMS, r.start, r.end)


def _pack_refs(
    ctx: Context, run: str, paths: set[str], part: int, partitions: int
) -> dict[str, ImageRef]:
    """The pack index's entries of `paths` (one partition's): its buckets when the upload
    wrote them (the partition's paths are in buckets part, part + partitions, ...), else
    the whole index (a small pool, or one packed before buckets)."""
    prefix = pool_key(ctx, run)
    wanted = [prefix + index_bucket_key(b) for b in range(part, INDEX_BUCKETS, partitions)]
    try:
        buckets = [(key, ctx.store.get(key)) for key in wanted]
    except NotFoundError:
        buckets = [(prefix + INDEX, ctx.store.get(prefix + INDEX))]
    out: dict[str, ImageRef] = {}
    for key, data in buckets:
        try:
            images = json.loads(data).get("images", {})
        except ValueError:
            read_index(data, key)  # pool data: raises, naming the object and the fix
            raise
        out |= {p: ImageRef.model_validate(raw) for p, raw in images.items() if p in paths}
    return out


def step(ctx: Context, run: str, the_plan: IngestPlan, round_: str, part: int) -> None:
    """One task of a round; its `done` record, with its summary, is written last."""
    if round_ not in _STEPS:
        raise ValueError(f"no ingest round {round_!r}")
    summary = _STEPS[round_](ctx, run, the_plan, part)
    ctx.store.put(keys.ingest_done(run, round_, part), json.dumps(summary).encode())


def _map(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    out = map_range(
        range_lines(_range_bytes(ctx, run, the_plan, part), the_plan.ranges[part].first_line),
        text_max_chars=ctx.settings.text_max_chars,
        partitions=the_plan.partitions,
    )
    _put(ctx, run, "ids", f"{part:05d}", out.ids)
    _put(ctx, run, "images", f"{part:05d}", out.images)
    return {}


def _ids(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    to_apply, to_join = first_ids(_read(ctx, run, "ids", part, IdRecord), the_plan.range_of)
    _put(ctx, run, "dupids", f"{part:05d}", to_apply)
    _put(ctx, run, "dupjoin", f"{part:05d}", to_join)
    return {}


def _join(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    s, src = ctx.settings, f"{part:05d}"
    images = _read(ctx, run, "images", part, ImageRecord)
    sources = resolver(ctx)
    out = join_images(
        images,
        _pack_refs(ctx, run, {rec.path for rec in images}, part, the_plan.partitions),
        [d.line for d in _read(ctx, run, "dupjoin", part, DupLine)],
        refused=ctx.load_json(pool_key(ctx, run) + REFUSED) or {},
        provenance=lambda source, sha: verify_source(source, sha, s.provenance_policy, sources),
        range_of=the_plan.range_of,
        partitions=the_plan.partitions,
    )
    _put(ctx, run, "refs", src, out.refs)
    _put(ctx, run, "verdicts", f"j{src}", out.verdicts)
    _put(ctx, run, "joined", src, out.joined)
    return {}


def _exact(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    out = exact_duplicates(
        _read(ctx, run, "joined", part, Joined),
        range_of=the_plan.range_of,
        partitions=the_plan.partitions,
    )
    _put(ctx, run, "verdicts", f"e{part:05d}", out.verdicts)
    _put(ctx, run, "screen", f"{part:05d}", out.passed)
    return {"duplicates": out.duplicates}


def _screen(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    k = the_plan.partitions
    screen = load_screen(
        ctx, ctx.spec(run).dataset, keep=lambda q, a: screen_partition(q, a, k) == part
    )
    out, to_purity = screened(
        _read(ctx, run, "screen", part, Joined),
        screen=screen,
        range_of=the_plan.range_of,
        partitions=k,
    )
    _put(ctx, run, "verdicts", f"s{part:05d}", out.verdicts)
    _put(ctx, run, "purity", f"{part:05d}", to_purity)
    return {"duplicates": out.duplicates, "evalsets": out.evalsets, "screen": screen.summary()}


def _purity(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    s = ctx.settings
    out = purity(
        _read(ctx, run, "purity", part, PurityRecord),
        threshold=s.purity_threshold,
        min_items=s.purity_min_items,
        embed=lazy_embed if s.purity_embedding else None,
        purity_origins=s.purity_origins,
        range_of=the_plan.range_of,
        profiles=ctx.dataset_profiles(ctx.spec(run).dataset),
    )
    _put(ctx, run, "verdicts", f"p{part:05d}", out.verdicts)
    _put(ctx, run, "rules", f"{part:05d}", out.rules)
    return {"families": out.families}


def _apply(ctx: Context, run: str, the_plan: IngestPlan, part: int) -> dict[str, Any]:
    r = the_plan.ranges[part]
    lines = [pl for pl, _ in range_lines(_range_bytes(ctx, run, the_plan, part), r.first_line)]
    for shard_in in apply_range(
        run,
        r,
        lines,
        shard_size=the_plan.shard_size,
        duplicate_ids=_read(ctx, run, "dupids", part, DupId),
        refs=_read(ctx, run, "refs", part, LineRef),
        verdicts=_read(ctx, run, "verdicts", part, LineVerdict),
        rules=_read(ctx, run, "rules", part, LineRule),
    ):
        ctx.store.put(keys.shard_input(run, shard_in.shard), shard_in.model_dump_json().encode())
    return {}


_STEPS: dict[str, Callable[[Context, str, IngestPlan, int], dict[str, Any]]] = {
    "map": _map,
    "ids": _ids,
    "join": _join,
    "exact": _exact,
    "screen": _screen,
    "purity": _purity,
    "apply": _apply,
}
ROUNDS = tuple(_STEPS)  # in order; map and apply one task per range, the rest per partition


def lazy_embed(texts: Sequence[str]) -> np.ndarray:
    """The model is loaded only when a family has questions no template settles."""
    return load_embedder()(texts)


def report(ctx: Context, run: str, the_plan: IngestPlan) -> None:
    """runs/<run>/cleaning.json from the exact, screen and purity summaries (once)."""
    key = keys.cleaning(run)
    if ctx.store.exists(key):
        return
    s, k = ctx.settings, the_plan.partitions
    duplicates: dict[str, int] = {}
    evalsets: dict[str, int] = {}
    families: dict[str, Any] = {}
    screen: dict[str, Any] = {}
    for part in range(k):
        exact = json.loads(ctx.store.get(keys.ingest_done(run, "exact", part)))
        d = json.loads(ctx.store.get(keys.ingest_done(run, "screen", part)))
        for counts in (exact["duplicates"], d["duplicates"]):
            for family, n in counts.items():
                duplicates[family] = duplicates.get(family, 0) + n
        for name, n in d["evalsets"].items():
            evalsets[name] = evalsets.get(name, 0) + n
        screen = d["screen"]
        families |= json.loads(ctx.store.get(keys.ingest_done(run, "purity", part)))["families"]
    out = cleaning_report(
        families,
        duplicates,
        refused=ctx.load_json(pool_key(ctx, run) + REFUSED) or {},
        provenance_policy=s.provenance_policy,
        purity_threshold=s.purity_threshold,
        purity_min_items=s.purity_min_items,
        purity_origins=s.purity_origins,
        embedded=s.purity_embedding,
        screen=screen_summary(
            screen["near_duplicate_distance"],
            screen["evalset_match"],
            screen["evalsets"],
            evalsets,
            screen["committed_runs"],
        ),
    )
    _write_report(ctx, run, out)


def _write_report(ctx: Context, run: str, out: dict[str, Any]) -> None:
    """runs/<run>/cleaning.json, with the provenance roots it was cleaned under."""
    out["policy"]["provenance_roots"] = list(ctx.settings.provenance_roots)
    ctx.store.put(
        keys.cleaning(run),
        json.dumps(out, indent=1, ensure_ascii=False).encode(),
        content_type="application/json",
    )


def commit(ctx: Context, run: str, the_plan: IngestPlan) -> None:
    index = {
        "shards": the_plan.shards(),
        "lines": the_plan.lines,
        "blank_lines": the_plan.blank_lines,
        # Items per family (cleaning.json, written by `report` before the apply round),
        # for the judge's calibration rates (docs/judge.md).
        "families": family_items(ctx.load_json(keys.cleaning(run)) or {}),
    }
    ctx.store.put(keys.shards(run), json.dumps(index).encode())  # commit point
