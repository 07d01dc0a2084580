"""The trace gate's cost (rsieve.compact.traces): microseconds of CPU per accepted item,
every check on, at five trace lengths, beside `str.split` of the same traces (the
cheapest pass over a trace there is: a reference measured in the same run).

    .venv/bin/python -m bench.bench_traces [--quick]

The traces are synthetic, built from a seeded mix of the sentences a VLM writes about an
image (what it shows, reading characters, comparing, checking, adding numbers), ending in
"So the answer is X."; a tenth of them loop, a tenth are in Chinese. Prints figures only;
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

from bench.bench_protocols import pin_one_core
from rsieve.compact.traces import LengthBand, TraceLimits, check_trace
from rsieve.schemas import Item
from rsieve.settings import Settings

LENGTHS = (500, 1500, 2500, 4000, 8000)  # characters: about 100 to 1,600 words of English
TARGET_MS = 0.1

_OBJECTS = ["sign", "receipt", "chart", "form", "label", "poster", "menu", "ticket", "page"]
_PARTS = ["top", "bottom", "left column", "header", "footer", "second row", "legend", "title"]
_WORDS = ["COFFEE", "INVOICE", "TOTAL", "EXIT", "Monday", "Acme Corp", "42.50", "1998"]
_SENTENCES = [
    "The image shows a {obj} photographed at a slight angle.",
    "In the {part} of the {obj} there is text written in capital letters.",
    "Let me read each character carefully: {letters}.",
    "The question asks about the {part}, so I focus on that region.",
    "Wait, I should double-check the {part} because the print is small.",
    "The {n}th line reads '{word}', which matches the layout of a {obj}.",
    "Adding {a} and {b} gives {c}, which is consistent with the total shown.",
    "The {part} is partly covered, but the visible strokes fit '{word}'.",
    "Comparing the {part} with the {part2}, the font is the same.",
    "There are {n} items listed, each with a price on the right.",
]
_CHINESE = [
    "图片显示的是一个{obj}。",
    "仔细看{part}部分，文字是大写字母。",
    "逐个字符读：{letters}。",
    "问题问的是{part}，所以我关注这个区域。",
    "等一下，我需要再检查一下，因为字很小。",
]


def _sentence(rng: random.Random, templates: list[str]) -> str:
    word = rng.choice(_WORDS)
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    return rng.choice(templates).format(
        obj=rng.choice(_OBJECTS),
        part=rng.choice(_PARTS),
        part2=rng.choice(_PARTS),
        letters=", ".join(word),
        word=word,
        n=rng.randint(2, 9),
        a=a,
        b=b,
        c=a + b,
    )


def traces(rng: random.Random, length: int, count: int) -> list[tuple[str, str]]:
    """`count` (trace, answer) pairs of about `length` characters."""
    out = []
    for i in range(count):
        answer = rng.choice(_WORDS)
        chinese, looping = i % 10 == 3, i % 10 == 7
        parts: list[str] = []
        while sum(map(len, parts)) < length:
            if looping and len(parts) > 3:
                parts.append("Wait, let me check the header again.")
            else:
                parts.append(_sentence(rng, _CHINESE if chinese else _SENTENCES))
        end = f"所以答案是 {answer}。" if chinese else f"So the answer is {answer}."
        out.append((" ".join(parts) + " " + end, answer))
    return out


def _item(question: str) -> Item:
    return Item(
        id="b",
        line=1,
        family="Bench",
        protocol="anls",
        question=question,
        pool_question=question,
        references=["x"],
        image_sha256="0" * 64,
        clean_meta={},
    )


def per_item_us(fn: Callable[[], Any], n: int, min_seconds: float) -> float:
    fn()  # warm-up
    runs, start = 0, time.process_time()
    while True:
        fn()
        runs += 1
        elapsed = time.process_time() - start
        if elapsed >= min_seconds:
            return elapsed / runs / n * 1e6


def measure(quick: bool = False) -> dict[str, Any]:
    limits = TraceLimits.of(Settings())
    english, chinese = _item("What is written on the sign?"), _item("图中的文字是什么？")
    count, seconds = (100, 0.2) if quick else (400, 1.0)
    figures: dict[str, Any] = {}
    for length in LENGTHS:
        pairs = traces(random.Random(length), length, count)
        items = [chinese if "答案" in t else english for t, _ in pairs]
        band = LengthBand(median=length, low=0, high=length * 2, traces=100)

        def gate(
            pairs: list[tuple[str, str]] = pairs, items: list[Item] = items, band: LengthBand = band
        ) -> None:
            for (trace, answer), item in zip(pairs, items, strict=True):
                check_trace(trace, answer, item, limits, band)

        def split(pairs: list[tuple[str, str]] = pairs) -> None:
            for trace, _ in pairs:
                trace.split()

        gated = per_item_us(gate, count, seconds)
        reference = per_item_us(split, count, seconds)
        failed = sum(
            not check_trace(t, a, i, limits, band).passed
            for (t, a), i in zip(pairs, items, strict=True)
        )
        figures[str(length)] = {
            "chars_mean": round(sum(len(t) for t, _ in pairs) / count),
            "us_per_item": round(gated, 1),
            "split_us_per_item": round(reference, 2),
            "ratio_to_split": round(gated / reference, 1),
            "failed": failed,
            "items": count,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(pin_one_core())
    figures = measure(args.quick)
    print(f"{'chars':>7} {'us/item':>9} {'split us':>9} {'x split':>8} {'failed':>7}  target")
    for f in figures.values():
        ok = "met" if f["us_per_item"] <= TARGET_MS * 1000 else "over"
        print(
            f"{f['chars_mean']:>7} {f['us_per_item']:>9} {f['split_us_per_item']:>9} "
            f"{f['ratio_to_split']:>8} {f['failed']:>4}/{f['items']}  "
            f"{ok} ({TARGET_MS} ms)"
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
