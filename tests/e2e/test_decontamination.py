"""Issue 19 through the real stack (replay model, uploads through the API): an evaluation
set registered with `rsieve evalset add` quarantines modified copies of its images as
`contaminated` before any model call; with no set registered nothing is; a second run of
an overlapping pool into the same dataset spends no model call on the overlap (counted
from Triton's own request counters)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from PIL import Image, ImageEnhance

from rsieve.adapters.storage import S3Store
from rsieve.clean.prompts import build_question
from rsieve_cli.client import upload, wait_for_run
from rsieve_cli.local.replay import replay_key
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.cli import run_cli
from tests.e2e.pools import picture

COUNT = 24


def _picture(seed: int) -> Image.Image:
    return picture(seed, (240, 120), blocks=14)


def _modified(img: Image.Image, n: int) -> bytes:
    """A copy as the issue describes: re-encoded, resized, lightly cropped, brightened."""
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


def _pool(folder: Path, images: dict[str, bytes], tag: str) -> Path:
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
                    "question": QUESTION,
                    "answer": "x",
                    "source": {"dataset": "pictures"},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


QUESTION = "What is shown?"


def _originals() -> dict[str, bytes]:
    out = {}
    for n in range(COUNT):
        buf = io.BytesIO()
        _picture(n).save(buf, format="PNG")
        out[f"p{n:02d}.png"] = buf.getvalue()
    return out


@pytest.fixture(scope="module")
def stack(start_stack: Callable[..., Stack], tmp_path_factory: pytest.TempPathFactory) -> Stack:
    # The originals are answered (and accepted: they reach the dataset); anything else has
    # no recorded answer, so its generation is one failed call.
    prompt = build_question(QUESTION, "alnum")
    replay = tmp_path_factory.mktemp("replay") / "replay.json"
    replay.write_text(
        json.dumps(
            {
                replay_key(prompt, data): {
                    "text": "<think>a picture</think>x",
                    "finish_reason": "stop",
                }
                for data in _originals().values()
            }
        )
    )
    return start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "8",
            "RSIEVE_MODEL_RETRIES": "0",
            "RSIEVE_PURITY_EMBEDDING": "false",
        },
    )


def _requests(stack: Stack) -> float:
    """Every inference request Triton has received, successful or not."""
    text = httpx.get(stack_settings(stack).triton_metrics_url or "", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("nv_inference_request_success{", "nv_inference_request_failure{"))
    )


def _quarantined(stack: Stack, run: str) -> dict[str, str]:
    store = S3Store(stack_settings(stack))
    return {
        q["id"]: q["reason"]
        for key in store.list(f"runs/{run}/clean/")
        for q in json.loads(store.get(key))["quarantined"]
    }


def test_evaluation_sets_and_overlapping_runs(stack: Stack, tmp_path: Path) -> None:
    settings = stack_settings(stack)
    originals = _originals()
    copies = {f"c{n:02d}.jpg": _modified(_picture(n), n) for n in range(COUNT)}
    first = _pool(tmp_path / "originals", originals, "orig")
    copied = _pool(tmp_path / "copies", copies, "copy")

    # No evaluation set: the copies are not contaminated.
    run = upload(settings, copied, "free")
    wait_for_run(settings, run, timeout=300)
    assert "contaminated" not in _quarantined(stack, run).values()

    # The originals as an evaluation set, registered by the operator's command.
    added = run_cli(stack, "evalset", "add", "pictures-test", str(first))
    assert added.returncode == 0, added.stderr[-2000:]
    assert f"{COUNT} of {COUNT} lines hashed" in added.stderr.replace("\n", " ")
    before = _requests(stack)
    run = upload(settings, copied, "free")  # the same pool: a new run, the set is new
    wait_for_run(settings, run, timeout=300)
    found = _quarantined(stack, run)
    contaminated = [i for i, reason in found.items() if reason == "contaminated"]
    assert len(contaminated) >= 0.95 * COUNT, found
    # At most a generation and a judgement per item that went on; none for the rest.
    assert _requests(stack) - before <= 2 * (COUNT - len(contaminated))
    export = tmp_path / "export"
    listed = run_cli(stack, "export", run, "--to", str(export))
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "| pictures-test |" in (export / "free" / "README.md").read_text()

    removed = run_cli(stack, "evalset", "remove", "pictures-test")
    assert removed.returncode == 0, removed.stderr[-2000:]

    # Two runs into one dataset: the second pool holds copies of the first's images.
    run = upload(settings, first, "grown")
    wait_for_run(settings, run, timeout=300)
    report = json.loads(S3Store(settings).get("datasets/grown/run_report.json"))
    assert report["families"]["SynthWords"]["accepted"] == COUNT  # all in the dataset
    before = _requests(stack)
    run = upload(settings, copied, "grown")
    wait_for_run(settings, run, timeout=300)
    found = _quarantined(stack, run)
    overlap = [i for i, reason in found.items() if reason == "duplicate_item"]
    # A pool keeps one hash per image: every re-encoded, resized or brightened copy is
    # found; a cropped one (every fourth) only when the crop moved its hash little.
    assert {f"copy-{n}" for n in range(COUNT) if n % 4 != 1} <= set(overlap), found
    assert _requests(stack) - before <= 2 * (COUNT - len(overlap))
