"""Pool formats: a folder pool, the same pool as Parquet (HF `Image()` column) and as
InfinityMM records read to the same items; symbolic links leaving the pool are refused."""

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


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


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
        "image": "red.png",
        "question": "Colour? (a) red (b) blue",
        "answer": "a",
    },
]
IMAGES = {"red.png": _png("red"), "blue.png": _png("blue")}


def _same(pool: PoolFiles) -> list[tuple[Any, ...]]:
    out = []
    for raw in pool.items.splitlines():
        rec = json.loads(raw)
        sha = hashlib.sha256(pool.read(rec["image"])).hexdigest()
        out.append((rec["id"], rec["family"], rec["question"], rec["answer"], sha))
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "folder"
    root.mkdir()
    for name, data in IMAGES.items():
        (root / name).write_bytes(data)
    (root / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    return root


def test_parquet_and_infinitymm_read_to_the_folder_items(folder: Path, tmp_path: Path) -> None:
    expected = _same(read_pool(folder))
    assert len(expected) == 3
    hf = tmp_path / "hf" / "data"
    hf.mkdir(parents=True)
    table = pa.table(
        {
            "id": [i["id"] for i in ITEMS],
            "family": [i["family"] for i in ITEMS],
            "image": [{"bytes": IMAGES[i["image"]], "path": i["image"]} for i in ITEMS],
            "question": [i["question"] for i in ITEMS],
            "answer": [i["answer"] for i in ITEMS],
        }
    )
    pq.write_table(table, hf / "train-00000-of-00001.parquet")
    parquet = read_pool(tmp_path / "hf")
    assert parquet.format == "parquet" and _same(parquet) == expected
    assert json.loads(parquet.items.splitlines()[0])["source"] == {
        "dataset": "data/train-00000-of-00001.parquet",
        "row": 0,
    }
    imm = tmp_path / "imm"
    for item in ITEMS:
        sub = imm / item["family"].lower()
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{item['id']}.png").write_bytes(IMAGES[item["image"]])
        (sub / f"{item['id']}.json").write_text(
            json.dumps(
                {
                    "id": item["id"],
                    "source": "llava",
                    "family": item["family"],
                    "image": f"{item['family'].lower()}/{item['id']}.png",
                    "phash": "ab",
                    "conversations": [
                        {"from": "human", "value": "<image>\n" + item["question"]},
                        {"from": "gpt", "value": item["answer"]},
                    ],
                }
            )
        )
    infinity = read_pool(imm)
    assert infinity.format == "infinitymm"
    assert sorted(_same(infinity)) == sorted(expected)
    assert json.loads(infinity.items.splitlines()[0])["source"]["tag"] == "llava"


def test_infinitymm_multi_turn_and_family_from_tag(tmp_path: Path) -> None:
    (tmp_path / "ocr").mkdir()
    (tmp_path / "ocr" / "7.jpg").write_bytes(IMAGES["red.png"])
    (tmp_path / "ocr" / "7.json").write_text(
        json.dumps(
            {
                "id": 7,
                "source": "textocr",
                "image": "7.jpg",
                "conversations": [
                    {"from": "human", "value": "<image>\nRead it."},
                    {"from": "gpt", "value": "RED"},
                    {"from": "human", "value": "And again?"},
                    {"from": "gpt", "value": "RED"},
                ],
            }
        )
    )
    items = [json.loads(x) for x in read_pool(tmp_path).items.splitlines()]
    assert [(i["id"], i["family"], i["image"]) for i in items] == [
        ("7", "textocr", "ocr/7.jpg"),
        ("7-1", "textocr", "ocr/7.jpg"),
    ]


def test_symlink_leaving_the_pool_is_refused(folder: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(IMAGES["red.png"])
    (folder / "inner.png").symlink_to(folder / "red.png")
    (folder / "outer.png").symlink_to(secret)
    lines = [
        *ITEMS,
        ITEMS[0] | {"id": "in", "image": "inner.png"},
        ITEMS[0] | {"id": "out", "image": "outer.png"},
    ]
    (folder / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in lines))
    pool = read_pool(folder)
    assert "inner.png" in pool.files and "outer.png" not in pool.files
    assert pool.refused == {"outer.png": "symbolic link to a file outside the pool folder"}


def test_not_a_pool(tmp_path: Path) -> None:
    from rsieve.errors import PermanentError

    with pytest.raises(PermanentError):
        pool_format(tmp_path)


def test_an_image_over_the_byte_limit_is_refused_by_its_size_unread(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upload_pool(image_max_bytes=...): the file goes to `_refused.json`, never into a
    pack, and its bytes are never read; the cleaner quarantines its line image_too_large."""
    from rsieve.adapters.pools import upload_pool
    from rsieve.clean.cleaning import upload_refusal
    from tests.fakes import MemoryStore

    with (folder / "huge.png").open("wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB by size, nothing on disk
    lines = [*ITEMS, ITEMS[0] | {"id": "huge", "image": "huge.png"}]
    (folder / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in lines))
    read = Path.read_bytes

    def guarded(path: Path) -> bytes:
        assert path.name != "huge.png", "an image over the limit was read"
        return read(path)

    monkeypatch.setattr(Path, "read_bytes", guarded)
    store = MemoryStore()
    uri = upload_pool(store, folder, image_max_bytes=1024 * 1024)
    prefix = uri.split("/", 3)[3]
    refused = json.loads(store.get(prefix + "_refused.json"))
    assert refused == {
        "huge.png": {
            "reason": "image_too_large",
            "detail": f"{64 * 1024 * 1024} bytes > {1024 * 1024} (not uploaded)",
        }
    }
    index = json.loads(store.get(prefix + "_packs/index.json"))
    assert sorted(index["images"]) == ["blue.png", "red.png"]
    assert upload_refusal(refused["huge.png"])[0] == "image_too_large"
    assert upload_refusal("symbolic link")[0] == "image_symlink"  # pools uploaded before

    # Under the limit, the same folder uploads every image.
    monkeypatch.setattr(Path, "read_bytes", read)
    (folder / "huge.png").write_bytes(IMAGES["red.png"] + b"\0")
    other = upload_pool(store, folder, image_max_bytes=1024 * 1024)
    assert other != uri and not store.exists(other.split("/", 3)[3] + "_refused.json")
