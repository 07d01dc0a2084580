"""The near-duplicate screen (rsieve.clean.decontam.Screen) against what it replaced, one HashIndex
over every image with the question and answer in the key, side by side in one run.

    .venv/bin/python -m bench.bench_screen [--items 40000] [--questions 3] [--distance 8]

A pool of `--items` images asked `--questions` distinct questions, each answer given to 4
images that lie 0-11 bits apart (so some are near-duplicates); the common case, a
benchmark family asking one question of many images with answers of their own.
Prints CPU ms per item for each, and their ratio; checks both give the same verdicts.

    .venv/bin/python -m bench.bench_screen --memory 200000

The memory a screen holds per committed image (tracemalloc, scaled to a million), with
each image kept under its own hash alone and under its own and 10 crop hashes (what
`rsieve.run.packs.image_phashes` gives a real image), side by side: in groups of 4 images
per question and answer (the loop) and in groups of 1,000 (HashIndexes); and the CPU per
checked line with and without the line's crop hashes.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from rsieve.clean.decontam import Screen
from rsieve.hashindex import HashIndex, hash_hex


def one_index(rows: list[tuple[int, str, str]], distance: int) -> list[str | None]:
    """The screen as one index: every image, keyed by question, answer and line."""
    index = HashIndex(max_radius=16)
    out: list[str | None] = []
    for line, (h, q, a) in enumerate(rows, start=1):
        found = next(
            (key for key, _ in index.near(h, distance) if key.split("\t")[:2] == [q, a]), None
        )
        out.append(found.split("\t")[2] if found else None)
        if found is None:
            index.add(h, f"{q}\t{a}\tline {line}")
    return out


def grouped(rows: list[tuple[int, str, str]], distance: int) -> list[str | None]:
    screen = Screen(distance=distance)
    out: list[str | None] = []
    for line, (h, q, a) in enumerate(rows, start=1):
        found = screen.check_keys(line, hash_hex(h), q, a)
        out.append(found[1].rsplit(" of ", 1)[1].removesuffix("'s") if found else None)
    return out


CROPS = 10  # a real image's crop hashes (rsieve.hashindex.REFERENCE_CROPS less itself)


def memory(images: int, distance: int) -> None:
    rng = random.Random(0)
    for per_group in (4, 1000):
        for crops in (0, CROPS):
            keys = [
                (
                    hash_hex(rng.getrandbits(64)),
                    f"q{i // per_group:015d}",
                    "a" * 16,
                    tuple(hash_hex(rng.getrandbits(64)) for _ in range(crops)),
                )
                for i in range(images)
            ]
            tracemalloc.start()
            screen = Screen(distance=distance, committed={"r1": keys})
            held, _ = tracemalloc.get_traced_memory()
            t0 = time.process_time()
            for line in range(1, 2001):
                q = f"q{rng.randrange(images // per_group):015d}"
                h = [hash_hex(rng.getrandbits(64)) for _ in range(1 + crops)]
                screen.check_keys(line, h[0], q, "a" * 16, h[1:])
            per_line = (time.process_time() - t0) / 2000 * 1000
            tracemalloc.stop()
            del screen
            print(
                f"groups of {per_group:5d}, {crops:2d} crop hashes: "
                f"{held / images * 1e6 / 2**20:7.1f} MiB per million committed images, "
                f"{per_line:.4f} CPU ms per checked line"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=40_000)
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--distance", type=int, default=8)
    parser.add_argument("--memory", type=int, default=0, help="committed images")
    args = parser.parse_args()
    if args.memory:
        memory(args.memory, args.distance)
        return
    rng = random.Random(0)
    base = [rng.getrandbits(64) for _ in range(args.items // 4)]

    def image(i: int) -> int:  # 4 images per answer, 0-11 bits from one another's origin
        h = base[i // 4]
        for _ in range(rng.randrange(12)):
            h ^= 1 << rng.randrange(64)
        return h

    rows = [(image(i), f"q{i % args.questions}", f"a{i // 4}") for i in range(args.items)]
    results, cost = {}, {}
    for name, screen in (("one index", one_index), ("grouped", grouped)):
        t0 = time.process_time()
        results[name] = screen(rows, args.distance)
        cost[name] = (time.process_time() - t0) / args.items * 1000
        print(f"{name:10s} {cost[name]:.4f} CPU ms per item")
    assert results["one index"] == results["grouped"], "the two screens disagree"
    dups = sum(r is not None for r in results["grouped"])
    print(
        f"ratio one index / grouped: {cost['one index'] / cost['grouped']:.1f}; {dups} duplicates"
    )


if __name__ == "__main__":
    main()
