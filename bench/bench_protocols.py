"""Decisions per second per protocol on one core, next to the pure-Python references.

    .venv/bin/python -m bench.bench_protocols [--quick]

Prints figures only; asserts nothing about time. The pure-Python references are the
snippets of docs/verifiers.md (quadratic edit distance for ANLS).
"""

from __future__ import annotations

import os
import random
import re
import string
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rsieve.verify import PROTOCOLS, verify

ROOT = Path(__file__).resolve().parents[1]


def doc_snippets() -> dict[str, Any]:
    text = (ROOT / "docs" / "verifiers.md").read_text(encoding="utf-8")
    ns: dict[str, Any] = {"__name__": "verifiers_md"}
    for snippet in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(snippet, "verifiers.md", "exec"), ns)
    return ns


def pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        core = sorted(os.sched_getaffinity(0))[0]
        os.sched_setaffinity(0, {core})
        return f"pinned to CPU {core}"
    return "not pinned"


def rate(
    fn: Callable[[str, Sequence[str]], Any],
    pairs: list[tuple[str, list[str], dict]],
    min_seconds: float = 0.5,
) -> float:
    """Calls per second over `pairs` (after one warm-up pass), for at least `min_seconds`."""
    for pred, refs, opts in pairs:
        fn(pred, refs, **opts)
    n, start = 0, time.perf_counter()
    while True:
        for pred, refs, opts in pairs:
            fn(pred, refs, **opts)
        n += len(pairs)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return n / elapsed


def word(rng: random.Random, lo: int, hi: int) -> str:
    alphabet = string.ascii_letters + string.digits + "    .,-"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))).strip() or "x"


def mutate(rng: random.Random, text: str, edits: int) -> str:
    chars = list(text)
    for _ in range(edits):
        i = rng.randrange(len(chars))
        chars[i] = rng.choice(string.ascii_lowercase)
    return "".join(chars)


def inputs(rng: random.Random) -> dict[str, list[tuple[str, list[str], dict]]]:
    opts = {"options": {"A": "cat", "B": "dog", "C": "bird", "D": "fish"}}
    out: dict[str, list[tuple[str, list[str], dict]]] = {
        "alnum": [(w.upper() + ".", [w], {}) for w in (word(rng, 3, 12) for _ in range(200))],
        "exact": [(f" {w} ", [w.upper()], {}) for w in (word(rng, 3, 20) for _ in range(200))],
        "number": [
            (f"{rng.uniform(0, 1e4):,.2f}", [f"{rng.uniform(0, 1e4):.2f}"], {}) for _ in range(200)
        ],
        "relaxed": [
            (f"{x * rng.uniform(0.9, 1.1):.3f}", [f"{x:.2f}"], {})
            for x in (rng.uniform(1, 1000) for _ in range(200))
        ],
        "vqa": [
            (
                rng.choice(["two", "2", "yes", "No.", "a dog"]),
                [rng.choice(["2", "yes", "no", "dog"]) for _ in range(10)],
                {},
            )
            for _ in range(200)
        ],
        "mc": [
            (
                rng.choice(["B", "(C)", "The answer is D.", "dog", "A cat", "B. dog"]),
                [rng.choice("ABCD")],
                opts,
            )
            for _ in range(200)
        ],
        "math": [
            (
                rng.choice(["\\frac{1}{2}", "0.5", "\\sqrt{2}", "3", "x^2+1"]),
                [rng.choice(["0.5", "1/2", "\\sqrt{2}", "3", "1+x^2"])],
                {},
            )
            for _ in range(20)
        ],
    }
    anls_pairs: list[tuple[str, list[str], dict]] = []
    for _ in range(200):
        gold = word(rng, 20, 200)
        anls_pairs.append((mutate(rng, gold, rng.randint(0, len(gold) // 3)), [gold], {}))
    out["anls"] = anls_pairs
    return out


def main() -> None:
    quick = "--quick" in sys.argv
    print(f"rsieve protocol benchmark ({pin_one_core()}, Python {sys.version.split()[0]})")
    ns = doc_snippets()
    rng = random.Random(11)
    data = inputs(rng)
    seconds = 0.2 if quick else 1.0
    print("Same inputs for both columns; the reference is the docs/verifiers.md snippet.")
    print(f"{'protocol':<9} {'rsieve dec/s':>14} {'pure-Python ref dec/s':>22} {'ratio':>8}")
    for name in sorted(PROTOCOLS):
        pairs = data[name]
        ours = rate(PROTOCOLS[name], pairs, seconds)
        ref = rate(ns[name], pairs, seconds)
        print(f"{name:<9} {ours:>14,.0f} {ref:>22,.0f} {ours / ref:>7.1f}x")

    print("\nANLS, rapidfuzz vs the quadratic loop, by reference length (20% of it edited):")
    for lo, hi in ((20, 50), (50, 100), (100, 200), (200, 200)):
        pairs = []
        for _ in range(50):
            gold = word(rng, lo, hi)
            pairs.append((mutate(rng, gold, len(gold) // 5), [gold], {}))
        ours = rate(PROTOCOLS["anls"], pairs, seconds)
        ref = rate(ns["anls"], pairs, seconds)
        print(
            f"  {lo:>3}-{hi:<3} chars: {ours:>10,.0f}/s vs {ref:>8,.0f}/s  "
            f"speed-up {ours / ref:,.0f}x"
        )

    n = 100_000 if quick else 1_000_000
    words = [w for w in (word(rng, 3, 12) for _ in range(1000))]
    preds = [
        (
            f"{w.upper()}\nThe text reads {w}."
            if i % 3 == 0
            else f"{w}!"
            if i % 3 == 1
            else f"{w}x\n\nno"
        )
        for i, w in enumerate(words)
    ]
    start = time.perf_counter()
    accepted = 0
    for i in range(n):
        j = i % 1000
        accepted += verify("alnum", preds[j], [words[j]]).accepted
    elapsed = time.perf_counter() - start
    print(
        f"\n{n:,} alnum decisions through verify() (variants tried): {elapsed:.2f} s "
        f"({n / elapsed:,.0f}/s, {accepted:,} accepted)"
    )


if __name__ == "__main__":
    main()
