"""Decontamination and near-duplicates, decided at ingest, before any GPU time.

Every pool image has a 64-bit perceptual hash (rsieve.hashindex.perceptual_hash: the DCT
hash), computed once as the upload packs it and kept in the pack index (`ImageRef.phash`).
Two images are near-duplicates when their hashes lie within `near_duplicate_distance`
bits (Hamming); docs/cleaning.md gives the measured recall and false matches. A question
is compared normalised (`question_key`: case and spacing folded, hashed).

For each line the cleaner would admit, in pool order (`Screen.check`):
- `contaminated`: its image is a near-duplicate of an image of a registered evaluation
  set (`rsieve evalset add`), or, with `evalset_match = "image_and_question"`, of one
  asked the same question. The detail names the set.
- `duplicate_item`: the same question on a near-duplicate of an earlier line's image
  (byte-identical images are caught before, by sha256), or of an image already committed
  to the same dataset by an earlier run (`keys/<run>.near.json`, written by the
  compactor). So a second run of an overlapping pool spends no model call on the overlap.
  An image is kept under its own hash and its light crops' (`ImageRef.crop_phashes`, the
  crops an evaluation image is indexed under): a line is a near-duplicate of an earlier
  image when its hash lies near one of the earlier image's (it was cut from it) or one of
  its own crops' hashes lies near the earlier image's (the earlier was cut from it).

Pure: the cleaner loads the evaluation sets and the dataset's keys (services/cleaner)."""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from rsieve import keys
from rsieve.clean.cleaning import pool_image_path
from rsieve.hashindex import HashIndex, hash_hex, informative, parse_hash, reference_hashes
from rsieve.run.packs import PHASH_MAX_PIXELS

__all__ = [
    "EVALSET_PATTERN",
    "EvalSet",
    "NearKey",
    "Screen",
    "answer_key",
    "build_evalset",
    "dataset_keys",
    "evalset_key",
    "near_keys_key",
    "question_key",
    "read_dataset_keys",
    "screen_summary",
]

EVALSET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_RADIUS = 16  # the largest near_duplicate_distance the indexes answer

EvalsetMatch = Literal["image", "image_and_question"]


def question_key(question: str) -> str:
    """A question compared across pools: case and whitespace folded, sha256, 16 hex."""
    return hashlib.sha256(" ".join(question.casefold().split()).encode()).hexdigest()[:16]


def answer_key(references: str | Iterable[str]) -> str:
    """An item's references (one, or a list) compared across pools: each folded as a
    question is, sorted,
    sha256, 16 hex. Two items on near-duplicate images with the same question are one item
    only when their references agree too: crops of two different words on the same plain
    background hash alike, and their answers tell them apart."""
    listed = [references] if isinstance(references, str) else references
    folded = sorted({" ".join(str(r).casefold().split()) for r in listed})
    return hashlib.sha256(json.dumps(folded).encode()).hexdigest()[:16]


evalset_key = keys.evalset  # a registered evaluation set
near_keys_key = keys.near_keys  # a committed run's (image hash, question, answer) keys


NearKey = tuple[str, str, str, tuple[str, ...]]  # image hash, question, answer, crop hashes


def dataset_keys(keys: Iterable[tuple[str | None, str, str, Iterable[str]]]) -> bytes:
    """keys/<run>.near.json: the sorted, distinct [image hash, question key, answer key,
    [crop hashes]] of every item a run committed (images without a hash are left out)."""
    distinct = {(h, q, a, tuple(crops)) for h, q, a, crops in keys if h}
    return json.dumps([[h, q, a, list(c)] for h, q, a, c in sorted(distinct)]).encode()


def read_dataset_keys(data: bytes) -> list[NearKey]:
    """The entries of a keys/<run>.near.json; one written before crop hashes were kept
    ([hash, question key, answer key]) reads with none."""
    out: list[NearKey] = []
    for entry in json.loads(data):
        h, q, a, *rest = entry
        crops = tuple(str(c) for c in rest[0]) if rest else ()
        out.append((str(h), str(q), str(a), crops))
    return out


@dataclass
class EvalSet:
    """A registered evaluation set: its images' hashes, each with the question keys asked
    of it. Stored as JSON: {"name", "items": [[hash hex, question key], ...]}."""

    name: str
    items: list[tuple[str, str]]

    def to_json(self) -> bytes:
        return json.dumps({"name": self.name, "items": sorted(set(self.items))}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EvalSet:
        raw = json.loads(data)
        return cls(str(raw["name"]), [(str(h), str(q)) for h, q in raw["items"]])


@dataclass
class Screen:
    """The near-duplicate and evaluation-set checks of one pool. `evalsets` and `committed`
    (each run's pairs, by run) come from storage; the pool's own lines are added as they
    are checked, so only an earlier line counts."""

    distance: int
    evalsets: Mapping[str, EvalSet] = field(default_factory=dict)
    committed: Mapping[str, Iterable[NearKey]] = field(default_factory=dict)
    match: EvalsetMatch = "image"
    counts: Counter[str] = field(default_factory=Counter)  # evaluation set -> items matched

    def __post_init__(self) -> None:
        if not 0 <= self.distance <= MAX_RADIUS:
            raise ValueError(f"near_duplicate_distance must lie in [0, {MAX_RADIUS}]")
        self._evalsets = HashIndex(max_radius=MAX_RADIUS)
        for name, es in sorted(self.evalsets.items()):
            for h, q in es.items:
                self._evalsets.add(parse_hash(h), f"{name}\t{q}")
        # Only the same question and answer can make a duplicate, so images are compared
        # within their (question key, answer key) group alone: a few images each in most
        # pools, searched in a loop; a group past GROUP_INDEXED_FROM gets a HashIndex.
        self._seen: dict[tuple[str, str], _Group] = {}
        for run, entries in sorted(self.committed.items()):
            where = f"run {run}"
            for h, q, a, crops in entries:
                group = self._seen.setdefault((q, a), _Group())
                group.add(parse_hash(h), [parse_hash(c) for c in crops], where)

    def check(
        self,
        line: int,
        image_hash: str | None,
        question: str,
        references: str | Iterable[str],
        crops: Iterable[str] = (),
    ) -> tuple[str, str] | None:
        """The verdict for a line (reason, detail), or None; the line is remembered."""
        return self.check_keys(
            line, image_hash, question_key(question), answer_key(references), crops
        )

    def check_keys(
        self, line: int, image_hash: str | None, q: str, a: str, crops: Iterable[str] = ()
    ) -> tuple[str, str] | None:
        """`check` with the question and answer keys already taken; `crops` are the hashes
        of the line's image's light crops (`ImageRef.crop_phashes`)."""
        if image_hash is None:
            return None
        h = parse_hash(image_hash)
        for key, d in self._evalsets.near(h, self.distance) if len(self._evalsets) else ():
            name, asked = key.split("\t", 1)
            if self.match == "image" or asked == q:
                self.counts[name] += 1
                return "contaminated", (
                    f"evaluation set {name}: image within {d} bits of one of its images"
                    + ("" if self.match == "image" else ", same question")
                )
        group = self._seen.setdefault((q, a), _Group())
        cut = [parse_hash(c) for c in crops]
        found = group.nearest(h, cut, self.distance)
        if found is not None:
            where, d = found
            if where.startswith("run "):
                return "duplicate_item", (
                    f"already in the dataset: the same question and answer on an image "
                    f"within {d} bits of one that {where} committed"
                )
            return "duplicate_item", (
                f"the same question and answer on an image within {d} bits of {where}'s"
            )
        group.add(h, cut, f"line {line}")
        return None

    def summary(self) -> dict[str, object]:
        return screen_summary(
            self.distance, self.match, self.evalsets, self.counts, len(self.committed)
        )


GROUP_INDEXED_FROM = 64  # images


class _Group:
    """The images seen with one (question key, answer key), in insertion order: each one's
    own hash (`plain`) and every hash it is kept under, its own and its crops' (`kept`),
    with the image each belongs to. `nearest` finds the least distance either way (a query
    hash near a kept one; one of the query's crop hashes near a plain one), then the
    earliest image. Scanned in a loop while small; a HashIndex each past
    GROUP_INDEXED_FROM images."""

    __slots__ = ("_indexes", "_kept", "_kept_of", "_plain", "_where")

    def __init__(self) -> None:
        self._plain = array("Q")
        self._kept = array("Q")
        self._kept_of = array("I")  # the image of each kept hash
        self._where: list[str] = []
        self._indexes: tuple[HashIndex, HashIndex] | None = None  # plain, kept

    def add(self, h: int, crops: Iterable[int], where: str) -> None:
        image = len(self._where)
        self._where.append(where)
        hashes = [h, *crops]
        if self._indexes is not None:
            plain, kept = self._indexes
            plain.add(h, str(image))
            for k in hashes:
                kept.add(k, str(image))
            return
        self._plain.append(h)
        self._kept.extend(hashes)
        self._kept_of.extend([image] * len(hashes))
        if len(self._where) >= GROUP_INDEXED_FROM:
            plain, kept = HashIndex(max_radius=MAX_RADIUS), HashIndex(max_radius=MAX_RADIUS)
            for i, p in enumerate(self._plain):
                plain.add(p, str(i))
            for k, i in zip(self._kept, self._kept_of, strict=True):
                kept.add(k, str(i))
            self._indexes = (plain, kept)
            self._plain, self._kept, self._kept_of = array("Q"), array("Q"), array("I")

    def nearest(self, h: int, crops: Iterable[int], radius: int) -> tuple[str, int] | None:
        best: tuple[int, int] | None = None  # (distance, image)
        if self._indexes is not None:
            plain, kept = self._indexes
            found = [(d, int(i)) for i, d in kept.near(h, radius)[:1]]
            found += [(d, int(i)) for i, d in plain.near_any(list(crops), radius)[:1]]
            best = min(found, default=None)
        else:
            for k, image in zip(self._kept, self._kept_of, strict=True):
                d = (h ^ k).bit_count()
                if d <= radius and (best is None or (d, image) < best):
                    best = (d, image)
            for c in crops:
                for image, p in enumerate(self._plain):
                    d = (c ^ p).bit_count()
                    if d <= radius and (best is None or (d, image) < best):
                        best = (d, image)
        return None if best is None else (self._where[best[1]], best[0])


def screen_summary(
    distance: int,
    match: str,
    evalsets: Iterable[str],
    counts: Mapping[str, int],
    committed_runs: int,
) -> dict[str, object]:
    """cleaning.json's `screen`: the settings, lines matched per evaluation set, and how
    many committed runs the pool was screened against."""
    return {
        "near_duplicate_distance": distance,
        "evalset_match": match,
        "evalsets": {name: counts.get(name, 0) for name in sorted(evalsets)},
        "committed_runs": committed_runs,
    }


def build_evalset(
    name: str, items: bytes, image_bytes: Callable[[str], bytes | None]
) -> tuple[EvalSet, dict[str, int]]:
    """An evaluation set from a pool's items.jsonl (any format read to it) and its images
    (`image_bytes(path)`, None when absent): each line's image hashes (the image and 10
    light crops of it, rsieve.hashindex.REFERENCE_CROPS) with its question key.
    The figures: lines, hashed, and lines left out (unparsable, no image, unreadable)."""
    if not re.fullmatch(EVALSET_PATTERN, name):
        raise ValueError(f"an evaluation set's name matches {EVALSET_PATTERN}: {name!r}")
    pairs: list[tuple[str, str]] = []
    hashes: dict[str, list[str]] = {}
    figures = Counter({"lines": 0, "hashed": 0, "left_out": 0})
    for raw in items.splitlines():
        if not raw.strip():
            continue
        figures["lines"] += 1
        try:
            rec = json.loads(raw)
            path = pool_image_path(rec["image"])
            question = str(rec.get("question") or "")
        except (ValueError, KeyError, TypeError, AttributeError):
            path = None
        if path is not None and path not in hashes:
            hashes[path] = _reference_hashes(image_bytes(path))
        found = hashes.get(path, []) if path is not None else []
        if not found:
            figures["left_out"] += 1
            continue
        figures["hashed"] += 1
        pairs += [(h, question_key(question)) for h in found]
    return EvalSet(name, sorted(set(pairs))), dict(figures)


def _reference_hashes(data: bytes | None) -> list[str]:
    if data is None:
        return []
    try:
        found = reference_hashes(data, max_pixels=PHASH_MAX_PIXELS)
    except ValueError:
        return []
    return [hash_hex(h) for h in found if informative(h)]
