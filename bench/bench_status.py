"""What one status poll costs the API: CPU (from /proc) per `GET /runs/<run>`, counted
from the workers' Redis progress records (the default) and by listing S3 (`?exact=true`,
what every poll did before), on a finished run of `--items` items in shards of 64.

    .venv/bin/python -m bench.bench_status [--items 3000] [--polls 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from bench import bench_pipeline as bp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rsieve-bench-status-"))
    pool = bp.make_pool(root / "pool", args.items)
    models = {
        bp.MODEL: bp.ROOT / "bench" / "triton_models" / bp.MODEL,
        "judge-abstain": bp.ROOT / "deploy" / "triton" / "cpu" / "judge-abstain",
    }
    stack = bp.start_stack(
        root / "stack",
        models,
        {
            "RSIEVE_GENERATOR_MODEL": bp.MODEL,
            "RSIEVE_JUDGE_MODEL": "judge-abstain",
            "RSIEVE_PURITY_EMBEDDING": "false",
            "RSIEVE_FIXED_LATENCY_S": "0.01",
        },
    )
    try:
        run, settings = bp.submit(stack, pool, "bench-status")
        bp.wait_done(settings, run, timeout=1800)
        api = stack.pid("api")
        assert api
        url = f"{settings.api_url}/runs/{run}"
        for label, params in (("redis", {}), ("s3", {"exact": "true"})):
            httpx.get(url, params=params, timeout=30).raise_for_status()
            cpu0, t0 = bp.tree_cpu_s([api]), time.monotonic()
            for _ in range(args.polls):
                body = httpx.get(url, params=params, timeout=30).json()
            cpu = bp.tree_cpu_s([api]) - cpu0
            print(
                f"{label:>5}: {1000 * cpu / args.polls:6.2f} ms API CPU per poll, "
                f"{1000 * (time.monotonic() - t0) / args.polls:6.2f} ms wall "
                f"({body['shards']} shards, counted_from={body['counted_from']})"
            )
    finally:
        stack.down()


if __name__ == "__main__":
    main()
