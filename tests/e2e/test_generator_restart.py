"""The generator through the real stack: Triton is stopped and restarted while shards are
being generated, and no item is lost or counted twice; every stored question is
byte-identical to the prompt sent, and each generation records what answered and the exact
image bytes the model got (an oversized image resized, re-encoded and stored by its hash)."""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
import pytest
from PIL import Image

from rsieve.adapters.exports import export_dataset
from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store, read_images
from rsieve.schemas import ShardOutput
from rsieve_cli.client import submit, wait_for_run
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.faults import counter, held, wait_until
from tests.e2e.pools import picture

QUESTION = "What word is shown in the image? Answer with the text only."
ITEMS = 24
MAX_SIDE = 256


def _png(text: str, size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    picture(text, size, text).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pool") / "restart-pool"
    folder.mkdir()
    lines = []
    for i in range(ITEMS):
        size = (1024, 64) if i == 0 else (160, 48)  # the first one exceeds MAX_SIDE
        data = _png(f"W{i}", size)
        (folder / f"w{i}.png").write_bytes(data)
        lines.append(
            json.dumps(
                {
                    "id": f"w{i}",
                    "family": "SynthWords",
                    "image": f"w{i}.png",
                    "question": QUESTION + ("  " if i % 2 else ""),
                    "answer": "2",
                    "source": {"sha256": hashlib.sha256(data).hexdigest()},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def stack(start_stack: Any) -> Stack:
    return start_stack(
        ["inflight-probe", "judge-abstain"],
        triton_env={"RSIEVE_PROBE_DELAY_S": "0.5"},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "inflight-probe",
            "RSIEVE_JUDGE_MODEL": "judge-abstain",
            "RSIEVE_SHARD_SIZE": "4",
            "RSIEVE_MAX_INFLIGHT": "2",
            "RSIEVE_MODEL_RETRIES": "4",
            "RSIEVE_MODEL_BACKOFF_S": "0.5",
            "RSIEVE_IMAGE_MAX_SIDE": str(MAX_SIDE),
        },
    )


@pytest.fixture(scope="module")
def run(
    stack: Stack, pool: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, int]:
    settings = stack_settings(stack)
    store = S3Store(settings)
    run = submit(settings, upload_pool(store, pool), "restart-test")
    deadline = time.monotonic() + 120
    while not any(True for _ in store.list(f"runs/{run}/generate/")):
        assert time.monotonic() < deadline, "no shard was generated"
        time.sleep(0.1)
    before = stack.pid("triton")
    # Mid-run: the generator holds a shard (the others are queued or in flight).
    generator = stack.pid("generator") or 0
    wait_until("the generator held no shard", lambda: held(stack, run, [generator]), 120)
    models = ("rsieve.generate", "rsieve.judge")
    retries = counter(stack, "rsieve_task_retries", models)
    stack.stop("triton")
    # Down until a model call has met it: the call failed and its task was retried.
    wait_until(
        "no model call met the stopped Triton",
        lambda: counter(stack, "rsieve_task_retries", models) > retries,
        120,
    )
    stack.up()
    restarted = stack.pid("triton")
    assert before and restarted and restarted != before
    wait_for_run(settings, run, timeout=300)
    return run, export_dataset(store, "restart-test", tmp_path_factory.mktemp("out")), ITEMS


def test_no_item_lost_or_duplicated(run: tuple[str, Path, int]) -> None:
    _, export, items = run
    ds = datasets.load_dataset(str(export))
    ids = [
        qa["id"]
        for split, rows in ds.items()
        if not split.endswith("_RS_nothink")
        for row in rows
        for qa in row["qa"]
    ]
    quarantined = [json.loads(x) for x in (export / "quarantine.jsonl").read_text().splitlines()]
    assert quarantined == []
    assert Counter(ids) == Counter(f"w{i}" for i in range(items))
    report = json.loads((export / "run_report.json").read_text())
    assert report["adds_up"] is True


def test_generations_record_what_was_sent(
    stack: Stack, run: tuple[str, Path, int], pool: Path
) -> None:
    run_id = run[0]
    store = S3Store(stack_settings(stack))
    generations = [
        g
        for key in store.list(f"runs/{run_id}/generate/")
        for g in ShardOutput.model_validate_json(store.get(key)).generations
    ]
    assert len(generations) == ITEMS
    for gen in generations:
        # The stored question is exactly the prompt that went over the wire.
        assert gen.prompt_sent_sha256 == hashlib.sha256(gen.item.question.encode()).hexdigest()
        assert gen.item.question == gen.item.pool_question.strip()
        assert (gen.model, gen.model_version, gen.interface) == ("inflight-probe", "1", "rsieve")
        assert gen.sampling["temperature"] == 0.0
        assert gen.latency_s is not None and gen.latency_s > 0
        assert gen.image_sent is not None and gen.image_sent["sha256"] == gen.image_sent_sha256
        assert int(gen.answer or 0) <= 2  # never more than max_inflight at once
        # What was sent can be fetched by its hash: re-encoded bytes under images/, the
        # uploaded bytes from the pool's packs where the item says they lie.
        assert gen.item.image_at is not None
        sent = (
            store.get(f"images/{gen.image_sent_sha256}")
            if gen.image_sent["reencoded"]
            else read_images(store, [gen.item.image_at])[gen.image_sent_sha256]
        )
        assert hashlib.sha256(sent).hexdigest() == gen.image_sent_sha256
        original = (pool / f"{gen.item.id}.png").read_bytes()
        if gen.item.id == "w0":
            assert gen.image_sent["reencoded"] and gen.image_sent["width"] == MAX_SIDE
            assert Image.open(io.BytesIO(sent)).size == (MAX_SIDE, 16)
        else:
            assert sent == original and not gen.image_sent["reencoded"]
