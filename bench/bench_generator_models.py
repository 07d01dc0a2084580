"""Items per second through Triton for the generator's CPU models, one client, no stack.

    .venv/bin/python -m bench.bench_generator_models [--items 32] [--inflight 16]
                                                     [--budget 24] [--models vlm,rapidocr]

Starts tritonserver with `vlm` (deploy/triton/hf/vlm serving the tiny random-weight LLaVA
that scripts/build_tiny_vlm.py builds) and `rapidocr` (deploy/triton/cpu/rapidocr), sends
`--items` word crops through `rsieve.adapters.model.TritonModel` with `--inflight` items in
flight (after a warm-up of 4) and prints items/s and output tokens per model. Prints
figures only; asserts nothing about time (the behaviour is tested in
tests/integration/test_generator_models.py).
"""

from __future__ import annotations

import argparse
import io
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image, ImageDraw

from rsieve.adapters.model import ModelReply, ModelRequest, TritonModel
from rsieve_cli.local.triton_server import RunningTriton, triton_on_free_ports
from tests.checkpoints import build_tiny_vlm

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "vlm": ROOT / "deploy" / "triton" / "hf" / "vlm",
    "rapidocr": ROOT / "deploy" / "triton" / "cpu" / "rapidocr",
}
WORDS = ["HELLO", "WORLD", "ESPLANADE", "11850", "RSIEVE", "TRITON", "BATCH", "VLM"]
QUESTION = "What word is shown in the image?"


def png(text: str) -> bytes:
    img = Image.new("RGB", (160, 48), "white")
    ImageDraw.Draw(img).text((8, 16), text, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@contextmanager
def _serve(root: Path, models: list[str]) -> Iterator[RunningTriton]:
    repo = root / "models"
    for name in models:
        shutil.copytree(MODELS[name], repo / name)
    env = {}
    if "vlm" in models:
        env["RSIEVE_HF_CHECKPOINT"] = str(build_tiny_vlm(root / "tiny-llava"))
    with triton_on_free_ports(repo, log=root / "triton.log", ready=models, env_extra=env) as t:
        print(f"tritonserver with {', '.join(models)} ready in {t.ready_s:.1f} s")
        yield t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--inflight", type=int, default=16, help="max_inflight")
    parser.add_argument("--budget", type=int, default=24, help="vlm max_new_tokens")
    parser.add_argument("--models", default="vlm,rapidocr")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {sorted(MODELS)}")
    reqs = [ModelRequest(QUESTION, png(WORDS[i % len(WORDS)] + str(i))) for i in range(args.items)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rsieve-bench-gen-") as tmp:
        with _serve(Path(tmp), models) as triton:
            url = triton.grpc_url
            for name in models:
                budget = args.budget if name == "vlm" else None
                model = TritonModel(url, name, max_inflight=args.inflight, max_new_tokens=budget)
                model.generate_many(reqs[:4])  # warm
                start = time.monotonic()
                out = model.generate_many(reqs)
                elapsed = time.monotonic() - start
                good = [r for r in out if isinstance(r, ModelReply)]
                tokens = sum(r.output_tokens or 0 for r in good)
                rows.append((name, len(good), len(out) - len(good), elapsed, tokens))
    print(f"\n{args.items} word crops, {args.inflight} in flight, one client:")
    print(f"{'model':<10} {'items/s':>9} {'replies':>8} {'errors':>7} {'wall s':>8} {'tokens':>7}")
    for name, replies, errors, elapsed, tokens in rows:
        rate = replies / elapsed if elapsed else 0.0
        print(f"{name:<10} {rate:>9.1f} {replies:>8} {errors:>7} {elapsed:>8.2f} {tokens:>7}")


if __name__ == "__main__":
    main()
