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
counted apart.

Then the same for near-duplicates within a pool and against the dataset (issue 39, item
3), through the same path (`rsieve.run.packs.image_phashes` as the upload hashes an image,
the keys the compactor commits, `Screen.check` with the line's crop hashes), every image
asked the same question with the same answer (so every pair is compared): recall on
`--copies` modified copies of the first half's images, (a) the original committed by an
earlier run and the copy in the new pool, and (b) the copy earlier in the pool than the
original; false matches: the second half's images and their copies, each checked against
the first half committed. Prints a table per family and the totals for each; writes
bench/decontam.json (git-ignored).
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

from rsieve.clean.decontam import (
    Screen,
    answer_key,
    build_evalset,
    dataset_keys,
    question_key,
    read_dataset_keys,
)
from rsieve.hashindex import hash_hex, perceptual_hash
from rsieve.run.packs import image_phashes

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
    out["near_duplicates"] = near_duplicates(args, family_of, registered, others, rng)
    (HERE / "decontam.json").write_text(json.dumps(out, indent=1))
    return 0


Hashes = tuple[str | None, tuple[str, ...]]


def near_duplicates(
    args: argparse.Namespace,
    family_of: dict[str, str],
    registered: set[str],
    others: set[str],
    rng: random.Random,
) -> dict[str, Any]:
    """Recall and false matches of the pool's and the dataset's near-duplicate screen."""
    q, a = question_key("q"), answer_key("a")
    hashed: dict[str, Hashes] = {}
    copies: dict[str, list[Hashes]] = {}
    small: set[str] = set()
    for image in sorted(registered | others):
        data = (args.folder / image).read_bytes()
        hashed[image] = image_phashes(data)
        copies[image] = [image_phashes(modified(data, rng)) for _ in range(args.copies)]
        if Image.open(io.BytesIO(data)).height < SMALL_HEIGHT:
            small.add(image)
    committed = read_dataset_keys(
        dataset_keys((h, q, a, crops) for i in sorted(registered) for h, crops in [hashed[i]])
    )

    def in_dataset(copy: Hashes, keys: list[Any]) -> bool:
        screen = Screen(distance=args.distance, committed={"earlier": keys})
        return screen.check_keys(1, copy[0], q, a, copy[1]) is not None

    def in_pool(first: Hashes, then: Hashes) -> bool:
        screen = Screen(distance=args.distance)
        screen.check_keys(1, first[0], q, a, first[1])
        return screen.check_keys(2, then[0], q, a, then[1]) is not None

    found: dict[str, Counter[str]] = {"dataset": Counter(), "pool": Counter()}
    tried: Counter[str] = Counter()
    small_found: Counter[str] = Counter()
    false: Counter[str] = Counter()
    checked: Counter[str] = Counter()
    t0 = time.perf_counter()
    for image in sorted(registered):
        family = family_of[image]
        own = [k for k in committed if k[0] == hashed[image][0]]
        for copy in copies[image]:
            tried[family] += 1
            hits = {"dataset": in_dataset(copy, own), "pool": in_pool(copy, hashed[image])}
            for where, hit in hits.items():
                found[where][family] += hit
                small_found[where] += hit and image in small
            small_found["tried"] += image in small
    screen = Screen(distance=args.distance, committed={"earlier": committed})
    line = 0
    for image in sorted(others):
        for sample in (hashed[image], *copies[image]):
            line += 1
            family = family_of[image]
            false[family] += screen.check_keys(line, sample[0], q, a, sample[1]) is not None
            checked[family] += 1
            screen = Screen(distance=args.distance, committed={"earlier": committed})
    checked_s = time.perf_counter() - t0
    rows = []
    print("\nnear-duplicates, every image asked the same question with the same answer")
    print("family | copies | recall, dataset | recall, pool | distinct checked | false matches")
    for family in sorted(tried | checked):
        row = {
            "family": family,
            "copies": tried[family],
            "dataset": found["dataset"][family],
            "pool": found["pool"][family],
            "distinct": checked[family],
            "false": false[family],
        }
        rows.append(row)
        share = {w: found[w][family] / tried[family] if tried[family] else None for w in found}
        print(
            f"{family} | {tried[family]} | "
            + " | ".join("-" if v is None else f"{v:.1%}" for v in share.values())
            + f" | {checked[family]} | {false[family]}"
        )
    total = sum(tried.values())
    recall = {w: sum(found[w].values()) / max(1, total) for w in found}
    per_k = 1000 * sum(false.values()) / max(1, sum(checked.values()))
    print(
        f"all: recall against the dataset {recall['dataset']:.1%}, within the pool "
        f"{recall['pool']:.1%} (of {total}); word crops under {SMALL_HEIGHT} px "
        f"{small_found['dataset']} and {small_found['pool']} of {small_found['tried']}; "
        f"false matches {sum(false.values())} of {sum(checked.values())} ({per_k:.1f} per "
        f"1,000) against {len(registered)} committed images; checks {checked_s:.1f} s"
    )
    return {
        "families": rows,
        "recall": recall,
        "small": dict(small_found),
        "false_per_1000": per_k,
    }


if __name__ == "__main__":
    raise SystemExit(main())
