"""Conversation pools (LLaVA / ShareGPT `conversations`, OpenAI / Cauldron-style `messages`)
in Parquet and in JSONL read to the same items as a folder pool; a multi-turn row gives one
item per pair; rows rsieve cannot honour (two images, no image, a question holding another
medium) end as `unsupported` lines that the cleaner quarantines with their reason."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rsieve.adapters.pools import PoolFiles, pool_format, read_pool
from rsieve.clean.cleaning import clean_line, parse_line
from rsieve.run.shards import PoolLine, split_pool
from rsieve.schemas import QUARANTINE_REASONS, ImageRef, Quarantined


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


IMAGES = {"red.png": _png("red"), "blue.png": _png("blue"), "green.png": _png("green")}
ITEMS: list[dict[str, Any]] = [
    {
        "id": "w1",
        "family": "SynthWords",
        "image": "red.png",
        "question": "What word?",
        "answer": "RED",
    },
    {
        "id": "w2",
        "family": "SynthWords",
        "image": "blue.png",
        "question": "Read it.",
        "answer": "BLUE",
    },
    {
        "id": "c1",
        "family": "MMBench",
        "image": "green.png",
        "question": "Colour? (a) red (b) green",
        "answer": "b",
        "options": {"a": "red", "b": "green"},
    },
]


def _lines(pool: PoolFiles) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in pool.items.splitlines()]


def _same(pool: PoolFiles) -> list[tuple[Any, ...]]:
    out = []
    for rec in _lines(pool):
        sha = hashlib.sha256(pool.read(rec["image"])).hexdigest()
        out.append(
            (rec["id"], rec["family"], sha, rec["question"], rec["answer"], rec.get("options"))
        )
    return out


def _folder(root: Path) -> Path:
    root.mkdir(parents=True)
    for name, data in IMAGES.items():
        (root / name).write_bytes(data)
    (root / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    return root


def _llava_parquet(root: Path, rows: list[dict[str, Any]]) -> Path:
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "data" / "train-00000-of-00001.parquet")
    return root


def _llava_row(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": item["id"],
        "family": item["family"],
        "image": {"bytes": IMAGES[item["image"]], "path": item["image"]},
        "conversations": [
            {"from": "human", "value": "<image>\n" + item["question"]},
            {"from": "gpt", "value": item["answer"]},
        ],
        "options": item.get("options"),
    }


def _messages_row(item: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": item["id"],
        "family": item["family"],
        "images": [f"imgs/{item['image']}"],
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": item["question"]}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": item["answer"]}]},
        ],
    }
    if "options" in item:
        row["options"] = item["options"]
    return row


def _messages_jsonl(root: Path, rows: list[dict[str, Any]]) -> Path:
    (root / "imgs").mkdir(parents=True)
    for name, data in IMAGES.items():
        (root / "imgs" / name).write_bytes(data)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_folder_llava_parquet_and_messages_jsonl_read_to_the_same_items(tmp_path: Path) -> None:
    expected = _same(read_pool(_folder(tmp_path / "folder")))
    assert len(expected) == 3 and expected[2][5] == {"a": "red", "b": "green"}

    hf = _llava_parquet(tmp_path / "hf", [_llava_row(i) for i in ITEMS])
    assert pool_format(hf) == "conversations"
    parquet = read_pool(hf)
    assert parquet.format == "conversations" and _same(parquet) == expected
    assert _lines(parquet)[0]["source"] == {
        "dataset": "data/train-00000-of-00001.parquet",
        "row": 0,
        "format": "llava",
    }
    assert all(name.startswith("images/") for name in parquet.files)  # embedded bytes

    sharegpt = _messages_jsonl(tmp_path / "jsonl", [_messages_row(i) for i in ITEMS])
    assert pool_format(sharegpt) == "conversations"
    messages = read_pool(sharegpt)
    assert _same(messages) == expected
    assert _lines(messages)[1]["source"] == {
        "dataset": "train.jsonl",
        "row": 1,
        "format": "messages",
    }
    assert sorted(messages.files) == ["imgs/blue.png", "imgs/green.png", "imgs/red.png"]


def test_a_plain_parquet_is_still_read_as_rows_of_the_contract(tmp_path: Path) -> None:
    rows = [i | {"image": {"bytes": IMAGES[i["image"]], "path": i["image"]}} for i in ITEMS]
    hf = _llava_parquet(tmp_path / "hf", rows)
    assert pool_format(hf) == "parquet" and read_pool(hf).format == "parquet"


def test_a_json_list_of_llava_rows_with_family_argument_and_own_source(tmp_path: Path) -> None:
    root = tmp_path / "llava"
    (root / "coco").mkdir(parents=True)
    (root / "coco" / "1.png").write_bytes(IMAGES["red.png"])
    rows = [
        {
            "image": "coco/1.png",
            "source": "coco",
            "conversations": [
                {"from": "user", "value": "What colour?\n<image>"},
                {"from": "assistant", "value": "red"},
            ],
        }
    ]
    (root / "llava_mix.json").write_text(json.dumps(rows))
    [item] = _lines(read_pool(root, family="VQAv2"))
    assert item == {
        "id": "llava_mix-0",
        "family": "VQAv2",
        "image": "coco/1.png",
        "question": "What colour?",
        "answer": "red",
        "source": {"dataset": "llava_mix.json", "row": 0, "format": "llava", "tag": "coco"},
    }


def test_a_multi_turn_row_gives_one_item_per_pair(tmp_path: Path) -> None:
    row = _llava_row(ITEMS[0]) | {
        "conversations": [
            {"from": "human", "value": "<image>\nWhat word?"},
            {"from": "gpt", "value": "RED"},
            {"from": "human", "value": "How many letters?"},
            {"from": "gpt", "value": "3"},
            {"from": "human", "value": "Which colour is it written in?"},
            {"from": "gpt", "value": "white"},
        ]
    }
    items = _lines(read_pool(_llava_parquet(tmp_path, [row])))
    assert [(i["id"], i["question"], i["answer"]) for i in items] == [
        ("w1", "What word?", "RED"),
        ("w1-1", "How many letters?", "3"),
        ("w1-2", "Which colour is it written in?", "white"),
    ]
    assert len({i["image"] for i in items}) == 1


def _clean(pool: PoolFiles) -> list[Any]:
    """Every line of the pool through the clean stage's rule (as tests/unit/test_stage_rules
    calls it), with the pool's images."""
    by_sha = {hashlib.sha256(pool.read(n)).hexdigest(): pool.read(n) for n in pool.files}
    shards, _ = split_pool(pool.items, shard_size=100)
    out = []
    for pl in shards[0]:
        image = None
        rec = json.loads(pl.raw)
        if "image" in rec:
            sha = hashlib.sha256(pool.read(rec["image"])).hexdigest()
            image = ImageRef(sha256=sha, pack="pools/p/_packs/00000.pack", offset=0, length=1)
        out.append(
            clean_line(
                PoolLine(line=pl.line, raw=pl.raw, utf8=True, image=image),
                by_sha,
                pool_uri="s3://b/pools/p/",
                text_max_chars=4000,
                max_pixels=10**8,
                max_bytes=10**8,
                policy="lenient",
                purity_threshold=0.5,
                provenance=lambda source, sha: (True, "recorded"),
            )
        )
    return out


def test_rows_rsieve_cannot_honour_are_quarantined_with_their_reason(tmp_path: Path) -> None:
    two_images = _messages_row(ITEMS[0]) | {
        "id": "two",
        "images": ["imgs/red.png", "imgs/blue.png"],
    }
    no_image = _messages_row(ITEMS[1]) | {"id": "none", "images": []}
    video = _messages_row(ITEMS[2]) | {
        "id": "video",
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And?"}]},
            {"role": "assistant", "content": "B"},
        ],
    }
    root = _messages_jsonl(tmp_path, [_messages_row(ITEMS[0]), two_images, no_image, video])
    with (root / "train.jsonl").open("a") as f:
        f.write("{not json\n")
    pool = read_pool(root)
    lines = _lines(pool)
    assert [(i["id"], i.get("unsupported")) for i in lines] == [
        ("w1", None),
        ("two", "multi_image"),
        ("none", "no_image"),
        ("video", None),
        ("video-1", "unsupported_turn"),
        ("train-4", "invalid_json"),
    ]
    assert lines[1]["family"] == "SynthWords" and lines[1]["source"]["row"] == 1
    assert "image" not in lines[1] and "imgs/blue.png" not in pool.files  # never uploaded

    results = _clean(pool)
    reasons = [(r.id, r.reason) for r in results if isinstance(r, Quarantined)]
    assert reasons == [
        ("two", "multi_image"),
        ("none", "no_image"),
        ("video-1", "unsupported_turn"),
        ("train-4", "invalid_json"),
    ]
    assert [r.id for r in results if not isinstance(r, Quarantined)] == ["w1", "video"]
    assert all(reason in QUARANTINE_REASONS for _, reason in reasons)
    assert results[1].family == "SynthWords" and results[1].detail == "2 images"


def test_an_unknown_unsupported_reason_is_an_invalid_item() -> None:
    raw = json.dumps({"id": "x", "family": "F", "unsupported": "hologram"}).encode()
    q = parse_line(raw, 1, text_max_chars=100)
    assert isinstance(q, Quarantined) and (q.reason, q.id) == ("invalid_item", "x")


def test_a_row_image_that_is_a_link_leaving_the_pool_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(IMAGES["red.png"])
    root = _messages_jsonl(tmp_path / "pool", [_messages_row(ITEMS[0])])
    (root / "imgs" / "red.png").unlink()
    (root / "imgs" / "red.png").symlink_to(secret)
    pool = read_pool(root)
    assert pool.refused == {"imgs/red.png": "symbolic link to a file outside the pool folder"}
    assert "imgs/red.png" not in pool.files


@pytest.mark.parametrize("image_max_bytes", [None, 1024 * 1024])
def test_a_conversation_parquet_uploads(tmp_path: Path, image_max_bytes: int | None) -> None:
    from rsieve.adapters.pools import upload_pool
    from tests.fakes import MemoryStore

    hf = _llava_parquet(tmp_path / "hf", [_llava_row(i) for i in ITEMS])
    store = MemoryStore()
    uri = upload_pool(store, hf, image_max_bytes=image_max_bytes)
    prefix = uri.split("/", 3)[3]
    assert store.get(prefix + "items.jsonl") == read_pool(hf).items
    index = json.loads(store.get(prefix + "_packs/index.json"))
    assert len(index["images"]) == 3
    assert store.exists(prefix + "_complete") and not store.exists(prefix + "_refused.json")
    assert upload_pool(store, hf, image_max_bytes=image_max_bytes) == uri  # same digest


def test_messages_parquet_with_an_images_list_and_a_located_source(tmp_path: Path) -> None:
    """Cauldron-style rows in Parquet: `images` a list of HF Image structs, `content` a
    string; a row's own source naming a location keeps it (provenance checks it) and the
    file is recorded as `file`, not `dataset`."""
    from rsieve.clean.provenance import parse_source

    rows = [
        {
            "images": [{"bytes": IMAGES["red.png"], "path": None}],
            "messages": [
                {"role": "user", "content": "<image>What word?"},
                {"role": "assistant", "content": "RED"},
            ],
            "source": json.dumps({"url": "s3://bucket/red.png"}),
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "cauldron.parquet")
    pool = read_pool(tmp_path, family="SynthWords")
    [item] = _lines(pool)
    assert (item["id"], item["question"], item["answer"]) == ("cauldron-0", "What word?", "RED")
    assert pool.read(item["image"]) == IMAGES["red.png"] and item["image"].endswith(".png")
    assert item["source"] == {
        "file": "cauldron.parquet",
        "row": 0,
        "format": "messages",
        "url": "s3://bucket/red.png",
    }
    assert parse_source(item["source"]).kind == "s3"


def test_a_row_file_that_is_a_link_leaving_the_pool_is_not_read(tmp_path: Path) -> None:
    outside = _messages_jsonl(tmp_path / "outside", [_messages_row(ITEMS[0])])
    root = _messages_jsonl(tmp_path / "pool", [_messages_row(ITEMS[1])])
    (root / "stolen.jsonl").symlink_to(outside / "train.jsonl")
    assert [i["id"] for i in _lines(read_pool(root))] == ["w2"]
