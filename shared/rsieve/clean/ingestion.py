"""Ingest as a map and a reduce: the decisions that need the whole pool, taken by tasks
that each hold a range of the pool or a partition of its keys, never the whole pool
(docs/decisions.md, "Ingest in rounds").

Each decision has one implementation, a round here, each a pure function over what the
round before stored:

1. plan (`plan_ingest`): the pool file streamed once, cut into ranges of whole shards
   (`ingest_range_items` lines, rounded up to `shard_size`), with each range's first line
   and first shard, so every later round numbers lines and shards as one pass would;
2. map (`map_range`, one task per range): each line read once; its id goes to the
   partition of the id, its image path (with what the line says about itself: family,
   protocol, question and answer keys, origin) to the partition of the path;
3. ids (`first_ids`, per id partition): duplicate ids, the first line keeping the id;
4. join (`join_images`, per path partition): each path joined with its pack index entry;
   for each candidate whose id is its own, the upload's refusals, then the image, protocol
   and provenance checks; what passes goes to the partition of its (image, question key);
5. exact (`exact_duplicates`): the same image and question, the first line keeping the
   item; the rest go to the partition of their (question key, answer key);
6. screen (`screened`): evaluation sets and near-duplicates (earlier lines; the dataset's
   committed items), in pool order; only lines with the same question and answer can be
   near-duplicates, so the partition holds all a decision needs. The rest go to the
   partition of their family;
7. purity (`purity`, per family partition): `rsieve.clean.purity.measure_purity` over each
   family's questions that came this far;
8. apply (`apply_range`, one task per range): each line of the range with its verdict,
   purity rule, image and first line of its id, written as the clean stage's inputs.

Every round sends each line's facts to the partition of the key its next decision needs
(`rsieve.run.partitions.key_partition`), so the outcome does not depend on how the pool is
cut: a pool of one range runs the same rounds in one process, over one range and one
partition (`ingest_in_process`), and gets the outcome of many ranges and partitions in
tasks, verdict for verdict and figure for figure (tests/unit/test_ingestion.py compares
them)."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

from rsieve.clean.cleaning import (
    Provenance,
    cleaning_report,
    line_image_path,
    parse_line,
    pool_image_path,
    upload_refusal,
)
from rsieve.clean.decontam import Screen, answer_key, question_key
from rsieve.clean.profiles import FamilyProfile
from rsieve.clean.purity import (
    Embedder,
    PurityQuestion,
    first_reference,
    measure_purity,
    origin_of,
    origins_for,
)
from rsieve.families import protocol_for
from rsieve.mcq import normalise_mcq
from rsieve.run.partitions import key_partition, partition_count
from rsieve.run.shards import PoolLine, ShardInput, read_line, shard_label
from rsieve.schemas import ImageRef, Quarantined
from rsieve.verify import PROTOCOLS

__all__ = [
    "Candidate",
    "DedupOut",
    "DupId",
    "DupLine",
    "IdRecord",
    "ImageRecord",
    "IngestPlan",
    "Ingested",
    "JoinOut",
    "Joined",
    "LineRef",
    "LineRule",
    "LineVerdict",
    "MapOut",
    "PoolRange",
    "PurityOut",
    "PurityRecord",
    "apply_range",
    "exact_duplicates",
    "first_ids",
    "ingest_in_process",
    "join_images",
    "map_range",
    "plan_ingest",
    "purity",
    "range_lines",
    "screen_partition",
    "screened",
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
        """Shard label -> its lines, as `rsieve.run.shards.split_pool` cuts them."""
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

    def close(end: int) -> None:
        nonlocal start, first_line, in_range
        first_shard = (items - in_range) // shard_size
        ranges.append(
            PoolRange(
                start=start, end=end, first_line=first_line, first_shard=first_shard, lines=in_range
            )
        )
        start, first_line, in_range = end, number + 1, 0

    def line(raw: bytes, end: int) -> None:
        nonlocal number, items, in_range
        number += 1
        if not raw.strip():
            blank.append(number)
            return
        items += 1
        in_range += 1
        if in_range == per_range:
            close(end)

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
        close(offset)
    return IngestPlan(
        ranges=ranges,
        shard_size=shard_size,
        partitions=partition_count(items, range_items),
        lines=items,
        blank_lines=blank,
    )


def range_lines(data: bytes, first_line: int) -> Iterator[tuple[PoolLine, str | None]]:
    """The non-blank lines of a range's bytes, numbered from `first_line`, each with the
    item id it names (`rsieve.run.shards.read_line`)."""
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
    qkey: str  # rsieve.clean.decontam.question_key
    akey: str  # rsieve.clean.decontam.answer_key
    mcq: str | None = None  # rsieve.mcq status, multiple choice only
    origin: str | None = None
    reference: str | None = None  # first_reference: the answer's form, for task purity


class IdRecord(_Record):
    line: int
    id: str
    jpart: int | None  # the join partition of the line's image path, if it names one


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
                    reference=first_reference(item.answer),
                )
        if path is None:
            path = line_image_path(pl)
        jpart = key_partition(path, partitions) if path is not None else None
        if item_id is not None:
            ids[key_partition(item_id, partitions)].append(
                IdRecord(line=pl.line, id=item_id, jpart=jpart)
            )
        if path is not None and jpart is not None:
            images[jpart].append(ImageRecord(line=pl.line, path=path, candidate=candidate))
    return MapOut(ids=dict(ids), images=dict(images))


class DupId(_Record):
    line: int
    first: int


class DupLine(_Record):
    line: int


def first_ids(
    records: Iterable[IdRecord], range_of: Callable[[int], int]
) -> tuple[dict[int, list[DupId]], dict[int, list[DupLine]]]:
    """Lines whose id an earlier line has: (by range, (line, first line)) for the clean
    stage, (by join partition, line) for the join, which takes no decision on them."""
    first: dict[str, int] = {}
    ordered = sorted(records, key=lambda r: r.line)
    for rec in ordered:
        first.setdefault(rec.id, rec.line)
    to_apply: dict[int, list[DupId]] = defaultdict(list)
    to_join: dict[int, list[DupLine]] = defaultdict(list)
    for rec in ordered:
        if first[rec.id] != rec.line:
            to_apply[range_of(rec.line)].append(DupId(line=rec.line, first=first[rec.id]))
            if rec.jpart is not None:
                to_join[rec.jpart].append(DupLine(line=rec.line))
    return dict(to_apply), dict(to_join)


class LineRef(_Record):
    line: int
    ref: ImageRef


class LineVerdict(_Record):
    line: int
    reason: str
    detail: str


class Joined(_Record):
    """A candidate whose image was found, with a protocol and provenance."""

    line: int
    candidate: Candidate
    sha256: str
    phash: str | None = None
    crop_phashes: tuple[str, ...] = ()


class JoinOut(BaseModel):
    refs: dict[int, list[LineRef]]  # by range: every line's image entry
    verdicts: dict[int, list[LineVerdict]]  # by range: the upload's refusals
    joined: dict[int, list[Joined]]  # by partition of (image, question key)


def join_images(
    records: Iterable[ImageRecord],
    refs: Mapping[str, ImageRef],
    duplicate_ids: Iterable[int],
    *,
    refused: Mapping[str, str | Mapping[str, str]],
    provenance: Provenance,
    range_of: Callable[[int], int],
    partitions: int,
) -> JoinOut:
    """Each line's image entry, for the clean stage; for each candidate whose id no
    earlier line has, in the clean stage's order of checks (`clean_line`): the upload's
    refusal, or (with an image, a protocol and provenance) on to the exact duplicates of
    its image."""
    skip = set(duplicate_ids)
    out = JoinOut(refs={}, verdicts={}, joined={})
    for rec in sorted(records, key=lambda r: r.line):
        ref = refs.get(rec.path)
        if ref is not None:
            out.refs.setdefault(range_of(rec.line), []).append(LineRef(line=rec.line, ref=ref))
        cand = rec.candidate
        if cand is None or rec.line in skip:
            continue
        if rec.path in refused:
            reason, detail = upload_refusal(refused[rec.path])
            verdict = LineVerdict(line=rec.line, reason=reason, detail=f"{rec.path}: {detail}")
            out.verdicts.setdefault(range_of(rec.line), []).append(verdict)
            continue
        if ref is None or cand.protocol is None or cand.protocol not in PROTOCOLS:
            continue
        if not provenance(cand.source, ref.sha256)[0]:
            continue
        part = key_partition(f"{ref.sha256}/{cand.qkey}", partitions)
        out.joined.setdefault(part, []).append(
            Joined(
                line=rec.line,
                candidate=cand,
                sha256=ref.sha256,
                phash=ref.phash,
                crop_phashes=ref.crop_phashes,
            )
        )
    return out


class PurityRecord(_Record):
    line: int
    family: str
    protocol: str
    question: str
    mcq: str | None = None
    origin: str | None = None
    reference: str | None = None


class DedupOut(BaseModel):
    verdicts: dict[int, list[LineVerdict]]  # by range
    passed: dict[int, list[Joined]]  # by partition of the next round
    duplicates: dict[str, int]  # family -> duplicate_item verdicts
    evalsets: dict[str, int] = {}  # evaluation set -> lines matched


def screen_partition(qkey: str, akey: str, partitions: int) -> int:
    """The screen's partition of a question and answer: only those compare their images."""
    return key_partition(f"{qkey}/{akey}", partitions)


def exact_duplicates(
    joined: Iterable[Joined], *, range_of: Callable[[int], int], partitions: int
) -> DedupOut:
    """One partition of (image, question key), in pool order: of the lines with the same
    image sha256 and the same question, the first keeps the item; the rest go on to the
    partition of their question and answer."""
    first_of: dict[tuple[str, str], int] = {}
    out = DedupOut(verdicts={}, passed={}, duplicates={})
    for j in sorted(joined, key=lambda r: r.line):
        first = first_of.setdefault((j.sha256, j.candidate.question.strip()), j.line)
        if first != j.line:
            detail = f"same image and question as line {first}"
            verdict = LineVerdict(line=j.line, reason="duplicate_item", detail=detail)
            out.verdicts.setdefault(range_of(j.line), []).append(verdict)
            family = j.candidate.family
            out.duplicates[family] = out.duplicates.get(family, 0) + 1
            continue
        part = screen_partition(j.candidate.qkey, j.candidate.akey, partitions)
        out.passed.setdefault(part, []).append(j)
    out.duplicates = dict(sorted(out.duplicates.items()))
    return out


def screened(
    joined: Iterable[Joined],
    *,
    screen: Screen | None,
    range_of: Callable[[int], int],
    partitions: int,
) -> tuple[DedupOut, dict[int, list[PurityRecord]]]:
    """One partition of (question key, answer key), in pool order, through the screen
    (evaluation sets; near-duplicates of earlier lines and of the dataset's committed
    items, of which `screen` holds this partition's alone); what passes goes to the
    partition of its family."""
    out = DedupOut(verdicts={}, passed={}, duplicates={})
    to_purity: dict[int, list[PurityRecord]] = defaultdict(list)
    for j in sorted(joined, key=lambda r: r.line):
        cand = j.candidate
        found = (
            screen.check_keys(j.line, j.phash, cand.qkey, cand.akey, j.crop_phashes)
            if screen
            else None
        )
        if found is not None:
            verdict = LineVerdict(line=j.line, reason=found[0], detail=found[1])
            out.verdicts.setdefault(range_of(j.line), []).append(verdict)
            if found[0] == "duplicate_item":
                out.duplicates[cand.family] = out.duplicates.get(cand.family, 0) + 1
            continue
        to_purity[key_partition(cand.family, partitions)].append(
            PurityRecord(
                line=j.line,
                family=cand.family,
                protocol=str(cand.protocol),
                question=cand.question,
                mcq=cand.mcq,
                origin=cand.origin,
                reference=cand.reference,
            )
        )
    out.duplicates = dict(sorted(out.duplicates.items()))
    out.evalsets = dict(sorted(screen.counts.items())) if screen is not None else {}
    return out, dict(to_purity)


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
    profiles: Mapping[str, FamilyProfile] | None = None,
) -> PurityOut:
    """Task purity of the families of one partition (every question of each): the rule of
    every line, `off_task` verdicts, and each family's measurement, judged with the
    dataset's `profiles` of the families (rsieve.clean.profiles); each family's entry
    carries the profile of this pool's on-task items (`profile`), which the commit adds to
    the dataset's."""
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
                    r.line,
                    r.question,
                    has_options=r.mcq not in (None, "none"),
                    origin=r.origin,
                    reference=r.reference,
                )
                for r in recs
            ],
            threshold=threshold,
            min_items=min_items,
            embed=embed,
            origins=origins_for(family, purity_origins),
            profile=(profiles or {}).get(family),
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
        families[family] = {
            "purity": measured.summary(),
            "mcq": dict(sorted(mcq.items())),
            "profile": measured.profile.model_dump() if measured.profile else None,
        }
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
    """The clean stage's inputs of one range: each line with the first line of its id, its
    whole-pool verdict, its purity rule and its image entry, in shards of `shard_size`
    numbered from the range's first shard."""
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


@dataclass(frozen=True)
class Ingested:
    """A pool ingested in one process: the clean stage's inputs (every line with its
    first line of its id, whole-pool verdict, purity rule and image entry) and
    runs/<run>/cleaning.json."""

    inputs: list[ShardInput]
    report: dict[str, Any]


def _one(_line: int) -> int:
    return 0


def ingest_in_process(
    run: str,
    pool: bytes,
    refs: Mapping[str, ImageRef],
    *,
    shard_size: int,
    refused: Mapping[str, str | Mapping[str, str]],
    provenance: Provenance,
    provenance_policy: str,
    text_max_chars: int,
    purity_threshold: float,
    purity_min_items: int,
    purity_origins: Mapping[str, Sequence[str]] | None,
    embed: Embedder | None,
    screen: Screen | None,
    profiles: Mapping[str, FamilyProfile] | None = None,
) -> Ingested:
    """A pool of one range (`pool`: the whole items.jsonl) through every round above, in
    one process: one range, one partition, each round's records handed to the next in
    memory. The shell hands in what it read: the pack index's entries (`refs`: pool path
    -> entry), the upload's refusals (`_refused.json`), the provenance check (resolvers
    included), the embedder, the screen (evaluation sets; the dataset's committed
    items) and the dataset's family profiles. No I/O here; the outcome is the rounds' over
    any ranges and partitions."""
    lines = list(range_lines(pool, 1))
    mapped = map_range(lines, text_max_chars=text_max_chars, partitions=1)
    dup_ids, dup_join = first_ids(mapped.ids.get(0, []), _one)
    joined = join_images(
        mapped.images.get(0, []),
        refs,
        [d.line for d in dup_join.get(0, [])],
        refused=refused,
        provenance=provenance,
        range_of=_one,
        partitions=1,
    )
    exact = exact_duplicates(joined.joined.get(0, []), range_of=_one, partitions=1)
    near, to_purity = screened(exact.passed.get(0, []), screen=screen, range_of=_one, partitions=1)
    measured = purity(
        to_purity.get(0, []),
        threshold=purity_threshold,
        min_items=purity_min_items,
        embed=embed,
        purity_origins=purity_origins,
        range_of=_one,
        profiles=profiles,
    )
    duplicates = Counter(exact.duplicates) + Counter(near.duplicates)
    report = cleaning_report(
        measured.families,
        duplicates,
        refused=refused,
        provenance_policy=provenance_policy,
        purity_threshold=purity_threshold,
        purity_min_items=purity_min_items,
        purity_origins=purity_origins,
        embedded=embed is not None,
        screen=screen.summary() if screen is not None else None,
    )
    whole = PoolRange(start=0, end=len(pool), first_line=1, first_shard=0, lines=len(lines))
    inputs = apply_range(
        run,
        whole,
        [pl for pl, _ in lines],
        shard_size=shard_size,
        duplicate_ids=dup_ids.get(0, []),
        refs=joined.refs.get(0, []),
        verdicts=[
            v
            for out in (joined.verdicts, exact.verdicts, near.verdicts, measured.verdicts)
            for v in out.get(0, [])
        ],
        rules=measured.rules.get(0, []),
    )
    return Ingested(inputs=inputs, report=report)
