"""rsieve.hashindex.HashIndex at a million random 64-bit hashes: build time, memory, queries
per second by radius (queries with a planted near neighbour and uniformly random ones),
interleaved query-then-add (the cleaner's pattern), and the serialised form.

    .venv/bin/python -m bench.bench_hashindex [--hashes 1000000] [--queries 2000]

Prints the figures and writes bench/hashindex.json (git-ignored); `--balanced` draws
hashes with exactly 32 bits set, as every phash has (bench/hashindex_balanced.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from rsieve.hashindex import HashIndex, hamming

HERE = Path(__file__).resolve().parent


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def popcount(x: np.ndarray) -> np.ndarray:
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


def balanced_hashes(n: int, seed: int) -> list[int]:
    """n random 64-bit hashes with exactly 32 bits set."""
    gen = np.random.default_rng(seed)
    out: list[int] = []
    weights = np.uint64(1) << np.arange(64, dtype=np.uint64)
    for start in range(0, n, 100_000):
        k = min(100_000, n - start)
        bits = np.argsort(gen.random((k, 64)), axis=1) < 32
        out.extend((bits * weights).sum(axis=1, dtype=np.uint64).tolist())
    return out


def flip(rng: random.Random, h: int, k: int, balanced: bool = False) -> int:
    """h with k bits flipped; `balanced`: k // 2 set bits and as many clear ones, so the
    number of bits set stays (a phash's near-duplicate is another balanced hash)."""
    if balanced:
        ones = [b for b in range(64) if h >> b & 1]
        zeros = [b for b in range(64) if not h >> b & 1]
        k = min(k // 2, len(ones), len(zeros))
        bits = rng.sample(ones, k) + rng.sample(zeros, k)
    else:
        bits = rng.sample(range(64), k)
    for bit in bits:
        h ^= 1 << bit
    return h


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hashes", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--max-radius", type=int, default=16)
    ap.add_argument("--radii", default="4,8,10,12,16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--balanced",
        action="store_true",
        help="hashes with exactly 32 of 64 bits set, as every phash has (bench_phash.py)",
    )
    args = ap.parse_args()
    n, rng = args.hashes, random.Random(args.seed)
    radii = [int(r) for r in args.radii.split(",") if int(r) <= args.max_radius]
    out: dict[str, Any] = {
        "hashes": n,
        "max_radius": args.max_radius,
        "key_chars": 16,
        "balanced": args.balanced,
    }

    if args.balanced:
        hashes = balanced_hashes(n, args.seed)
    else:
        hashes = [rng.getrandbits(64) for _ in range(n)]
    keys = [f"{i:016x}" for i in range(n)]  # 16-character keys (a question key's length)
    gc.collect()
    rss0 = rss_mb()
    tracemalloc.start()
    t0 = time.perf_counter()
    index = HashIndex(max_radius=args.max_radius)
    for h, k in zip(hashes, keys, strict=True):
        index.add(h, k)
    t1 = time.perf_counter()
    index.near(hashes[0], 0)  # builds the block tables (the first query after adds)
    t2 = time.perf_counter()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["build"] = {
        "add_s": round(t1 - t0, 3),
        "add_us_per_hash": round((t1 - t0) / n * 1e6, 3),
        "tables_s": round(t2 - t1, 3),
        "total_s": round(t2 - t0, 3),
    }
    out["memory"] = {
        "tracemalloc_current_mb": round(current / 2**20, 1),
        "tracemalloc_peak_mb": round(peak / 2**20, 1),
        "bytes_per_hash": round(current / n, 1),
        "rss_growth_mb": round(rss_mb() - rss0, 1),
    }
    print(f"build {n:,} hashes: add {t1 - t0:.2f} s, tables {t2 - t1:.3f} s")
    print(
        f"memory: {current / 2**20:.1f} MB held ({current / n:.1f} B/hash, 16-char keys), "
        f"tracemalloc peak {peak / 2**20:.1f} MB, RSS growth {rss_mb() - rss0:.1f} MB"
    )

    arr = np.array(hashes, dtype=np.uint64)
    queries = []
    for radius in radii:
        planted = [
            flip(rng, hashes[rng.randrange(n)], rng.randint(0, radius), args.balanced)
            for _ in range(args.queries)
        ]
        rand = (
            balanced_hashes(args.queries, args.seed + radius)
            if args.balanced
            else [rng.getrandbits(64) for _ in range(args.queries)]
        )
        row: dict[str, Any] = {"radius": radius}
        for kind, qs in (("planted", planted), ("random", rand)):
            found = 0
            t = time.perf_counter()
            for q in qs:
                found += len(index.near(q, radius))
            dt = time.perf_counter() - t
            row[f"{kind}_qps"] = round(len(qs) / dt)
            row[f"{kind}_ms"] = round(dt / len(qs) * 1e3, 3)
            row[f"{kind}_mean_results"] = round(found / len(qs), 3)
        # correctness spot check against a numpy linear scan, and its speed
        t = time.perf_counter()
        for q in planted[:200]:
            d = popcount(arr ^ np.uint64(q))
            want = sorted((int(d[i]), int(i)) for i in np.nonzero(d <= radius)[0])
            got = index.near(q, radius)
            assert [(k, dd) for dd, k in ((dd, keys[i]) for dd, i in want)] == got
        row["linear_scan_qps"] = round(200 / (time.perf_counter() - t), 1)
        queries.append(row)
        print(
            f"radius {radius:2d}: planted {row['planted_qps']:6d} q/s ({row['planted_ms']} ms), "
            f"random {row['random_qps']:6d} q/s ({row['random_ms']} ms); "
            f"numpy linear scan + check ~{row['linear_scan_qps']} q/s"
        )
    out["queries"] = queries

    # The cleaner's pattern: query a line's hash, then add it (the tables are rebuilt now
    # and then, when the rows appended since exceed max(4096, n / 64)).
    inter = min(20000, n // 10)
    radius = min(12, args.max_radius)
    t = time.perf_counter()
    for i in range(inter):
        h = flip(rng, hashes[rng.randrange(n)], 3) if i % 2 else rng.getrandbits(64)
        index.near(h, radius)
        index.add(h, f"new{i:013d}")
    dt = time.perf_counter() - t
    out["interleaved"] = {
        "pairs": inter,
        "radius": radius,
        "per_pair_ms": round(dt / inter * 1e3, 3),
    }
    print(f"interleaved query(r={radius})+add at {n:,}: {dt / inter * 1e3:.3f} ms per pair")

    t = time.perf_counter()
    blob = index.to_bytes()
    t_ser = time.perf_counter() - t
    t = time.perf_counter()
    back = HashIndex.from_bytes(blob)
    t_load = time.perf_counter() - t
    assert len(back) == len(index)
    q = hashes[12345]
    assert back.near(q, radius) == index.near(q, radius)
    assert all(hamming(q, h) <= radius for h in (q,))
    out["serialised"] = {
        "hashes": len(index),
        "mb": round(len(blob) / 2**20, 2),
        "bytes_per_hash": round(len(blob) / len(index), 2),
        "to_bytes_s": round(t_ser, 3),
        "from_bytes_s": round(t_load, 3),
    }
    print(
        f"serialised: {len(blob) / 2**20:.2f} MB ({len(blob) / len(index):.1f} B/hash), "
        f"to_bytes {t_ser:.3f} s, from_bytes (incl. tables) {t_load:.3f} s"
    )
    path = HERE / ("hashindex_balanced.json" if args.balanced else "hashindex.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
