"""The CPU stack's judge (SmolLM2-135M-Instruct through Triton) on the canary set: what a
real small language model answers, how its outputs parse, how many canaries flip with and
without rsieve's defences, and what a verdict costs batched and one at a time.

    .venv/bin/python bench/bench_judge.py [--configs rsieve,naive_both] [--out FILE]

Starts tritonserver with `judge-smollm2` only (the checkpoint is prepared first), sends
every canary (10 wrong answers x 28 injections, tests/unit/cases) through
`rsieve.adapters.model.TritonModel` with the judge's tokenizer (special tokens neutralised,
as the judge service does), parses each reply with the judge's strict parser, and prints
a table. Figures go to docs/judge.md; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rsieve.adapters.model import ModelReply, ModelRequest, TritonModel  # noqa: E402
from rsieve.calibration import canary_flips  # noqa: E402
from rsieve.judge import parse_verdict  # noqa: E402
from rsieve_cli.local import processes  # noqa: E402
from rsieve_cli.local.checkpoints import smollm2_checkpoint  # noqa: E402
from tests.unit.test_judge_canaries import CONFIGS, load_canaries  # noqa: E402

MODEL = "judge-smollm2"


def _start(root: Path, checkpoint: Path) -> tuple[Any, str]:
    repo = root / "models"
    shutil.copytree(ROOT / "deploy" / "triton" / "cpu" / MODEL, repo / MODEL)
    http, grpc_port, metrics = (processes.free_port() for _ in range(3))
    log = root / "triton.log"
    started = time.monotonic()
    proc = processes.start_triton(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc_port,
        metrics_port=metrics,
        log=log,
        env_extra={"RSIEVE_JUDGE_CHECKPOINT": str(checkpoint)},
    )
    processes.wait_triton(http, [MODEL], 300, proc=proc, log=log)
    print(f"judge-smollm2 ready in {time.monotonic() - started:.1f} s")
    return proc, f"127.0.0.1:{grpc_port}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="rsieve,naive_both")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "judge_results.json")
    parser.add_argument("--budget", type=int, default=64, help="judge_max_new_tokens")
    args = parser.parse_args()
    t0 = time.monotonic()
    checkpoint = smollm2_checkpoint()
    print(f"checkpoint {checkpoint} in {time.monotonic() - t0:.1f} s")
    cases = load_canaries()
    results: dict[str, Any] = {"cases": len(cases), "budget": args.budget}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(Path(tmp), checkpoint)
        try:
            model = TritonModel(
                url,
                MODEL,
                max_inflight=16,
                tokenizer=str(checkpoint),
                timeout_s=600,
                max_new_tokens=args.budget,
            )
            # One at a time, then batched, on the same 16 prompts.
            probe = [ModelRequest(c.prompt()) for c in cases[:16]]
            single = TritonModel(
                url,
                MODEL,
                max_inflight=1,
                request_items=1,
                tokenizer=str(checkpoint),
                timeout_s=600,
                max_new_tokens=args.budget,
            )
            start = time.monotonic()
            single.generate_many(probe)
            one_s = (time.monotonic() - start) / len(probe)
            start = time.monotonic()
            model.generate_many(probe)
            batched_s = (time.monotonic() - start) / len(probe)
            results["s_per_verdict"] = {
                "one_at_a_time": round(one_s, 3),
                "batched_16": round(batched_s, 3),
            }
            print("s per verdict:", results["s_per_verdict"], flush=True)
            for config in args.configs.split(","):
                build, parse = CONFIGS[config]
                prompts = [build(c.question, c.references, c.candidate) for c in cases]
                start = time.monotonic()
                replies = model.generate_many([ModelRequest(p) for p in prompts])
                wall = time.monotonic() - start
                errors = [r for r in replies if not isinstance(r, ModelReply)]
                good = [r for r in replies if isinstance(r, ModelReply)]
                parsed = [parse_verdict(r.text, r.finish_reason) for r in good]
                verdicts = [parse(r.text, r.finish_reason) for r in good]
                flips = canary_flips(cases, verdicts) if not errors else []
                results[config] = {
                    "wall_s": round(wall, 1),
                    "errors": len(errors),
                    "verdicts": dict(Counter(p.verdict for p in parsed)),
                    "causes": dict(
                        Counter((p.cause or "").split(":")[0] for p in parsed if p.cause)
                    ),
                    "flips": len(flips),
                    "flipped_to_correct": sum(1 for f in flips if f["verdict"] == "CORRECT"),
                    "examples": [r.text[:160] for r in good[:3]],
                }
                print(config, json.dumps(results[config], ensure_ascii=False), flush=True)
        finally:
            processes.stop(proc)
    print(json.dumps(results, indent=1, ensure_ascii=False))
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
