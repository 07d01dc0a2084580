"""Bad input through the real stack: every kind is quarantined by the cleaner with its own
reason and pool line, duplicates are kept once, flattened multiple choice is re-rendered,
cleaning.json is written, and the run goes on to a report that adds up."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import pool_files, upload_pool
from rsieve.adapters.storage import S3Store
from rsieve_cli.client import submit, wait_for_run
from tests.conftest import stack_settings


def _png(color: str = "white") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), color).save(buf, format="PNG")
    return buf.getvalue()


def _bomb_png(width: int = 60000, height: int = 60000) -> bytes:
    """A valid PNG header that claims width x height, with almost no data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
    chunk += struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _pool(root: Path) -> tuple[Path, dict[int, tuple[str | None, str]]]:
    pool = root / "bad-pool"
    pool.mkdir()
    good = _png()
    (pool / "good.png").write_bytes(good)
    (pool / "empty.png").write_bytes(b"")
    (pool / "bomb.png").write_bytes(_bomb_png())
    noisy = io.BytesIO()
    Image.frombytes("L", (64, 64), hashlib.sha256(b"n").digest() * 128).save(noisy, "PNG")
    (pool / "trunc.png").write_bytes(noisy.getvalue()[: len(noisy.getvalue()) // 2])
    (root / "secret.png").write_bytes(good)
    (pool / "escape.png").symlink_to(root / "secret.png")
    sha = hashlib.sha256(good).hexdigest()

    def rec(i: str, **kw: Any) -> str:
        base = {
            "id": i,
            "family": "SynthWords",
            "image": "good.png",
            "question": "What word is shown?",
            "answer": "x",
            "source": {"sha256": sha},
        }
        return json.dumps({k: v for k, v in (base | kw).items() if v is not None})

    lines = [
        rec("ok"),  # 1 -> past the cleaner
        rec("dup"),  # 2 same image + question
        "{not json",  # 3
        rec("noq", question=None),  # 4 missing field
        rec("typed", answer=7),  # 5 mistyped field
        rec("blank", question="   "),  # 6
        rec("fam", family="NoSuchFamily"),  # 7
        rec("gone", image="missing.png"),  # 8
        rec("out", image="../secret.png"),  # 9
        rec("link", image="escape.png"),  # 10
        rec("zero", image="empty.png", source={"path": "x"}),  # 11
        rec("bomb", image="bomb.png", source={"path": "x"}),  # 12
        rec("trunc", image="trunc.png", source={"path": "x"}),  # 13
        rec("long", question="q" * 20000),  # 14
        rec("prov", source={"sha256": "0" * 64}),  # 15
        rec("mc", family="MMBench", question="Which? Options: A cat, B dog", answer="dog"),
    ]
    (pool / "items.jsonl").write_bytes("\n".join(lines).encode() + b"\n\xff\xfe bad\n")
    expected = {
        2: ("dup", "duplicate_item"),
        3: (None, "invalid_json"),
        4: ("noq", "invalid_item"),
        5: ("typed", "invalid_item"),
        6: ("blank", "empty_question"),
        7: ("fam", "unknown_protocol"),
        8: ("gone", "missing_image"),
        9: ("out", "image_outside_pool"),
        10: ("link", "image_symlink"),
        11: ("zero", "unreadable_image"),
        12: ("bomb", "image_too_large"),
        13: ("trunc", "unreadable_image"),
        14: ("long", "text_too_long"),
        15: ("prov", "provenance"),
        17: (None, "invalid_utf8"),
    }
    return pool, expected


@pytest.fixture(scope="module")
def result(
    start_stack: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[int, tuple[str | None, str]], Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("clean")
    pool, expected = _pool(root)
    replay = root / "replay.json"
    replay.write_text("{}")
    stack = start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "5",
            "RSIEVE_MODEL_RETRIES": "0",
        },
    )
    settings = stack_settings(stack)
    store = S3Store(settings)
    run = submit(settings, upload_pool(store, pool), "clean-test")
    wait_for_run(settings, run, timeout=300)
    cleaning = json.loads(store.get(f"runs/{run}/cleaning.json"))
    clean_items = [
        i
        for n in range(4)
        for i in json.loads(store.get(f"runs/{run}/clean/{n:05d}.json"))["items"]
    ]
    # The same pool as another tool would write it: each file its own object, no packs,
    # no _refused.json (the symbolic link is simply not there). Ingest packs it.
    for name in pool_files(pool):
        store.put(f"by-hand/{name}", (pool / name).read_bytes())
    store.put("by-hand/_complete", b"written by hand")
    manual = submit(settings, f"s3://{store.bucket}/by-hand/", "clean-by-hand")
    wait_for_run(settings, manual, timeout=300)
    by_hand = export_dataset(store, "clean-by-hand", root / "out-by-hand")
    # More images than ingest fetches at once (64), each a different one.
    lines = []
    for n in range(150):
        store.put(f"by-hand-big/{n}.png", _png(f"#{n:06x}"))
        lines.append(
            json.dumps(
                {
                    "id": f"big-{n}",
                    "family": "SynthWords",
                    "image": f"{n}.png",
                    "question": "What is shown?",
                    "answer": "x",
                    "source": {"dataset": "by-hand"},
                }
            )
        )
    store.put("by-hand-big/items.jsonl", ("\n".join(lines) + "\n").encode())
    store.put("by-hand-big/_complete", b"written by hand")
    big = submit(settings, f"s3://{store.bucket}/by-hand-big/", "clean-by-hand-big")
    wait_for_run(settings, big, timeout=300)
    return (
        expected,
        export_dataset(store, "clean-test", root / "out"),
        {
            "cleaning": cleaning,
            "items": clean_items,
            "by_hand": by_hand,
            "by_hand_index": json.loads(store.get("by-hand/_packs/index.json")),
            "big_index": json.loads(store.get("by-hand-big/_packs/index.json")),
            "big_quarantine": [
                q
                for key in store.list(f"runs/{big}/clean/")
                for q in json.loads(store.get(key))["quarantined"]
            ],
        },
    )


def test_each_bad_item_has_its_reason_and_line(result: Any) -> None:
    expected, path, _ = result
    quarantine = [json.loads(x) for x in (path / "quarantine.jsonl").read_text().splitlines()]
    cleaner = {q["line"]: (q["id"], q["reason"]) for q in quarantine if q["stage"] == "clean"}
    assert cleaner == expected
    report = json.loads((path / "run_report.json").read_text())
    assert report["adds_up"] is True and report["lines"] == 17


def test_good_items_pass_and_multiple_choice_is_normalised(result: Any) -> None:
    _, _, stored = result
    items = {i["id"]: i for i in stored["items"]}
    assert set(items) == {"ok", "mc"}
    mc = items["mc"]
    assert mc["question"].startswith("Which?\nA. cat\nB. dog\n") and mc["references"] == ["B"]
    assert mc["clean_meta"]["mcq"]["original_answer"] == "dog"
    fams = stored["cleaning"]["families"]
    assert fams["SynthWords"]["duplicate_items"] == 1 and fams["MMBench"]["mcq"] == {
        "normalised": 1
    }
    assert stored["cleaning"]["files_refused"] == {
        "escape.png": "symbolic link to a file outside the pool folder"
    }


def test_a_pool_without_packs_is_packed_at_ingest(result: Any) -> None:
    expected, _, stored = result
    quarantine = [
        json.loads(x) for x in (stored["by_hand"] / "quarantine.jsonl").read_text().splitlines()
    ]
    cleaner = {q["line"]: (q["id"], q["reason"]) for q in quarantine if q["stage"] == "clean"}
    # Every line ends as with the packed upload, but the link nobody uploaded is missing.
    assert {
        line: (item, "missing_image" if reason == "image_symlink" else reason)
        for line, (item, reason) in expected.items()
    } == cleaner
    report = json.loads((stored["by_hand"] / "run_report.json").read_text())
    assert report["adds_up"] is True and report["lines"] == 17
    images = stored["by_hand_index"]["images"]
    assert images and all(ref["pack"].startswith("by-hand/_packs/") for ref in images.values())
    assert len(stored["big_index"]["images"]) == 150
    assert not [q for q in stored["big_quarantine"] if q["reason"] == "missing_image"]
