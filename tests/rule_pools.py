"""The pools of the rule-level tests, built once for both tiers: the FakeStack's
(tests/unit/test_*_fakestack.py: every rule, exactly) and the real stack's
(tests/e2e/test_capabilities.py: one run per capability, proving the wiring). Moved here
from tests/e2e/test_clean_pool.py, test_pool_semantics.py, test_decontamination.py and
test_compaction.py (docs/testing.md, what moved)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageEnhance

from rsieve.clean.prompts import build_question
from rsieve_cli.local.replay import replay_key
from tests.e2e.pools import picture, word_pool

# --- cleaning: every kind of bad input (was tests/e2e/test_clean_pool.py) -------------------


def plain_png(color: str = "white") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), color).save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int = 60000, height: int = 60000) -> bytes:
    """A valid PNG header that claims width x height, with almost no data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
    chunk += struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00\x00\x00\x00IEND\xaeB`\x82"


# The bad pool's lines: 17 (16 records and a line of invalid UTF-8).
BAD_POOL_LINES = 17


def bad_pool(root: Path) -> tuple[Path, dict[int, tuple[str | None, str]]]:
    """A pool with one line of each kind the cleaner quarantines; its line -> (id, reason)
    for the cleaner (lines 1 "ok" and 16 "mc", multiple choice, go on)."""
    pool = root / "bad-pool"
    pool.mkdir()
    good = plain_png()
    (pool / "good.png").write_bytes(good)
    (pool / "empty.png").write_bytes(b"")
    (pool / "bomb.png").write_bytes(bomb_png())
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


def big_pool_objects(count: int = 150) -> dict[str, bytes]:
    """A pool written by hand as objects (no packs): more images than ingest fetches at
    once (64), each a different one."""
    objects, lines = {}, []
    for n in range(count):
        objects[f"{n}.png"] = plain_png(f"#{n:06x}")
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
    objects["items.jsonl"] = ("\n".join(lines) + "\n").encode()
    objects["_complete"] = b"written by hand"
    return objects


# --- pool semantics: purity by origin, conversation formats (was test_pool_semantics.py) ----

SIGNS = ["OPEN", "EXIT", "STOP", "SALE", "PUSH", "PULL", "BANK", "CAFE"]
GENUINE_QUESTIONS = [
    "What is written on the sign?",
    "What word does the sign show?",
    "What does the text on the sign say?",
]
FOREIGN_QUESTIONS = ["What color is the sign?", "Is it daytime?"]


def sign_png(text: str) -> bytes:
    buf = io.BytesIO()
    picture(text, (96, 32), text, blocks=6).save(buf, format="PNG")
    return buf.getvalue()


def textvqa_slice(pool: Path) -> tuple[Path, set[str], set[str]]:
    """The dataset card's case: an image-matched slice put general-VQA questions (source
    vqav2) into TextVQA beside its own items (source textvqa), on the same images. The
    pool, the genuine items' ids and the foreign ones'."""
    pool.mkdir()
    lines, genuine, foreign = [], set(), set()
    for n, word in enumerate(SIGNS):
        data = sign_png(word)
        (pool / f"sign{n}.png").write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        for k, question in enumerate(GENUINE_QUESTIONS):
            item_id = f"tv-{n}-{k}"
            genuine.add(item_id)
            lines.append(
                {
                    "id": item_id,
                    "family": "TextVQA",
                    "image": f"sign{n}.png",
                    "question": question,
                    "answer": [word.lower()] * 10,
                    "source": {"dataset": "textvqa", "sha256": sha},
                }
            )
        if n % 2 == 0:
            item_id = f"vqa-{n}"
            foreign.add(item_id)
            lines.append(
                {
                    "id": item_id,
                    "family": "TextVQA",
                    "image": f"sign{n}.png",
                    "question": FOREIGN_QUESTIONS[n % 4 // 2],
                    "answer": ["white"] * 10,
                    "source": {"dataset": "vqav2", "sha256": sha},
                }
            )
    (pool / "items.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return pool, genuine, foreign


def conversation_pools(root: Path) -> dict[str, Path]:
    """The same three items as a folder pool, a LLaVA-style conversation Parquet and a
    ShareGPT-style conversation JSONL."""
    images = {f"w{n}.png": sign_png(word) for n, word in enumerate(SIGNS[:3])}
    rows: list[dict[str, Any]] = [
        {
            "id": f"w{n}",
            "family": "SynthWords",
            "image": f"w{n}.png",
            "question": f"Which word is shown? ({n})",
            "answer": word,
            "source": {
                "dataset": "signs",
                "sha256": hashlib.sha256(images[f"w{n}.png"]).hexdigest(),
            },
        }
        for n, word in enumerate(SIGNS[:3])
    ]
    folder = root / "folder"
    folder.mkdir()
    for name, data in images.items():
        (folder / name).write_bytes(data)
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    llava = root / "llava"
    llava.mkdir()
    table = pa.Table.from_pylist(
        [
            {
                "id": r["id"],
                "family": r["family"],
                "image": {"bytes": images[r["image"]], "path": r["image"]},
                "source": json.dumps(r["source"]),
                "conversations": [
                    {"from": "human", "value": "<image>\n" + r["question"]},
                    {"from": "gpt", "value": r["answer"]},
                ],
            }
            for r in rows
        ]
    )
    pq.write_table(table, llava / "train-00000.parquet")

    sharegpt = root / "sharegpt"
    (sharegpt / "img").mkdir(parents=True)
    for name, data in images.items():
        (sharegpt / "img" / name).write_bytes(data)
    (sharegpt / "data.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "id": r["id"],
                    "family": r["family"],
                    "images": [f"img/{r['image']}"],
                    "source": r["source"],
                    "messages": [
                        {"role": "system", "content": "You read signs."},
                        {
                            "role": "user",
                            "content": [{"type": "image"}, {"type": "text", "text": r["question"]}],
                        },
                        {"role": "assistant", "content": r["answer"]},
                    ],
                }
            )
            + "\n"
            for r in rows
        )
    )
    return {"folder": folder, "llava": llava, "sharegpt": sharegpt}


def conversation_items(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What must agree between the formats, per clean item."""
    return sorted(
        (i["id"], i["family"], i["pool_question"], tuple(i["references"]), i["image_sha256"])
        for i in items
    )


# --- decontamination: evaluation sets and overlapping runs (was test_decontamination.py) ----

COUNT = 24
PICTURE_QUESTION = "What is shown?"


def _picture(seed: int) -> Image.Image:
    return picture(seed, (240, 120), blocks=14)


def modified(img: Image.Image, n: int) -> bytes:
    """A copy as issue 19 describes: re-encoded, resized, lightly cropped, brightened."""
    w, h = img.size
    if n % 4 == 0:
        img = img.resize((int(w * 1.3), int(h * 1.3)))
    elif n % 4 == 1:
        img = img.crop((int(w * 0.03), int(h * 0.03), int(w * 0.97), int(h * 0.97)))
    elif n % 4 == 2:
        img = ImageEnhance.Brightness(img).enhance(1.1)
    else:
        img = img.resize((int(w * 0.75), int(h * 0.75)))
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=70 + 5 * (n % 4))
    return buf.getvalue()


def picture_pool(folder: Path, images: dict[str, bytes], tag: str) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for n, (name, data) in enumerate(sorted(images.items())):
        (folder / name).write_bytes(data)
        lines.append(
            json.dumps(
                {
                    "id": f"{tag}-{n}",
                    "family": "SynthWords",
                    "image": name,
                    "question": PICTURE_QUESTION,
                    "answer": "x",
                    "source": {"dataset": "pictures"},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def originals() -> dict[str, bytes]:
    out = {}
    for n in range(COUNT):
        buf = io.BytesIO()
        _picture(n).save(buf, format="PNG")
        out[f"p{n:02d}.png"] = buf.getvalue()
    return out


def copies() -> dict[str, bytes]:
    return {f"c{n:02d}.jpg": modified(_picture(n), n) for n in range(COUNT)}


def originals_replay() -> dict[str, dict[str, str]]:
    """The originals are answered (and accepted: they reach the dataset); anything else has
    no recorded answer, so its generation is one failed call."""
    prompt = build_question(PICTURE_QUESTION, "alnum")
    return {
        replay_key(prompt, data): {"text": "<think>a picture</think>x", "finish_reason": "stop"}
        for data in originals().values()
    }


# --- compaction: a dataset grown run by run (was test_compaction.py) ------------------------


def growing_pools(root: Path, replay: dict[str, dict[str, str]]) -> tuple[Path, Path]:
    """Two pools, recorded in `replay`: the second repeats the first pool's first four
    items (as "again-*", on copies of its images) and brings four new ones."""
    first = word_pool(root / "first", "grow", replay, count=8)
    second = word_pool(root / "second", "more", replay, count=4)
    lines = (first / "items.jsonl").read_text().splitlines()[:4]
    for n in range(4):
        shutil.copy(first / f"{n}.png", second / f"a{n}.png")
        lines[n] = lines[n].replace(f'"{n}.png"', f'"a{n}.png"').replace('"grow-', '"again-')
    with (second / "items.jsonl").open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    return first, second


# A family that remembers its task (rsieve.clean.profiles): an OrandCar-like family of
# amount questions, and general questions on the same images (colours, a description, a
# count) that a later pool brings alone.
CHEQUE_QUESTION = "What is the amount written on the cheque?"
CHEQUE_GENERAL = (
    "What colour is the cheque?",
    "Describe the image.",
    "How many lines are there on the cheque?",
    "What colour is the ink?",
)


def cheque_pools(root: Path) -> tuple[Path, Path]:
    """12 genuine amount items, then 8 general questions on the first 8 of their images:
    the two pools' folders."""

    def pool(folder: Path, questions: list[tuple[str, str]]) -> Path:
        folder.mkdir()
        lines = []
        for n, (question, answer) in enumerate(questions):
            data = sign_png(f"{1000 + n}")
            (folder / f"c{n}.png").write_bytes(data)
            lines.append(
                {
                    "id": f"{folder.name}-{n}",
                    "family": "OrandCar",
                    "image": f"c{n}.png",
                    "question": question,
                    "answer": answer,
                    "source": {"sha256": hashlib.sha256(data).hexdigest()},
                }
            )
        (folder / "items.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return folder

    genuine = pool(root / "genuine", [(CHEQUE_QUESTION, str(1000 + n)) for n in range(12)])
    general = pool(
        root / "general", [(CHEQUE_GENERAL[n % 4], "blue" if n % 2 else "3") for n in range(8)]
    )
    return genuine, general
