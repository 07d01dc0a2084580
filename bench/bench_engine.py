"""The production path against an engine that batches like vLLM: engine saturation, CPU per
item outside the engine, and two engines against one.

    .venv/bin/python -m bench.bench_engine [--items 3000] [--no-scale-out]

Starts the real local stack (Redis, SeaweedFS, Triton, one worker per service, the API) with
`vllm-engine-standin` (bench/triton_models, a STAND-IN: Triton's vLLM-backend interface and
a simulated continuous-batching engine, no model; bench/README.md) as the generator's model,
spoken to exactly as production speaks to vLLM: the chat prompt rendered client side from a
Qwen3-VL-Thinking-style tokenizer folder (tests/templates.py), base64 image, streaming gRPC.
`judge-abstain` judges. The engine reports its own state on Triton's /metrics
(rsieve_standin_*), sampled every 0.25 s.

Figures (in the steady window, between 10% and 90% of the items finished by the engine):
- running ratio: mean running sequences / max_num_seqs (from the engine's integral of
  running sequences over time, not from samples);
- decode ratio: decode tokens/s / the peak N / (a + b.N), over the time the engine was not
  prefilling (prefill is the engine's own work for the same items, whoever feeds it);
- engine_saturation_ratio: the lower of the two;
- engine_cpu_ms_per_item: CPU of every rsieve process (workers and API, children
  included; not Triton) over the run, per item;
- engine_scaleout_ratio: items/s with two engines (two Triton servers, a generator worker
  each) over items/s with one, both steady.

GPU tokens (issue 40; the engine's counters over whole runs, not a window):
- adaptive: one pool at n = 8 with every sample drawn (`enough` 0) and with adaptive
  stopping (the defaults: keep first, an item stops at its first round with a pass):
  tokens_ratio (decode tokens generated, adaptive / every sample) and accepted_ratio
  (items accepted, adaptive / every sample), from each run's report;
- prefill_tokens_ratio: tokens the engine prefilled per item at n = 8 (the every-sample
  run, the first on its pool) over n = 1 (the one-engine run);
- loop_tokens_saved_ratio: over every run, the decode tokens the looping outputs never
  generated because the generator cut them (rsieve.generate.loops) over the tokens those
  loops were drawn to generate (to max_new_tokens). The stand-in makes LOOP_SHARE of its
  outputs loop, in every run of this bench.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.bench_pipeline import (
    machine_reference,
    make_pool,
    service_pids,
    settle,
    start_stack,
    submit,
    tree_cpu_s,
)
from rsieve_cli.local import processes
from rsieve_cli.local.stack import Stack
from rsieve_cli.local.triton_server import RunningTriton, triton_on_free_ports

ROOT = Path(__file__).resolve().parents[1]

ENGINE = "vllm-engine-standin"
ENGINE_DIR = ROOT / "bench" / "triton_models" / ENGINE
# The services' defaults (shards of 128, 32 open per generator worker, the engine's
# capacity read from its config), and a token budget that lets the long tail play out: 4096
# cuts about 1% of the reasoning (finish "length", truncated_reasoning, to the judge).
SETTINGS = {
    "RSIEVE_GENERATOR_MODEL": ENGINE,
    "RSIEVE_JUDGE_MODEL": "judge-abstain",
    "RSIEVE_PURITY_EMBEDDING": "false",
    "RSIEVE_MAX_NEW_TOKENS": "4096",
}
# Outputs of the stand-in that fall into a repetition loop (to the token budget, unless cut).
LOOP_SHARE = "0.03"
# Best-of-n for the tokens figures: n = 8 on a pool of this share of the items.
TOKENS_SAMPLES, TOKENS_SHARE = 8, 15
_LINE = re.compile(r"^rsieve_standin_(\w+)\{[^}]*\}\s+([0-9.e+-]+)$", re.M)


def engine_metrics(metrics_port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    return {name: float(value) for name, value in _LINE.findall(text)}


class EngineSampler(threading.Thread):
    """Every engine's rsieve_standin_* figures every `period` seconds."""

    def __init__(self, ports: list[int], period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.ports, self.period = ports, period
        self.samples: list[tuple[float, list[dict[str, float]]]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                now = time.monotonic() - self.t0
                self.samples.append((now, [engine_metrics(p) for p in self.ports]))
            except httpx.HTTPError:
                pass
            self.stop.wait(self.period)


def steady(samples: list[tuple[float, list[dict[str, float]]]], items: int) -> dict[str, Any]:
    """Figures between 10% and 90% of `items` finished (all engines together)."""

    def finished(sample: tuple[float, list[dict[str, float]]]) -> float:
        return sum(m.get("finished_total", 0.0) for m in sample[1])

    base = finished(samples[0])
    lo = next(s for s in samples if finished(s) - base >= 0.1 * items)
    hi = next(s for s in samples if finished(s) - base >= 0.9 * items)
    span = hi[0] - lo[0]
    engines = []
    for a, b in zip(lo[1], hi[1], strict=True):

        def d(key: str, a: dict[str, float] = a, b: dict[str, float] = b) -> float:
            return b.get(key, 0.0) - a.get(key, 0.0)

        seqs, peak = b["max_num_seqs"], b["peak_decode_tokens_per_s"]
        decoding = span - d("prefill_seconds_total")
        engines.append(
            {
                "items_per_s": d("finished_total") / span,
                "running_ratio": d("running_seconds_total") / span / seqs,
                "decode_tokens_per_s": d("generated_tokens_total") / span,
                "decode_ratio": d("generated_tokens_total") / (decoding * peak),
                "prefill_share": d("prefill_seconds_total") / span,
                "preemptions": d("preemptions_total"),
                "max_num_seqs": seqs,
                "peak_decode_tokens_per_s": peak,
            }
        )
    window = [s for s in samples if lo[0] <= s[0] <= hi[0]]
    running = [sum(m.get("running", 0.0) for m in s[1]) for s in window]
    return {
        "window_s": span,
        "items_per_s": (finished(hi) - finished(lo)) / span,
        "engines": engines,
        "running_ratio": min(e["running_ratio"] for e in engines),
        "decode_ratio": min(e["decode_ratio"] for e in engines),
        "running_sampled_min": min(running, default=0.0),
    }


def shard_times(settings: Any, run: str, t0_wall: float) -> list[float]:
    """When each generate shard output was stored (seconds after the sampler's start; S3's
    LastModified has one-second resolution)."""
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key.get_secret_value(),
        aws_secret_access_key=settings.s3_secret_key.get_secret_value(),
    )
    out: list[float] = []
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=settings.s3_bucket, Prefix=f"runs/{run}/generate/"
    )
    for page in pages:
        out += [o["LastModified"].timestamp() - t0_wall for o in page.get("Contents", [])]
    return sorted(round(t, 1) for t in out)


def one_run(
    stack: Stack,
    pool: Path,
    items: int,
    dataset: str,
    ports: list[int],
    pids: dict[str, int],
    samples: int = 1,
    sampling_extra: dict[str, Any] | None = None,
    steady_window: bool = True,
) -> dict[str, Any]:
    """One run of `pool`; `samples` > 1: best-of-n at temperature 0.7 (the run's own
    sampling, with `sampling_extra`), the engine's steady window counted in samples."""
    from rsieve_cli.client import wait_for_run

    settle(pids)
    cpu0 = tree_cpu_s(list(pids.values()))
    before = {n: tree_cpu_s([p]) for n, p in pids.items()}
    sampler = EngineSampler(ports)
    t0_wall = time.time() - (time.monotonic() - sampler.t0)
    sampler.start()
    wall0 = time.monotonic()
    sampling = (
        {"samples": samples, "temperature": 0.7, **(sampling_extra or {})} if samples > 1 else None
    )
    run, settings = submit(stack, pool, dataset, sampling)
    status = wait_for_run(settings, run, timeout=1200, poll_s=2.0)
    wall = time.monotonic() - wall0
    cpu = tree_cpu_s(list(pids.values())) - cpu0
    time.sleep(0.3)  # the engine's last counters published
    sampler.stop.set()
    sampler.join()
    first, last = sampler.samples[0][1], engine_counters(ports)
    figures = steady(sampler.samples, items * samples) if steady_window else {}
    timeline = [
        {
            "t": round(t, 2),
            "running": int(sum(m.get("running", 0) for m in ms)),
            "waiting": int(sum(m.get("waiting", 0) for m in ms)),
            "finished": int(sum(m.get("finished_total", 0) for m in ms)),
        }
        for t, ms in sampler.samples[::4]
    ]
    return {
        "run": run,
        "items": items,
        "wall_s": wall,
        "service_cpu_s": cpu,
        "cpu_ms_per_item": 1000 * cpu / items,
        "cpu_s_by_service": {n: round(tree_cpu_s([p]) - before[n], 2) for n, p in pids.items()},
        "steady": figures,
        "samples": samples,
        "adds_up": status.get("manifest", {}).get("adds_up"),
        "timeline": timeline,
        "shards_stored_at_s": shard_times(settings, run, t0_wall),
        # The engines' counters over the whole run (every engine summed).
        "engine_totals": {
            k: sum(m.get(k, 0.0) for m in last) - sum(m.get(k, 0.0) for m in first) for k in COUNTED
        },
        "accepted": accepted(settings, dataset, run),
        "settings": settings,
    }


# The stand-in's counters a run's totals keep.
COUNTED = (
    "finished_total",
    "generated_tokens_total",
    "prefill_tokens_total",
    "prefix_cached_tokens_total",
    "cancelled_total",
    "cancelled_unused_tokens_total",
    "loop_outputs_total",
    "loop_tokens_total",
    "loop_unused_tokens_total",
    "responses_total",
)


def engine_counters(ports: list[int]) -> list[dict[str, float]]:
    return [engine_metrics(p) for p in ports]


def accepted(settings: Any, dataset: str, run: str) -> int:
    """Items the run accepted, from its committed report."""
    from rsieve.adapters.storage import S3Store

    report = json.loads(S3Store(settings).get(f"datasets/{dataset}/commits/{run}/run_report.json"))
    return sum(int(f["accepted"]) for f in report["families"].values())


def second_engine(stack: Stack, root: Path, exits: ExitStack) -> RunningTriton:
    """A second Triton serving the engine beside the stack's, stopped when `exits` closes."""
    log = stack.logs / "triton-2.log"
    serving = triton_on_free_ports(root / "models", log=log, models=[ENGINE], stop_timeout_s=20)
    return exits.enter_context(serving)


def second_generator(stack: Stack, grpc_port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, **stack.config.env(), "RSIEVE_TRITON_GRPC_URL": f"127.0.0.1:{grpc_port}"}
    return stack.start_service("generator", env, log_name="generator-2")


def bench(
    items: int,
    scale_out: bool = True,
    overrides: dict[str, str] | None = None,
    machine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from tests.templates import build_tokenizer

    machine = machine or machine_reference()

    root = Path(tempfile.mkdtemp(prefix="rsieve-bench-engine-"))
    tokenizer = build_tokenizer(root / "tokenizer", "qwen3_vl_thinking")
    pools = [
        make_pool(root / f"pool{k}", items, wrong_every=0, prefix=f"e{k}")
        for k in range(2 if scale_out else 1)
    ]
    # Best-of-n at n = 4 on a quarter of the items: as many sequences as the n = 1 run.
    sampled_items = max(1, items // BEST_OF)
    sampled_pool = make_pool(root / "pool-n4", sampled_items, wrong_every=0, prefix="n4")
    tokens_items = max(20, items // TOKENS_SHARE)
    tokens_pool = make_pool(root / "pool-n8", tokens_items, wrong_every=0, prefix="n8")
    models = {
        ENGINE: ENGINE_DIR,
        "judge-abstain": ROOT / "deploy" / "triton" / "cpu" / "judge-abstain",
    }
    env = {**SETTINGS, "RSIEVE_GENERATOR_TOKENIZER": str(tokenizer), **(overrides or {})}
    print(f"engine: starting the stack in {root} ...", flush=True)
    stack = start_stack(root / "stack", models, env, {"RSIEVE_STANDIN_P_LOOP": LOOP_SHARE})
    out: dict[str, Any] = {}
    extra = ExitStack()  # the second engine and its generator, stopped before the stack
    try:
        pids = service_pids(stack)
        print(f"engine: {items} items, one engine ...", flush=True)
        one = one_run(
            stack, pools[0], items, "bench-engine-1", [stack.config.triton_metrics_port], pids
        )
        settings = one.pop("settings")
        out["one_engine"] = one
        print(f"engine: {sampled_items} items x {BEST_OF} samples, one engine ...", flush=True)
        four = one_run(
            stack,
            sampled_pool,
            sampled_items,
            "bench-engine-n4",
            [stack.config.triton_metrics_port],
            pids,
            samples=BEST_OF,
            sampling_extra={"enough": 0},  # every sample: the throughput of n = 4
        )
        four.pop("settings")
        out["best_of_n"] = best_of_n(one, four)
        port = [stack.config.triton_metrics_port]
        tokens: dict[str, dict[str, Any]] = {}
        runs: tuple[tuple[str, dict[str, Any]], ...] = (
            ("every_sample", {"enough": 0}),
            ("adaptive", {}),
        )
        for name, chosen in runs:
            print(
                f"engine: {tokens_items} items x {TOKENS_SAMPLES} samples, {name} ...", flush=True
            )
            tokens[name] = one_run(
                stack,
                tokens_pool,
                tokens_items,
                f"bench-engine-n8-{name.replace('_', '-')}",
                port,
                pids,
                samples=TOKENS_SAMPLES,
                sampling_extra=chosen,
                steady_window=False,
            )
            tokens[name].pop("settings")
        out.update(gpu_tokens(one, four, tokens))
        if scale_out:
            print(f"engine: {items} items, two engines ...", flush=True)
            triton2 = second_engine(stack, root / "stack", extra)
            gen2 = second_generator(stack, triton2.grpc_port)
            extra.callback(processes.stop, gen2, timeout=20)
            time.sleep(6)  # the second worker's start
            two = one_run(
                stack,
                pools[1],
                items,
                "bench-engine-2",
                [stack.config.triton_metrics_port, triton2.metrics_port],
                {**pids, "generator-2": gen2.pid},
            )
            two.pop("settings")
            out["two_engines"] = two
            out["engine_scaleout_ratio"] = (
                two["steady"]["items_per_s"] / one["steady"]["items_per_s"]
            )
    finally:
        extra.close()
        stack.down()
    s = one["steady"]
    out["engine_saturation_ratio"] = min(s["running_ratio"], s["decode_ratio"])
    out["engine_cpu_ms_per_item"] = one["cpu_ms_per_item"]
    out["conditions"] = {
        "engine": f"{ENGINE} (a stand-in, bench/README.md): " + json.dumps(engine_parameters()),
        "settings": {
            k: getattr(settings, k)
            for k in ("shard_size", "generator_concurrency", "max_new_tokens", "engine_capacity")
        },
        "items": items,
        "load_average": os.getloadavg(),
        "machine_reference": machine,
    }
    return out


BEST_OF = 4


def gpu_tokens(
    one: dict[str, Any], four: dict[str, Any], tokens: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The GPU-token figures (module docstring) from the runs' engine totals."""
    fixed, adaptive = tokens["every_sample"], tokens["adaptive"]
    ft, at = fixed["engine_totals"], adaptive["engine_totals"]
    loops = [r["engine_totals"] for r in (one, four, fixed, adaptive)]
    drawn = sum(t["loop_tokens_total"] for t in loops)
    unused = sum(t["loop_unused_tokens_total"] for t in loops)
    per_item_8 = ft["prefill_tokens_total"] / fixed["items"]
    per_item_1 = one["engine_totals"]["prefill_tokens_total"] / one["items"]
    return {
        "adaptive": {
            "samples": TOKENS_SAMPLES,
            "items": fixed["items"],
            "tokens_ratio": at["generated_tokens_total"] / ft["generated_tokens_total"],
            "accepted_ratio": adaptive["accepted"] / fixed["accepted"],
            "generated_tokens": {
                "every_sample": ft["generated_tokens_total"],
                "adaptive": at["generated_tokens_total"],
            },
            "outputs": {
                "every_sample": ft["finished_total"] + ft["cancelled_total"],
                "adaptive": at["finished_total"] + at["cancelled_total"],
            },
            "accepted": {"every_sample": fixed["accepted"], "adaptive": adaptive["accepted"]},
            "wall_s": {"every_sample": fixed["wall_s"], "adaptive": adaptive["wall_s"]},
        },
        "prefill_tokens_ratio": per_item_8 / per_item_1,
        "prefill_tokens_per_item": {
            f"n={TOKENS_SAMPLES}": per_item_8,
            "n=1": per_item_1,
            f"n={TOKENS_SAMPLES} from the prefix cache": ft["prefix_cached_tokens_total"]
            / fixed["items"],
        },
        "loop_tokens_saved_ratio": unused / drawn if drawn else None,
        "loops": {
            "share": float(LOOP_SHARE),
            "outputs": sum(t["loop_outputs_total"] for t in loops),
            "tokens_drawn": drawn,
            "tokens_saved": unused,
            "cancelled": sum(t["cancelled_total"] for t in loops),
        },
    }


def best_of_n(one: dict[str, Any], four: dict[str, Any]) -> dict[str, Any]:
    """Items/s and CPU per item at n = 4 beside n = 1 (issue 23): items/s from the
    engine's steady window, counted in samples and divided by n."""
    n = four["samples"]
    return {
        "samples": n,
        "items": four["items"],
        "items_per_s": four["steady"]["items_per_s"] / n,
        "samples_per_s": four["steady"]["items_per_s"],
        "cpu_ms_per_item": four["cpu_ms_per_item"],
        "cpu_ms_per_sample": four["cpu_ms_per_item"] / n,
        "cpu_s_by_service": four["cpu_s_by_service"],
        "wall_s": four["wall_s"],
        "adds_up": four["adds_up"],
        "at_n_1": {
            "items": one["items"],
            "items_per_s": one["steady"]["items_per_s"],
            "cpu_ms_per_item": one["cpu_ms_per_item"],
        },
    }


def engine_parameters() -> dict[str, str]:
    text = (ENGINE_DIR / "config.pbtxt").read_text()
    pairs = re.findall(r'key:\s*"(\w+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text)
    return dict(pairs)


def print_table(r: dict[str, Any]) -> None:
    one = r["one_engine"]
    s = one["steady"]
    e = s["engines"][0]
    rows = [
        (
            "engine_saturation_ratio",
            f"{r['engine_saturation_ratio']:.3f}",
            f"lower of running {s['running_ratio']:.3f} and decode {s['decode_ratio']:.3f}",
        ),
        (
            "  running sequences",
            f"{s['running_ratio'] * e['max_num_seqs']:.1f}",
            f"mean of max_num_seqs {e['max_num_seqs']:.0f}; sampled min "
            f"{s['running_sampled_min']:.0f}; preemptions {e['preemptions']:.0f}",
        ),
        (
            "  decode tokens/s",
            f"{e['decode_tokens_per_s']:.0f}",
            f"peak {e['peak_decode_tokens_per_s']:.0f}; prefill {100 * e['prefill_share']:.1f}%"
            " of the window",
        ),
        (
            "  items/s",
            f"{s['items_per_s']:.1f}",
            f"steady window {s['window_s']:.0f} s of {one['wall_s']:.0f} s wall",
        ),
        (
            "engine_cpu_ms_per_item",
            f"{r['engine_cpu_ms_per_item']:.2f}",
            f"workers + API, {one['items']} items: "
            + ", ".join(f"{k} {v}" for k, v in one["cpu_s_by_service"].items()),
        ),
    ]
    if "engine_scaleout_ratio" in r:
        two = r["two_engines"]["steady"]
        rows.append(
            (
                "engine_scaleout_ratio",
                f"{r['engine_scaleout_ratio']:.2f}x",
                f"{s['items_per_s']:.1f} -> {two['items_per_s']:.1f} items/s "
                f"(running {two['running_ratio']:.3f}, decode {two['decode_ratio']:.3f})",
            )
        )
    if "best_of_n" in r:
        b, base = r["best_of_n"], r["best_of_n"]["at_n_1"]
        rows += [
            (
                f"items/s at n = {b['samples']}",
                f"{b['items_per_s']:.1f}",
                f"{b['samples_per_s']:.1f} samples/s; {base['items_per_s']:.1f} items/s at n = 1",
            ),
            (
                f"cpu_ms_per_item at n = {b['samples']}",
                f"{b['cpu_ms_per_item']:.2f}",
                f"{b['cpu_ms_per_sample']:.2f} per sample; {base['cpu_ms_per_item']:.2f} at n = 1 "
                f"({b['items']} items x {b['samples']})",
            ),
        ]
    if "adaptive" in r:
        a = r["adaptive"]
        g, acc = a["generated_tokens"], a["accepted"]
        p = r["prefill_tokens_per_item"]
        at_n = p[f"n={a['samples']}"]
        loops = r["loops"]
        rows += [
            (
                "tokens_ratio",
                f"{a['tokens_ratio']:.3f}",
                f"n = {a['samples']}, {a['items']} items: {g['adaptive']:,.0f} decode tokens "
                f"adaptive / {g['every_sample']:,.0f} every sample",
            ),
            (
                "accepted_ratio",
                f"{a['accepted_ratio']:.3f}",
                f"{acc['adaptive']} / {acc['every_sample']} items accepted",
            ),
            (
                "prefill_tokens_ratio",
                f"{r['prefill_tokens_ratio']:.3f}",
                f"{at_n:.0f} tokens prefilled per item at n = {a['samples']} / "
                f"{p['n=1']:.0f} at n = 1",
            ),
            (
                "loop_tokens_saved_ratio",
                "n/a"
                if r["loop_tokens_saved_ratio"] is None
                else f"{r['loop_tokens_saved_ratio']:.3f}",
                f"{loops['tokens_saved']:,.0f} of {loops['tokens_drawn']:,.0f} loop tokens "
                f"never generated; {loops['outputs']:.0f} looping outputs "
                f"({100 * loops['share']:.0f}% of outputs), {loops['cancelled']:.0f} cancelled",
            ),
        ]
    print(f"\n{'figure':<28}{'value':>14}  conditions")
    for name, value, cond in rows:
        print(f"{name:<28}{value:>14}  {cond}")
    m = r["conditions"]["machine_reference"]
    print(
        f"load average at the end {r['conditions']['load_average'][0]:.1f}; machine: "
        f"{m['cores']} cores ({m['cpu_model']}), reference work {m['reference_cpu_ms']} ms CPU"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--no-scale-out", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results-engine.json")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="RSIEVE_X=V",
        help="a setting for the stack's services (repeatable)",
    )
    args = parser.parse_args()
    result = bench(
        args.items,
        scale_out=not args.no_scale_out,
        overrides=dict(kv.split("=", 1) for kv in args.set),
    )
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print_table(result)


if __name__ == "__main__":
    main()
