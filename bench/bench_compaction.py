"""Compaction at scale: a million qa entries over a hundred thousand small images, written
by rsieve's streaming split writer and, side by side, by a plain pyarrow write of the same
table built whole in memory. Each runs in its own process so peak memory is its own.

    .venv/bin/python -m bench.bench_compaction [--images 100000] [--qa-per-image 10]

Prints time and peak RSS for both and writes bench/compaction.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path
from typing import Any


def _rows(images: int, per_image: int) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    import hashlib
    import io

    from PIL import Image

    rows, blobs = [], {}
    base = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(base, format="PNG")
    for i in range(images):
        data = base.getvalue() + i.to_bytes(4, "big")  # distinct bytes, still a valid PNG
        sha = hashlib.sha256(data).hexdigest()
        blobs[sha] = data
        qa = [
            {
                "id": f"item-{i}-{j}",
                "question": f"What is written? ({j})",
                "answer": f"w{i}",
                "full_answer": f"w{i}",
                "org_answer": f"W{i}",
                "references": [f"W{i}"],
                "options": None,
                "protocol": "alnum",
                "reasoning": "short",
                "wrong_vlm": None,
                "reason": None,
                "promoted_by": "verifier",
                "model": "bench",
                "verification": {
                    "protocol": "alnum",
                    "version": "1",
                    "constants": "{}",
                    "variant": "whole",
                    "score": 1.0,
                    "threshold": 1.0,
                    "accepted": True,
                },
                "judge": None,
            }
            for j in range(per_image)
        ]
        rows.append(
            {
                "image_sha256": sha,
                "qa": qa,
                "clean_meta": {
                    "run": "bench",
                    "pool": "s3://b/p/",
                    "policy": "{}",
                    "provenance": [],
                },
            }
        )
    return rows, blobs


def _streaming(images: int, per_image: int, out: Any) -> None:
    from rsieve.adapters.parquet import write_split_parts

    rows, blobs = _rows(images, per_image)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        parts = write_split_parts(
            rows,
            Path(tmp),
            "Bench_RS_think",
            image_of=blobs.__getitem__,
            shard_bytes=256 * 1024 * 1024,
            group_rows=256,
        )
        size = sum(p.stat().st_size for p, _ in parts)
    out.put(
        {
            "seconds": time.perf_counter() - start,
            "files": len(parts),
            "bytes": size,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def _plain(images: int, per_image: int, out: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rsieve.compact.rows import FEATURES

    rows, blobs = _rows(images, per_image)
    start = time.perf_counter()
    table = pa.Table.from_pylist(
        [
            r | {"image": {"bytes": blobs[r["image_sha256"]], "path": r["image_sha256"]}}
            for r in rows
        ],
        schema=FEATURES.arrow_schema,
    )
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(table, Path(tmp) / "all.parquet")
        size = (Path(tmp) / "all.parquet").stat().st_size
    out.put(
        {
            "seconds": time.perf_counter() - start,
            "files": 1,
            "bytes": size,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def _baseline(images: int, per_image: int, out: Any) -> None:
    """Building the input alone: the memory both writers start from."""
    _rows(images, per_image)
    out.put({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def _measure(fn: Any, images: int, per_image: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=fn, args=(images, per_image, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return dict(result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--qa-per-image", type=int, default=10)
    args = parser.parse_args()
    base = _measure(_baseline, args.images, args.qa_per_image)
    stream = _measure(_streaming, args.images, args.qa_per_image)
    plain = _measure(_plain, args.images, args.qa_per_image)
    qa = args.images * args.qa_per_image
    print(
        f"{qa:,} qa entries over {args.images:,} images (input built in memory first: "
        f"{base['peak_rss_mb']:.0f} MB)"
    )
    print(f"{'writer':<22}{'seconds':>10}{'peak RSS MB':>14}{'over input MB':>15}{'files':>7}")
    for name, r in (("rsieve streaming", stream), ("plain pyarrow", plain)):
        print(
            f"{name:<22}{r['seconds']:>10.1f}{r['peak_rss_mb']:>14.0f}"
            f"{r['peak_rss_mb'] - base['peak_rss_mb']:>15.0f}{r['files']:>7}"
        )
    over_plain = plain["peak_rss_mb"] - base["peak_rss_mb"]
    over_stream = max(1.0, stream["peak_rss_mb"] - base["peak_rss_mb"])
    print(
        f"time ratio streaming/plain: {stream['seconds'] / plain['seconds']:.2f}; "
        f"memory over input, plain/streaming: {over_plain / over_stream:.1f}x"
    )
    Path(__file__).with_name("compaction.json").write_text(
        json.dumps(
            {
                "qa_entries": qa,
                "images": args.images,
                "input_rss_mb": base["peak_rss_mb"],
                "streaming": stream,
                "plain_pyarrow": plain,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
