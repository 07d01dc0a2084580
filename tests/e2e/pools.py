"""Small pools for e2e tests, with the replay model's recorded outputs."""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

from rsieve_cli.local.replay import replay_key
from rsieve_cli.local.stack import REPO_ROOT

QUESTION = "What word is shown? Answer with the text only."


def picture(seed: str | int, size: tuple[int, int], text: str = "", blocks: int = 8) -> Image.Image:
    """A picture of its own per seed: coloured blocks placed from the seed, then `text`.
    Renders of a few characters on a blank canvas hash alike (docs/cleaning.md,
    near-duplicates); these do not."""
    rng = random.Random(seed)
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    w, h = size
    for _ in range(blocks):
        x, y = rng.randrange(max(1, w - w // 4)), rng.randrange(max(1, h - h // 4))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        dx, dy = rng.randrange(w // 12 + 1, w // 3 + 2), rng.randrange(h // 8 + 1, h // 2 + 2)
        draw.rectangle((x, y, x + dx, y + dy), fill=colour)
    if text:
        draw.text((6, min(10, h // 4)), text, fill="black")
    return img


def png(text: str) -> bytes:
    img = Image.new("RGB", (120, 40), "white")
    ImageDraw.Draw(img).text((6, 12), text, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def word_pool(
    folder: Path,
    tag: str,
    replay: dict[str, dict[str, str]],
    *,
    count: int,
    extra_ids: tuple[str, ...] = (),
    family: str = "SynthWords",
) -> Path:
    """`count` items the verifier accepts (plus `extra_ids`), recorded for the replay model;
    `tag` makes the pool, and so its run, unique."""
    folder.mkdir(parents=True)
    lines = []
    ids = [f"{tag}-{i:03d}" for i in range(count)] + list(extra_ids)
    for n, item_id in enumerate(ids):
        word = f"{tag}{n}".upper()
        data = png(word)
        (folder / f"{n}.png").write_bytes(data)
        lines.append(
            json.dumps(
                {
                    "id": item_id,
                    "family": family,
                    "image": f"{n}.png",
                    "question": QUESTION,
                    "answer": word.lower(),
                    "source": {"sha256": hashlib.sha256(data).hexdigest()},
                }
            )
        )
        replay[replay_key(QUESTION, data)] = {
            "text": f"<think>{n}</think>{word}",
            "finish_reason": "stop",
        }
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def example_subset(folder: Path, counts: dict[str, int]) -> Path:
    """The example pool's first ``counts[family]`` items of each family named, with their
    images: the real example items, fewer of them, for tests whose every judge call runs a
    real model on the CPU."""
    pool = REPO_ROOT / "examples" / "pool"
    folder.mkdir()
    taken: dict[str, int] = {}
    lines = []
    for line in (pool / "items.jsonl").read_text().splitlines():
        family = json.loads(line)["family"]
        if taken.get(family, 0) < counts.get(family, 0):
            taken[family] = taken.get(family, 0) + 1
            lines.append(line)
            name = json.loads(line)["image"]
            (folder / name).write_bytes((pool / name).read_bytes())
    assert taken == counts, f"the example pool has fewer items than {counts}: {taken}"
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder
