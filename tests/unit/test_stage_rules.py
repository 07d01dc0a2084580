"""The rules the stage tasks call (rsieve.clean.cleaning.clean_line, rsieve.generate.generation,
rsieve.dataset.commit), each on its own: what a line, a reply or a run turns into."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from rsieve.clean.cleaning import clean_line, line_image_path, poisoned_line
from rsieve.clean.ingestion import LineRef, LineRule, LineVerdict, PoolRange, apply_range
from rsieve.dataset.commit import human_review, split_families
from rsieve.generate.generation import (
    ModelInfo,
    ModelReply,
    image_quarantine,
    ready_items,
    record_generations,
)
from rsieve.images import ImageError, prepare_image
from rsieve.run.shards import PoolLine
from rsieve.schemas import ImageRef, Item, Quarantined
from tests.unit._records import make_item

PNG = (
    Path(__file__).resolve().parents[2] / "examples" / "pool" / "synthamounts_0000.png"
).read_bytes()
SHA = hashlib.sha256(PNG).hexdigest()
REF = ImageRef(sha256=SHA, pack="pools/p/_packs/00000.pack", offset=0, length=len(PNG))
GOOD = {
    "id": "w-1",
    "family": "SynthWords",
    "image": "images/w1.png",
    "question": "What word is shown?",
    "answer": "COFFEE",
    "source": {"sha256": SHA},
}


def pool_line(raw: dict[str, Any] | str, **changes: Any) -> PoolLine:
    text = raw if isinstance(raw, str) else json.dumps(raw)
    return PoolLine(line=3, raw=text, utf8=True, image=REF, **changes)


def clean(pl: PoolLine, images: dict[str, bytes] | None = None, admit: bool = True) -> Any:
    return clean_line(
        pl,
        {SHA: PNG} if images is None else images,
        pool_uri="s3://b/pools/p/",
        text_max_chars=4000,
        max_pixels=10**8,
        max_bytes=10**8,
        policy="strict",
        purity_threshold=0.5,
        provenance=lambda source, sha: (admit, "sha256_match" if admit else "no"),
    )


def reason(result: Any) -> str:
    assert isinstance(result, Quarantined), result
    return result.reason


def test_a_good_line_is_an_item_that_knows_where_its_image_lies() -> None:
    item = clean(pool_line(GOOD))
    assert isinstance(item, Item)
    assert item.image_sha256 == SHA and item.image_at == REF and item.line == 3
    assert item.clean_meta["provenance"] == "sha256_match"


@pytest.mark.parametrize(
    ("pl", "images", "expected"),
    [
        (PoolLine(line=3, raw="\\xff", utf8=False), None, "invalid_utf8"),
        (pool_line(GOOD, duplicate_of=1), None, "duplicate_id"),
        (pool_line(GOOD | {"image": "../outside.png"}), None, "image_outside_pool"),
        (pool_line(GOOD), {}, "missing_image"),
        (pool_line(GOOD), {SHA: b"not an image"}, "unreadable_image"),
        (pool_line(GOOD, verdict=("off_task", "rule")), None, "off_task"),
        (pool_line(GOOD, verdict=("image_symlink", "refused")), None, "image_symlink"),
        (pool_line(GOOD, verdict=("image_too_large", "at upload")), None, "image_too_large"),
    ],
)
def test_the_first_failing_check_names_the_reason(
    pl: PoolLine, images: dict[str, bytes] | None, expected: str
) -> None:
    assert reason(clean(pl, images)) == expected


def test_bytes_that_differ_from_the_pack_index_are_quarantined() -> None:
    other = PNG + b"\0"  # still a PNG, another sha256
    result = clean(pool_line(GOOD), {SHA: other})
    assert reason(result) == "image_digest_mismatch" and SHA in result.detail


def test_provenance_refused_is_the_items_reason() -> None:
    assert reason(clean(pool_line(GOOD), admit=False)) == "provenance"


def test_a_line_that_kills_its_worker_is_quarantined_with_what_it_names() -> None:
    q = poisoned_line(pool_line(GOOD))
    assert (q.id, q.family, q.reason, q.stage) == ("w-1", "SynthWords", "max_deliveries", "clean")
    assert poisoned_line(pool_line("{not json")).id is None
    assert line_image_path(pool_line(GOOD)) == "images/w1.png"
    assert line_image_path(pool_line("[1, 2]")) is None


def test_shard_inputs_carry_the_whole_pool_verdicts_and_image_refs() -> None:
    lines = [
        PoolLine(line=3, raw=json.dumps(GOOD), utf8=True),
        PoolLine(line=4, raw=json.dumps(GOOD | {"id": "w-2"}), utf8=True),
    ]
    (shard,) = apply_range(
        "run-1",
        PoolRange(start=0, end=100, first_line=3, first_shard=0, lines=2),
        lines,
        shard_size=2,
        duplicate_ids=[],
        refs=[LineRef(line=3, ref=REF), LineRef(line=4, ref=REF)],
        verdicts=[LineVerdict(line=4, reason="duplicate_item", detail="line 3")],
        rules=[LineRule(line=3, rule="r")],
    )
    assert shard.shard == "00000" and shard.run == "run-1"
    assert [pl.verdict for pl in shard.lines] == [None, ("duplicate_item", "line 3")]
    assert [pl.purity for pl in shard.lines] == ["r", None]
    assert all(pl.image == REF for pl in shard.lines)


def test_items_without_a_usable_image_never_reach_the_model() -> None:
    good, missing, big = (make_item(f"i{k}", line=k, image=f"img{k}") for k in range(3))
    prepared = prepare_image(PNG, max_side=4096, max_pixels=10**8)
    too_large = ImageError("9x9 exceeds 1 pixels", "image_too_large")
    ready, quarantined = ready_items(
        [good, missing, big], {good.image_sha256: prepared, big.image_sha256: too_large}
    )
    assert [i.id for i, _ in ready] == ["i0"]
    assert [(q.id, q.reason) for q in quarantined] == [
        ("i1", "missing_image"),
        ("i2", "image_too_large"),
    ]
    assert image_quarantine(good, ImageError("cannot decode")).reason == "unreadable_image"


def test_each_reply_becomes_a_generation_or_a_quarantine() -> None:
    items = [make_item(f"i{k}", line=k) for k in range(3)]
    image = prepare_image(PNG, max_side=4096, max_pixels=10**8)
    guarded = Quarantined(
        id="i2", line=2, family="SynthWords", stage="generate", reason="max_deliveries"
    )
    info = ModelInfo(name="vlm", version="7", interface="vllm", thinking_mode="opens")
    sent = "What word is shown?\u2060"  # neutralised on the way
    replies: list[ModelReply | Quarantined | Exception] = [
        ModelReply(text="<think>C-O-F</think>COFFEE", finish_reason="stop", user_text=sent),
        RuntimeError("the model failed this one"),
        guarded,
    ]
    generations, quarantined = record_generations([(i, image) for i in items], replies, info)
    (g,) = generations
    assert (g.answer, g.reasoning, g.model_version, g.thinking_mode) == (
        "COFFEE",
        "C-O-F",
        "7",
        "opens",
    )
    assert g.item.question == sent and g.image_sent_sha256 == image.sha256
    assert [(q.id, q.reason) for q in quarantined] == [
        ("i1", "model_error"),
        ("i2", "max_deliveries"),
    ]
    assert "failed this one" in quarantined[0].detail
    with pytest.raises(ValueError, match="without the model's info"):
        record_generations([(items[0], image)], replies[:1], None)


def test_human_review_counts_per_family() -> None:
    counts, md = human_review(
        [
            {"family": "A", "verdict": "confirmed"},
            {"family": "A", "verdict": "wrong"},
            {"family": None, "verdict": "confirmed"},
            {"family": "A", "verdict": "maybe"},
        ]
    )
    assert counts == {"A": {"confirmed": 1, "wrong": 1}, "(unknown)": {"confirmed": 1, "wrong": 0}}
    assert "| A | 1 | 1 |" in md
    assert human_review([]) == ({}, "\n\nNo judge promotion has been reviewed by a person yet.")


def test_split_families_names_each_split_family_even_from_earlier_runs() -> None:
    manifest = {"splits": ["SynthWords_RS_think", "SynthWords_rejected", "Old_Family_RS_nothink"]}
    assert split_families(manifest, {"SynthWords"}) == {
        "SynthWords_RS_think": "SynthWords",
        "SynthWords_rejected": "SynthWords",
        "Old_Family_RS_nothink": "Old_Family",
    }
