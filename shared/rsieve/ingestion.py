"""Ingest as a map and a reduce: the decisions that need the whole pool, taken by tasks
that each hold a range of the pool or a partition of its keys, never the whole pool
(docs/decisions.md, "Ingest in rounds").

`rsieve.cleaning.assess_pool` takes them in one pass over every line; this module takes
the same decisions in rounds, each a pure function over what the round before stored:

1. plan (`plan_ingest`): the pool file streamed once, cut into ranges of whole shards
   (`ingest_range_items` lines, rounded up to `shard_size`), with each range's first line
   and first shard, so every later round numbers lines and shards as one pass would;
2. map (`map_range`, one task per range): each line read once; its id goes to the
   partition of the id, its image path (with what the line says about itself: family,
   protocol, question and answer keys, origin) to the partition of the path;
3. join (`first_ids` and `join_images`, one task per partition): duplicate ids (the first
   line keeps the id); each path joined with its pack index entry, the upload's refusals
   and the provenance check. What survives goes to the partition of its question key;
4. dedup (`dedup`, one task per question-key partition): exact duplicates (same image,
   same question) and the screen (evaluation sets, near-duplicates of earlier lines and of
   the dataset's committed items), in pool order. Both compare only lines with the same
   question key, so a partition sees every line its decisions need;
5. purity (`purity`, one task per family partition): `rsieve.purity.measure_purity` over
   each family's questions that survived;
6. apply (`apply_range`, one task per range): each line of the range with its verdict,
   purity rule, image and first line of its id, written as the clean stage's inputs.

Every round sends each line's facts to the partition of the key its next decision needs
(`rsieve.partitions.key_partition`), so the outcome is `assess_pool`'s, verdict for
verdict and figure for figure (tests/unit/test_ingestion.py compares them)."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

from rsieve.cleaning import (
    Provenance,
    line_image_path,
    parse_line,
    pool_image_path,
    upload_refusal,
)
from rsieve.decontam import Screen, answer_key, question_key
from rsieve.families import protocol_for
from rsieve.mcq import normalise_mcq
from rsieve.packs import ImageRef
from rsieve.partitions import key_partition, partition_count
from rsieve.purity import Embedder, PurityQuestion, measure_purity, origin_of, origins_for
from rsieve.schemas import Quarantined
from rsieve.shards import PoolLine, ShardInput, read_line, shard_label
from rsieve.verify import PROTOCOLS

__all__ = [
    "Candidate",
    "DupId",
    "DupLine",
    "IdRecord",
    "ImageRecord",
    "IngestPlan",
    "Joined",
    "LineRef",
    "LineRule",
    "LineVerdict",
    "PoolRange",
    "PurityRecord",
    "apply_range",
    "dedup",
    "first_ids",
    "join_images",
    "map_range",
    "plan_ingest",
    "purity",
    "range_lines",
]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolRange(_Record):
    """Bytes [start, end) of items.jsonl: whole lines, whole shards."""

    start: int
    end: int
    first_line: int  # the 1-based number of its first line
    first_shard: int
    lines: int  # non-blank lines (items)


class IngestPlan(_Record):
    ranges: list[PoolRange]
    shard_size: int
    partitions: int  # of every key-partitioned round (a power of two)
    lines: int  # non-blank lines of the pool
    blank_lines: list[int]

    @cached_property
    def _first_lines(self) -> list[int]:
        return [r.first_line for r in self.ranges]

    def range_of(self, line: int) -> int:
        return bisect.bisect_right(self._first_lines, line) - 1

    def shards(self) -> dict[str, int]:
        """Shard label -> its lines, as `rsieve.shards.split_pool` cuts them."""
        out = {}
        for r in self.ranges:
            for i, at in enumerate(range(0, r.lines, self.shard_size)):
                out[shard_label(r.first_shard + i)] = min(self.shard_size, r.lines - at)
        return out


def plan_ingest(chunks: Iterable[bytes], *, shard_size: int, range_items: int) -> IngestPlan:
    """The pool file (streamed, in chunks of any size) cut into ranges of whole shards of
    at most `range_items` lines, rounded up to whole shards. Lines are what
    `split_pool` takes: the parts between newlines, the empty part after a final newline
    not one; a line of whitespace is blank."""
    per_range = -(-max(range_items, 1) // shard_size) * shard_size
    ranges: list[PoolRange] = []
    blank: list[int] = []
    number = items = 0  # lines seen; non-blank lines seen
    start = offset = 0  # the open range's first byte; bytes consumed
    first_line, in_range = 1, 0
    carry = b""

    def line(raw: bytes, end: int) -> None:
        nonlocal number, items, start, first_line, in_range
        number += 1
        if not raw.strip():
            blank.append(number)
            return
        items += 1
        in_range += 1
        if in_range == per_range:
            ranges.append(
                PoolRange(
                    start=start,
                    end=end,
                    first_line=first_line,
                    first_shard=(items - in_range) // shard_size,
                    lines=in_range,
                )
            )
            start, first_line, in_range = end, number + 1, 0

    for chunk in chunks:
        data = carry + chunk
        base = offset - len(carry)
        at = 0
        while (nl := data.find(b"\n", at)) >= 0:
            line(data[at:nl], base + nl + 1)
            at = nl + 1
        carry = data[at:]
        offset += len(chunk)
    if carry:
        line(carry, offset)
    if in_range or not ranges:
        ranges.append(
            PoolRange(
                start=start,
                end=offset,
                first_line=first_line,
                first_shard=(items - in_range) // shard_size,
                lines=in_range,
            )
        )
    return IngestPlan(
        ranges=ranges,
        shard_size=shard_size,
        partitions=partition_count(items, range_items),
        lines=items,
        blank_lines=blank,
    )


def range_lines(data: bytes, first_line: int) -> Iterator[tuple[PoolLine, str | None]]:
    """The non-blank lines of a range's bytes, numbered from `first_line`, each with the
    item id it names (`rsieve.shards.read_line`)."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    for number, raw in enumerate(parts, start=first_line):
        if raw.strip():
            yield read_line(number, raw)


class Candidate(_Record):
    """What a line says about itself, for the decisions it may reach: a line that parses
    and names an image inside the pool."""

    family: str
    protocol: str | None
    source: Any = None
    question: str
    qkey: str  # rsieve.decontam.question_key: the partition of its dedup
    akey: str  # rsieve.decontam.answer_key
    mcq: str | None = None  # rsieve.mcq status, multiple choice only
    origin: str | None = None


class IdRecord(_Record):
    line: int
    id: str
    qpart: int | None  # the dedup partition of the line's candidate, if it is one


class ImageRecord(_Record):
    line: int
    path: str
    candidate: Candidate | None = None


class MapOut(BaseModel):
    ids: dict[int, list[IdRecord]]
    images: dict[int, list[ImageRecord]]


def map_range(
    lines: Iterable[tuple[PoolLine, str | None]], *, text_max_chars: int, partitions: int
) -> MapOut:
    """Each line's id to the partition of the id, its image path (and its candidate) to
    the partition of the path."""
    ids: dict[int, list[IdRecord]] = defaultdict(list)
    images: dict[int, list[ImageRecord]] = defaultdict(list)
    for pl, item_id in lines:
        candidate = None
        path = None
        if pl.utf8:
            item = parse_line(pl.raw.encode(), pl.line, text_max_chars=text_max_chars)
            if not isinstance(item, Quarantined) and (path := pool_image_path(item.image)):
                protocol = protocol_for(item.family, item.protocol)
                mcq = None
                if protocol == "mc":
                    mcq = normalise_mcq(item.question, item.answer, item.options).status
                candidate = Candidate(
                    family=item.family,
                    protocol=protocol,
                    source=item.source,
                    question=item.question,
                    qkey=question_key(item.question),
                    akey=answer_key(item.answer),
                    mcq=mcq,
                    origin=origin_of(item.source),
                )
        if item_id is not None:
            qpart = key_partition(candidate.qkey, partitions) if candidate else None
            ids[key_partition(item_id, partitions)].append(
                IdRecord(line=pl.line, id=item_id, qpart=qpart)
            )
        if path is None:
            path = line_image_path(pl)
        if path is not None:
            images[key_partition(path, partitions)].append(
                ImageRecord(line=pl.line, path=path, candidate=candidate)
            )
    return MapOut(ids=dict(ids), images=dict(images))


class DupId(_Record):
    line: int
    first: int


class DupLine(_Record):
    line: int


def first_ids(
    records: Iterable[IdRecord], range_of: Callable[[int], int]
) -> tuple[dict[int, list[DupId]], dict[int, list[int]]]:
    """Lines whose id an earlier line has: (by range, (line, first line)) for the clean
    stage, (by dedup partition, line) for dedup, which leaves them out."""
    first: dict[str, int] = {}
    for rec in sorted(records, key=lambda r: r.line):
        first.setdefault(rec.id, rec.line)
    to_apply: dict[int, list[DupId]] = defaultdict(list)
    to_dedup: dict[int, list[int]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: r.line):
        if first[rec.id] != rec.line:
            to_apply[range_of(rec.line)].append(DupId(line=rec.line, first=first[rec.id]))
            if rec.qpart is not None:
                to_dedup[rec.qpart].append(rec.line)
    return dict(to_apply), dict(to_dedup)


class LineRef(_Record):
    line: int
    ref: ImageRef


class Joined(_Record):
    """A candidate with its image: refused by the upload, or found and admitted."""

    line: int
    candidate: Candidate
    refused: tuple[str, str] | None = None
    sha256: str | None = None
    phash: str | None = None


def join_images(
    records: Iterable[ImageRecord],
    refs: Mapping[str, ImageRef],
    *,
    refused: Mapping[str, str | Mapping[str, str]],
    provenance: Provenance,
    range_of: Callable[[int], int],
    partitions: int,
) -> tuple[dict[int, list[LineRef]], dict[int, list[Joined]]]:
    """Each line's image entry (by range, for the clean stage), and each candidate that
    the upload refused or that has an image, a protocol and provenance (by dedup
    partition), in `assess_pool`'s order of checks."""
    to_apply: dict[int, list[LineRef]] = defaultdict(list)
    to_dedup: dict[int, list[Joined]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: r.line):
        ref = refs.get(rec.path)
        if ref is not None:
            to_apply[range_of(rec.line)].append(LineRef(line=rec.line, ref=ref))
        cand = rec.candidate
        if cand is None:
            continue
        part = key_partition(cand.qkey, partitions)
        if rec.path in refused:
            reason, detail = upload_refusal(refused[rec.path])
            joined = Joined(
                line=rec.line, candidate=cand, refused=(reason, f"{rec.path}: {detail}")
            )
            to_dedup[part].append(joined)
            continue
        if ref is None or cand.protocol is None or cand.protocol not in PROTOCOLS:
            continue
        if not provenance(cand.source, ref.sha256)[0]:
            continue
        to_dedup[part].append(
            Joined(line=rec.line, candidate=cand, sha256=ref.sha256, phash=ref.phash)
        )
    return dict(to_apply), dict(to_dedup)


class LineVerdict(_Record):
    line: int
    reason: str
    detail: str


class PurityRecord(_Record):
    line: int
    family: str
    protocol: str
    question: str
    mcq: str | None = None
    origin: str | None = None


class DedupOut(BaseModel):
    verdicts: dict[int, list[LineVerdict]]
    purity: dict[int, list[PurityRecord]]
    duplicates: dict[str, int]  # family -> duplicate_item verdicts
    evalsets: dict[str, int]  # evaluation set -> lines matched


def dedup(
    joined: Iterable[Joined],
    duplicate_ids: Iterable[int],
    *,
    screen: Screen | None,
    range_of: Callable[[int], int],
    partitions: int,
) -> DedupOut:
    """One question-key partition in pool order: upload refusals, exact duplicates (the
    first line of an image and question keeps the item), the screen; what passes goes to
    the partition of its family. `screen` holds the dataset's committed keys of this
    partition's question keys alone."""
    skip = set(duplicate_ids)
    first_of: dict[tuple[str, str], int] = {}
    verdicts: dict[int, list[LineVerdict]] = defaultdict(list)
    to_purity: dict[int, list[PurityRecord]] = defaultdict(list)
    duplicates: Counter[str] = Counter()
    for j in sorted(joined, key=lambda r: r.line):
        if j.line in skip:
            continue
        cand, where = j.candidate, range_of(j.line)
        if j.refused is not None:
            verdicts[where].append(
                LineVerdict(line=j.line, reason=j.refused[0], detail=j.refused[1])
            )
            continue
        first = first_of.setdefault((str(j.sha256), cand.question.strip()), j.line)
        if first != j.line:
            verdicts[where].append(
                LineVerdict(
                    line=j.line,
                    reason="duplicate_item",
                    detail=f"same image and question as line {first}",
                )
            )
            duplicates[cand.family] += 1
            continue
        if screen is not None:
            found = screen.check_keys(j.line, j.phash, cand.qkey, cand.akey)
            if found is not None:
                verdicts[where].append(LineVerdict(line=j.line, reason=found[0], detail=found[1]))
                duplicates[cand.family] += found[0] == "duplicate_item"
                continue
        to_purity[key_partition(cand.family, partitions)].append(
            PurityRecord(
                line=j.line,
                family=cand.family,
                protocol=str(cand.protocol),
                question=cand.question,
                mcq=cand.mcq,
                origin=cand.origin,
            )
        )
    return DedupOut(
        verdicts=dict(verdicts),
        purity=dict(to_purity),
        duplicates=dict(sorted(duplicates.items())),
        evalsets=dict(sorted(screen.counts.items())) if screen is not None else {},
    )


class LineRule(_Record):
    line: int
    rule: str


class PurityOut(BaseModel):
    verdicts: dict[int, list[LineVerdict]]
    rules: dict[int, list[LineRule]]
    families: dict[str, dict[str, Any]]  # family -> {"purity", "mcq"}


def purity(
    records: Iterable[PurityRecord],
    *,
    threshold: float,
    min_items: int,
    embed: Embedder | None,
    purity_origins: Mapping[str, Sequence[str]] | None,
    range_of: Callable[[int], int],
) -> PurityOut:
    """Task purity of the families of one partition (every question of each): the rule of
    every line, `off_task` verdicts, and each family's measurement."""
    by_family: dict[str, list[PurityRecord]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: r.line):
        by_family[rec.family].append(rec)
    verdicts: dict[int, list[LineVerdict]] = defaultdict(list)
    rules: dict[int, list[LineRule]] = defaultdict(list)
    families: dict[str, dict[str, Any]] = {}
    for family in sorted(by_family):
        recs = by_family[family]
        measured = measure_purity(
            family,
            recs[0].protocol,
            [
                PurityQuestion(
                    r.line, r.question, has_options=r.mcq not in (None, "none"), origin=r.origin
                )
                for r in recs
            ],
            threshold=threshold,
            min_items=min_items,
            embed=embed,
            origins=origins_for(family, purity_origins),
        )
        for line, rule in measured.rule_of_line.items():
            rules[range_of(line)].append(LineRule(line=line, rule=rule))
        origin_of_line = {r.line: r.origin for r in recs}
        for line in measured.dropped_lines:
            detail = measured.drop_detail(line, origin_of_line[line])
            verdicts[range_of(line)].append(
                LineVerdict(line=line, reason="off_task", detail=detail)
            )
        mcq = Counter(r.mcq for r in recs if r.mcq is not None)
        families[family] = {"purity": measured.summary(), "mcq": dict(sorted(mcq.items()))}
    return PurityOut(verdicts=dict(verdicts), rules=dict(rules), families=families)


def apply_range(
    run: str,
    pool_range: PoolRange,
    lines: Iterable[PoolLine],
    *,
    shard_size: int,
    duplicate_ids: Iterable[DupId],
    refs: Iterable[LineRef],
    verdicts: Iterable[LineVerdict],
    rules: Iterable[LineRule],
) -> list[ShardInput]:
    """The clean stage's inputs of one range, as `rsieve.cleaning.shard_inputs` writes
    them for the whole pool."""
    first = {d.line: d.first for d in duplicate_ids}
    ref_of = {r.line: r.ref for r in refs}
    verdict_of = {v.line: (v.reason, v.detail) for v in verdicts}
    rule_of = {r.line: r.rule for r in rules}
    filled = [
        pl.model_copy(
            update={
                "duplicate_of": first.get(pl.line),
                "verdict": verdict_of.get(pl.line),
                "purity": rule_of.get(pl.line),
                "image": ref_of.get(pl.line),
            }
        )
        for pl in lines
    ]
    return [
        ShardInput(
            run=run,
            shard=shard_label(pool_range.first_shard + n),
            lines=filled[at : at + shard_size],
        )
        for n, at in enumerate(range(0, len(filled), shard_size))
    ]
