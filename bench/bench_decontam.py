"""Decontamination under light edits, on a folder of real labelled images: recall on
modified copies of evaluation images, and false matches on distinct images of the same
kinds, through rsieve's own path (rsieve.clean.decontam: `build_evalset`, `Screen`).

    .venv/bin/python -m bench.bench_decontam FOLDER [--copies 3] [--seed 0] [--distance 8]

FOLDER holds items.jsonl and its images (only read). Each family's images are split in
two, alternately: the first half is registered as an evaluation set; each of its images
gets `--copies` modified copies, each with every edit drawn at random: a crop of 0-5% from
each side (each side its own), a resize by 0.6-1.4x, a brightness shift of -10% to +10%
and a JPEG re-encoding at quality 70-90. Recall: the copies the screen calls
`contaminated`. False matches: the other half's images, and modified copies of them, that
the screen calls `contaminated` (distinct images of the same kind: other words, other
cheques, other photos), per thousand checked. Word crops under 40 pixels high are also
counted apart. Prints a table per family and the totals; writes bench/decontam.json
(git-ignored).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from PIL import Image, ImageEnhance

from rsieve.clean.decontam import Screen, build_evalset
from rsieve.hashindex import hash_hex, perceptual_hash

HERE = Path(__file__).resolve().parent
SMALL_HEIGHT = 40  # a word crop this short is counted apart


def modified(data: bytes, rng: random.Random) -> bytes:
    """`data` with every edit drawn at random (the module docstring's ranges), as JPEG."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    left, top, right, bottom = (rng.uniform(0, 0.05) for _ in range(4))
    img = img.crop((round(w * left), round(h * top), w - round(w * right), h - round(h * bottom)))
    scale = rng.uniform(0.6, 1.4)
    img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))))
    img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.9, 1.1))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=rng.randint(70, 90))
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distance", type=int, default=8, help="near_duplicate_distance")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    lines = [json.loads(x) for x in (args.folder / "items.jsonl").read_text().splitlines() if x]
    family_of: dict[str, str] = {}
    for rec in lines:
        family_of.setdefault(str(rec["image"]), str(rec["family"]))
    by_family: dict[str, list[str]] = defaultdict(list)
    for image, family in family_of.items():
        by_family[family].append(image)
    registered = {img for imgs in by_family.values() for img in imgs[0::2]}
    others = {img for imgs in by_family.values() for img in imgs[1::2]}
    evalset_items = "\n".join(json.dumps(r) for r in lines if r["image"] in registered)
    t0 = time.perf_counter()
    evalset, figures = build_evalset(
        "bench", evalset_items.encode(), lambda p: (args.folder / p).read_bytes()
    )
    built_s = time.perf_counter() - t0
    found: Counter[str] = Counter()
    tried: Counter[str] = Counter()
    false: Counter[str] = Counter()
    checked: Counter[str] = Counter()
    small = Counter[str]()
    line = 0

    def contaminated(data: bytes) -> bool:
        nonlocal line
        line += 1
        screen = Screen(distance=args.distance, evalsets={"bench": evalset})
        return screen.check(line, hash_hex(perceptual_hash(data)), "q", "a") is not None

    t0 = time.perf_counter()
    for image in sorted(registered | others):
        family, data = family_of[image], (args.folder / image).read_bytes()
        short = Image.open(io.BytesIO(data)).height < SMALL_HEIGHT
        copies = [modified(data, rng) for _ in range(args.copies)]
        if image in registered:
            hits = sum(contaminated(c) for c in copies)
            found[family] += hits
            tried[family] += len(copies)
            if short:
                small["found"] += hits
                small["tried"] += len(copies)
        else:
            for sample in (data, *copies):
                false[family] += contaminated(sample)
                checked[family] += 1
    checked_s = time.perf_counter() - t0
    rows = []
    print("family | copies | recall | distinct checked | false matches | per 1,000")
    for family in sorted(tried | checked):
        recall = found[family] / tried[family] if tried[family] else None
        per_k = 1000 * false[family] / checked[family] if checked[family] else None
        rows.append(
            {
                "family": family,
                "copies": tried[family],
                "found": found[family],
                "recall": recall,
                "distinct": checked[family],
                "false": false[family],
                "false_per_1000": per_k,
            }
        )
        print(
            f"{family} | {tried[family]} | {recall if recall is None else f'{recall:.1%}'} | "
            f"{checked[family]} | {false[family]} | "
            f"{per_k if per_k is None else f'{per_k:.1f}'}"
        )
    total = sum(found.values()) / max(1, sum(tried.values()))
    per_k_all = 1000 * sum(false.values()) / max(1, sum(checked.values()))
    print(
        f"all: recall {total:.1%} ({sum(found.values())} of {sum(tried.values())}); word crops "
        f"under {SMALL_HEIGHT} px {small['found']} of {small['tried']}; false matches "
        f"{sum(false.values())} of {sum(checked.values())} ({per_k_all:.1f} per 1,000); "
        f"evaluation set {figures['hashed']} images in {built_s:.1f} s, checks "
        f"{checked_s:.1f} s"
    )
    out: dict[str, Any] = {
        "distance": args.distance,
        "copies": args.copies,
        "seed": args.seed,
        "families": rows,
        "recall": total,
        "small": dict(small),
        "false_per_1000": per_k_all,
    }
    (HERE / "decontam.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
