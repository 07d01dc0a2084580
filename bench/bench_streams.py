"""The generator's CPU for streamed samples (loop watching), per engine token: what a
response costs rsieve's client, with streams pooled or a stream per sample, side by side.

    .venv/bin/python -m bench.bench_streams [--items 400] [--inflight 64] [--interval-ms 1]

Starts tritonserver with `vllm-engine-standin` (bench/triton_models: a STAND-IN for a vLLM
engine behind Triton's vLLM backend, no model; bench/README.md) and asks it `--items` items
through `rsieve.adapters.model.TritonModel` on the vLLM interface, exactly as the
generator does: the chat prompt rendered client side, base64 image, loop watching on. With
`--interval-ms` at most one engine step (the stand-in's steps take 4 ms and more) the
stand-in sends a response per decode step, each carrying one token per sequence: the
per-token streaming of Triton's vLLM backend. At 50 it is the pipeline bench's pace.

Each mode runs on the same server, one after the other, with a fresh pool of items (the
stand-in's prefix cache never serves a mode what another prefilled):

- `pooled`: loop watching on, streams reused (StreamPool, the default);
- `per_sample`: loop watching on, a stream per sample (before the pool);
- `whole` (`loop_window_chars 0`): nothing streamed, each sample answered whole;
- `bare_grpc`: the floor: the same requests streamed by a bare grpc.aio client that reads
  each response and drops it (no rsieve code, no prompt rendering: the prompts are built
  once before the clock starts).

Figures per mode: the client process's CPU seconds (every thread: asyncio and gRPC's),
wall seconds, engine tokens generated and responses sent (its own counters on /metrics),
cores (CPU / wall), CPU per engine token, and cores per 10,000 engine tokens/s. Prints
figures and writes bench/streams.json; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, PngImagePlugin

from bench.bench_engine import ENGINE, ENGINE_DIR, engine_metrics
from rsieve.adapters.model import ModelReply, ModelRequest, TritonModel
from rsieve.generate.loops import LoopRule
from rsieve_cli.local.triton_server import RunningTriton, triton_on_free_ports

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "streams.json"
QUESTION = "What word is shown in the image?"
MODES = ("pooled", "per_sample", "whole", "bare_grpc")
# Outputs that fall into a repetition loop (the pipeline bench's share): cut while they
# stream, so the pool replaces their streams.
P_LOOP = "0.03"


def _png(word: str) -> bytes:
    img = Image.new("RGB", (120, 40), "white")
    ImageDraw.Draw(img).text((6, 12), word, fill="black")
    meta = PngImagePlugin.PngInfo()
    meta.add_text("bench-answer", word)
    buf = io.BytesIO()
    img.save(buf, format="PNG", pnginfo=meta)
    return buf.getvalue()


@contextmanager
def _serve(root: Path, interval_ms: float) -> Iterator[RunningTriton]:
    repo = root / "models"
    shutil.copytree(ENGINE_DIR, repo / ENGINE)
    env = {"RSIEVE_STANDIN_STREAM_INTERVAL_MS": str(interval_ms), "RSIEVE_STANDIN_P_LOOP": P_LOOP}
    with triton_on_free_ports(repo, log=root / "triton.log", ready=[ENGINE], env_extra=env) as t:
        yield t


def _counters(port: int) -> dict[str, float]:
    m = engine_metrics(port)
    return {k: m.get(k, 0.0) for k in ("generated_tokens_total", "responses_total")}


async def _bare(url: str, requests: list[Any], inflight: int) -> int:
    """Stream every request on a stream of its own with `inflight` at a time, reading each
    response to the final one and dropping it; the responses read."""
    import grpc
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    gate = asyncio.Semaphore(inflight)
    read = [0]

    async def one(request: Any) -> None:
        async with gate:
            call = client._client_stub.ModelStreamInfer(
                metadata=client._get_metadata(None), timeout=None
            )
            await call.write(request)
            while (response := await call.read()) is not grpc.aio.EOF:
                read[0] += 1
                final = response.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
            await call.done_writing()

    try:
        await asyncio.gather(*(one(r) for r in requests))
    finally:
        await client.close()
    return read[0]


def _bare_requests(model: TritonModel, reqs: list[ModelRequest]) -> list[Any]:
    """The requests `model` would stream for `reqs`, built ahead (the bare client's)."""
    import uuid

    import tritonclient.grpc.aio as aioclient
    from tritonclient.grpc._utils import _get_inference_request

    out = []
    for req in reqs:
        _, inputs, names = model.vllm_inputs(req, stream=True)
        request = _get_inference_request(
            model_name=ENGINE,
            inputs=inputs,
            model_version="",
            request_id=uuid.uuid4().hex,
            outputs=[aioclient.InferRequestedOutput(n) for n in names],
            sequence_id=0,
            sequence_start=False,
            sequence_end=False,
            priority=0,
            timeout=None,
            parameters=None,
        )
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        out.append(request)
    return out


def one_mode(
    url: str, metrics: int, tokenizer: str, mode: str, items: int, inflight: int
) -> dict[str, Any]:
    loops = LoopRule(window_chars=0) if mode == "whole" else LoopRule()
    model = TritonModel(
        url,
        ENGINE,
        interface="vllm",
        tokenizer=tokenizer,
        max_inflight=inflight,
        max_new_tokens=4096,
        temperature=0.7,
        timeout_s=600,
        loops=loops,
    )
    model.reuse_streams = mode != "per_sample"
    reqs = [ModelRequest(QUESTION, _png(f"{mode}{i:05d}x")) for i in range(items)]
    model.generate_many(reqs[:2])  # ready, template loaded, connections warm
    time.sleep(0.5)
    bare = _bare_requests(model, reqs[2:]) if mode == "bare_grpc" else []
    before = _counters(metrics)
    cpu0, wall0 = time.process_time(), time.monotonic()
    if mode == "bare_grpc":
        asyncio.run(_bare(url, bare, inflight))
        out: list[ModelReply | Exception] = []
    else:
        out = asyncio.run(model.generate_many_async(reqs[2:]))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    time.sleep(0.3)  # the engine's last counters published
    after = _counters(metrics)
    tokens = after["generated_tokens_total"] - before["generated_tokens_total"]
    responses = after["responses_total"] - before["responses_total"]
    replies = [r for r in out if isinstance(r, ModelReply)]
    loops_cut = sum(r.finish_reason == "repetition_loop" for r in replies)
    cores = cpu / wall
    rate = tokens / wall
    return {
        "items": len(out) or len(bare),
        "errors": len(out) - len(replies),
        "loops_cut": loops_cut,
        "client_cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "engine_tokens": int(tokens),
        "engine_responses": int(responses),
        "engine_tokens_per_s": round(rate, 1),
        "client_cores": round(cores, 4),
        "cpu_us_per_token": round(1e6 * cpu / tokens, 2) if tokens else None,
        "cpu_us_per_response": round(1e6 * cpu / responses, 2) if responses else None,
        "cores_per_10k_tokens_per_s": round(cores / (rate / 10_000), 4) if rate else None,
    }


def main() -> None:
    from tests.templates import build_tokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--interval-ms", type=float, default=1.0)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rsieve-bench-streams-") as tmp:
        root = Path(tmp)
        tokenizer = str(build_tokenizer(root / "tokenizer", "qwen3_vl_thinking"))
        with _serve(root, args.interval_ms) as triton:
            url, metrics = triton.grpc_url, triton.metrics_port
            for mode in modes:
                print(f"streams: {mode}, {args.items} items ...", flush=True)
                results[mode] = one_mode(url, metrics, tokenizer, mode, args.items, args.inflight)
    report = {
        "modes": results,
        "conditions": {
            "engine": f"{ENGINE} (a stand-in), stream_interval_ms={args.interval_ms}, "
            f"p_loop={P_LOOP}",
            "items": args.items,
            "inflight": args.inflight,
            "load_average": os.getloadavg(),
            "cpus": os.cpu_count(),
        },
    }
    if "pooled" in results and "per_sample" in results:
        report["pooled_over_per_sample_cpu_per_token"] = round(
            results["pooled"]["cpu_us_per_token"] / results["per_sample"]["cpu_us_per_token"], 3
        )
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    cols = (
        "client_cores",
        "engine_tokens_per_s",
        "cpu_us_per_token",
        "cpu_us_per_response",
        "cores_per_10k_tokens_per_s",
        "loops_cut",
        "errors",
    )
    print(f"\n{'mode':<11}" + "".join(f"{c:>28}" for c in cols))
    for mode, r in results.items():
        print(f"{mode:<11}" + "".join(f"{r[c]!s:>28}" for c in cols))
    print(f"\nload average {os.getloadavg()}; written to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
