"""Issue 22 through the real stack (replay model, uploads through the API as a client
makes them): task purity by origin on a pool built like the dataset card's case, and the
same items from a folder pool, a LLaVA-style conversation Parquet and a ShareGPT-style
conversation JSONL."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rsieve.adapters.storage import S3Store
from rsieve_cli.client import upload, wait_for_run
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.pools import picture

SIGNS = ["OPEN", "EXIT", "STOP", "SALE", "PUSH", "PULL", "BANK", "CAFE"]
GENUINE_QUESTIONS = [
    "What is written on the sign?",
    "What word does the sign show?",
    "What does the text on the sign say?",
]
FOREIGN_QUESTIONS = ["What color is the sign?", "Is it daytime?"]


def _png(text: str) -> bytes:
    buf = io.BytesIO()
    picture(text, (96, 32), text, blocks=6).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack], tmp_path_factory: pytest.TempPathFactory) -> Stack:
    replay = tmp_path_factory.mktemp("replay") / "replay.json"
    replay.write_text("{}")  # no recorded answer: every generation fails; cleaning is the test
    return start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "16",
            "RSIEVE_MODEL_RETRIES": "0",
            "RSIEVE_PURITY_EMBEDDING": "false",
        },
    )


def _clean_outputs(stack: Stack, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    store = S3Store(stack_settings(stack))
    items, quarantined = [], []
    for key in sorted(store.list(f"runs/{run}/clean/")):
        out = json.loads(store.get(key))
        items += out["items"]
        quarantined += out["quarantined"]
    return items, quarantined


def test_foreign_origin_items_in_a_benchmark_family_are_off_task(
    stack: Stack, tmp_path: Path
) -> None:
    """The card's case: an image-matched slice put general-VQA questions (source vqav2)
    into TextVQA beside its own items (source textvqa), on the same images. Every foreign
    item is quarantined off_task by the origin rule; no genuine item is dropped."""
    pool = tmp_path / "textvqa-slice"
    pool.mkdir()
    lines, genuine, foreign = [], set(), set()
    for n, word in enumerate(SIGNS):
        data = _png(word)
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
    settings = stack_settings(stack)
    run = upload(settings, pool, "textvqa-slice")
    wait_for_run(settings, run, timeout=300)
    items, quarantined = _clean_outputs(stack, run)
    off_task = {q["id"]: q for q in quarantined if q["reason"] == "off_task"}
    assert set(off_task) == foreign, sorted(off_task)
    assert {i["id"] for i in items} == genuine  # every genuine item went on to the model
    assert all(i["clean_meta"]["purity"] == "origin_on" for i in items)
    store = S3Store(settings)
    purity = json.loads(store.get(f"runs/{run}/cleaning.json"))["families"]["TextVQA"]["purity"]
    assert purity["by_rule"]["origin_off"] == len(foreign) == 4
    assert purity["by_rule"]["origin_on"] == len(genuine) == 24


def _folder_pool(root: Path, images: dict[str, bytes], rows: list[dict[str, Any]]) -> Path:
    folder = root / "folder"
    folder.mkdir()
    for name, data in images.items():
        (folder / name).write_bytes(data)
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_conversation_pools_give_the_same_items_as_the_folder_format(
    stack: Stack, tmp_path: Path
) -> None:
    images = {f"w{n}.png": _png(word) for n, word in enumerate(SIGNS[:3])}
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
    folder = _folder_pool(tmp_path, images, rows)

    llava = tmp_path / "llava"
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

    sharegpt = tmp_path / "sharegpt"
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

    settings = stack_settings(stack)
    found = {}
    for name, pool in (("folder", folder), ("llava", llava), ("sharegpt", sharegpt)):
        run = upload(settings, pool, f"conv-{name}")
        wait_for_run(settings, run, timeout=300)
        items, quarantined = _clean_outputs(stack, run)
        assert quarantined == [], (name, quarantined)
        found[name] = sorted(
            (i["id"], i["family"], i["pool_question"], tuple(i["references"]), i["image_sha256"])
            for i in items
        )
    assert len(found["folder"]) == 3
    assert found["llava"] == found["folder"] == found["sharegpt"]
