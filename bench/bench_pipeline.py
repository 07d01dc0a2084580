"""The whole pipeline against the model: GPU saturation, CPU per item outside the model,
scale-out of a CPU stage, the protocol and compaction figures, and time to first result.

    .venv/bin/python -m bench.bench_pipeline [--items 3000] [--quick] [--no-ttfr]

Starts the real local stack (rsieve_cli.local.stack: Redis, SeaweedFS, Triton, one worker per
service, the API) on free ports in a temporary folder, with `fixed-latency-vlm`
(bench/triton_models: 0.25 s per batch of up to 16, so 64 items/s ideal) as the generator
and `judge-abstain` as the judge. Prints a table and writes bench/results.json.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, ImageDraw, PngImagePlugin

from rsieve import redis_keys
from rsieve_cli.local.stack import SERVICES, Stack, StackConfig

ROOT = Path(__file__).resolve().parents[1]

MODEL = "fixed-latency-vlm"
BATCH, BATCH_S = 16, 0.25
IDEAL = BATCH / BATCH_S
QUESTION = "What word or text is shown in this cropped image? Answer with the text only."
CLK = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- the pool
def make_pool(folder: Path, count: int, wrong_every: int = 4, prefix: str = "w") -> Path:
    """`count` word crops (distinct PNGs). Each PNG carries the answer the stand-in model
    gives in a tEXt chunk: the right word, except a wrong one for every `wrong_every`-th
    item (they go to the judge; 0: never, the engine stand-in errs on its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        word = f"{prefix}{i:05d}x"
        img = Image.new("RGB", (120, 40), "white")
        ImageDraw.Draw(img).text((6, 12), word, fill="black")
        meta = PngImagePlugin.PngInfo()
        meta.add_text("bench-answer", "wrong" if wrong_every and i % wrong_every == 0 else word)
        buf = io.BytesIO()
        img.save(buf, format="PNG", pnginfo=meta)
        data = buf.getvalue()
        (folder / f"{i:05d}.png").write_bytes(data)
        lines.append(
            json.dumps(
                {
                    "id": f"bench-{i:05d}",
                    "family": "SynthWords",
                    "image": f"{i:05d}.png",
                    "question": QUESTION,
                    "answer": word,
                    "source": {"sha256": hashlib.sha256(data).hexdigest()},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


# ----------------------------------------------------------------------------- processes
def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime+cutime+cstime in ticks) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), sum(int(f) for f in fields[11:15])


def tree_cpu_s(roots: list[int]) -> float:
    """CPU seconds of every process under `roots` (children that exited are in their
    parent's cutime/cstime once reaped)."""
    stats = {
        int(p): s
        for p in os.listdir("/proc")
        if p.isdigit()
        for s in [_stat(int(p))]
        if s is not None
    }
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, list(roots)
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo += children.get(pid, [])
    return total / CLK


SETTLED_CPU_S = 0.05  # CPU seconds per second of all services together: idle is about 0.015


def settle(pids: dict[str, int], timeout: float = 60.0) -> float:
    """Wait until the services are idle (a second in which all of them together use under
    SETTLED_CPU_S of CPU), so a run's CPU figure holds no worker's start: the generator
    and judge import transformers for their chat template as they start, about a second
    of CPU, and a fixed pause of 2 s after the stack is up sometimes ended before that.
    Returns the seconds waited."""
    start = time.monotonic()
    before = tree_cpu_s(list(pids.values()))
    while time.monotonic() - start < timeout:
        time.sleep(1.0)
        now = tree_cpu_s(list(pids.values()))
        if now - before < SETTLED_CPU_S:
            break
        before = now
    return time.monotonic() - start


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_reference(rounds: int = 21) -> dict[str, Any]:
    """The machine a CPU figure was measured on: its cores, its CPU model, and the CPU
    milliseconds one fixed piece of pure-Python work takes on it (JSON round trips, hashing,
    dict and string work: the kind the services do per item). The same code's CPU per item
    moves with this figure from one machine to another: an absolute figure from another
    machine is compared through it, a ratio needs it not (docs/performance.md, "How it is
    measured"). Shared virtual machines run the same work up to twice as slow from one
    moment to the next, so it is the median of `rounds` (and the fastest beside it). Taken
    before the stack starts, on an idle machine."""
    records = [
        {
            "id": f"item-{i:06d}",
            "family": "SynthWords",
            "question": QUESTION,
            "answer": [f"w{i:05d}x"],
            "meta": {"line": i, "score": i / 7, "flags": [i % 3 == 0, i % 5 == 0]},
        }
        for i in range(2000)
    ]
    took = []
    for _ in range(rounds):
        start = time.process_time()
        back = json.loads(json.dumps(records))
        answers = {
            hashlib.sha256(r["id"].encode()).hexdigest()[:16]: r["answer"][0].upper()
            for r in back
            if r["meta"]["score"] >= 0
        }
        "|".join(f"{k}={v}" for k, v in sorted(answers.items()))
        took.append(1000 * (time.process_time() - start))
    return {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "reference_cpu_ms": round(statistics.median(took), 2),
        "reference_cpu_ms_fastest": round(min(took), 2),
    }


def service_pids(stack: Stack) -> dict[str, int]:
    return {n: p for n in [*SERVICES, "api"] if (p := stack.pid(n)) is not None}


# ----------------------------------------------------------------------------- Triton
_METRIC = re.compile(r'^(nv_inference_\w+)\{model="([^"]+)",version="[^"]*"\}\s+([0-9.e+]+)$', re.M)


def triton_counters(stack: Stack) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{stack.config.triton_metrics_port}/metrics", timeout=5).text
    return {name: float(v) for name, model, v in _METRIC.findall(text) if model == MODEL}


class Sampler(threading.Thread):
    """Triton's own counters for the model every `period` seconds: items answered
    (`nv_inference_count`: a request of 16 items counts 16), batches executed, requests
    pending (queued + executing)."""

    def __init__(self, stack: Stack, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.stack, self.period, self.samples = stack, period, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                c = triton_counters(self.stack)
                self.samples.append(
                    (
                        time.monotonic() - self.t0,
                        c.get("nv_inference_count", 0.0),
                        c.get("nv_inference_exec_count", 0.0),
                        c.get("nv_inference_pending_request_count", 0.0),
                    )
                )
            except httpx.HTTPError:
                pass
            self.stop.wait(self.period)


def steady_state(samples: list[tuple[float, float, float, float]], total: int) -> dict[str, Any]:
    """Rate between 10% and 90% of the model's items (ramp-up and drain excluded)."""
    base = samples[0][1]
    lo = next(s for s in samples if s[1] - base >= 0.1 * total)
    hi = next(s for s in samples if s[1] - base >= 0.9 * total)
    rate = (hi[1] - lo[1]) / (hi[0] - lo[0])
    batches = hi[2] - lo[2]
    window = [s for s in samples if lo[0] <= s[0] <= hi[0]]
    pending = [s[3] for s in window]
    return {
        "items_per_s": rate,
        "window_s": hi[0] - lo[0],
        "mean_batch": (hi[1] - lo[1]) / batches if batches else 0.0,
        # requests (a request carries up to a batch of items), not items
        "inflight_mean": sum(pending) / max(1, len(pending)),
        "inflight_min": min(pending, default=0),
        "inflight_max": max(pending, default=0),
    }


# ----------------------------------------------------------------------------- floor
def floor_cpu_ms(pool: Path) -> dict[str, float]:
    """The same rules as the services, in one loop with no I/O: CPU ms per item."""
    from rsieve.clean.cleaning import clean_item, inspect_image, parse_line
    from rsieve.clean.provenance import verify_source
    from rsieve.compact.rows import assemble_rows
    from rsieve.generate.generation import ModelReply  # noqa: F401  (import cost outside)
    from rsieve.generate.think import parse_output
    from rsieve.images import prepare_image
    from rsieve.judge.cascade import apply_verdict, judge_prompt, needs_judge, verify_generation
    from rsieve.schemas import Generation, Item, PoolItem
    from rsieve.settings import Settings

    s = Settings()
    raws = (pool / "items.jsonl").read_bytes().splitlines()
    images = {p.name: p.read_bytes() for p in pool.glob("*.png")}
    start = time.process_time()
    outcomes, cleaned = [], 0
    for n, raw in enumerate(raws, start=1):
        parsed = parse_line(raw, n, text_max_chars=s.text_max_chars)
        assert isinstance(parsed, PoolItem)
        data = images[parsed.image]
        assert (
            inspect_image(data, max_pixels=s.image_max_pixels, max_bytes=s.image_max_bytes) is None
        )
        sha = hashlib.sha256(data).hexdigest()
        _, check = verify_source(parsed.source, sha, s.provenance_policy, None)
        item = clean_item(
            parsed,
            line=n,
            image_sha256=sha,
            provenance_check=check,
            policy=s.provenance_policy,
            pool_uri="s3://b/p/",
        )
        assert isinstance(item, Item)
        cleaned += 1
        image = prepare_image(data, max_side=s.image_max_side, max_pixels=s.image_max_pixels)
        tag = data.find(b"bench-answer\0")
        word = (
            data[tag + 13 : tag + 13 + 7].decode()
            if data[tag + 13 : tag + 18] != b"wrong"
            else "wrong"
        )
        text = f"<think>fixed-latency stand-in</think>{word}"
        parsed_out = parse_output(text, "stop")
        gen = Generation(
            item=item,
            model=MODEL,
            raw_output=text,
            finish_reason="stop",
            reasoning=parsed_out.reasoning,
            answer=parsed_out.answer,
            failure=parsed_out.failure,
            image_sent_sha256=image.sha256,
            image_sent=image.meta(),
        )
        outcome = verify_generation(gen)
        if needs_judge(outcome):
            prompt = judge_prompt(outcome)
            outcome = apply_verdict(
                outcome, model="judge-abstain", prompt=prompt, raw_output="<think>x</think>UNSURE"
            )
        outcomes.append(outcome)
    assemble_rows(outcomes, "bench")
    elapsed = time.process_time() - start
    return {"cpu_ms_per_item": 1000 * elapsed / len(raws), "items": len(raws)}


# ----------------------------------------------------------------------------- stack runs
def start_stack(
    root: Path,
    models: dict[str, Path],
    settings_env: dict[str, str],
    triton_env: dict[str, str] | None = None,
) -> Stack:
    repo = root / "models"
    for name, src in models.items():
        shutil.copytree(src, repo / name)
    config = StackConfig.free_ports(
        root / "state",
        model_repository=repo,
        models=list(models),
        settings_env=settings_env,
        triton_env=triton_env or {},
    )
    stack = Stack(config)
    stack.up()
    return stack


def submit(
    stack: Stack, pool: Path, dataset: str, sampling: dict[str, Any] | None = None
) -> tuple[str, Any]:
    from rsieve.adapters.pools import upload_pool
    from rsieve.adapters.storage import S3Store
    from rsieve.settings import Settings
    from rsieve_cli.client import submit as submit_run

    settings = Settings.from_env_map(stack.config.env())
    store = S3Store(settings)
    uri = upload_pool(store, pool)
    return submit_run(settings, uri, dataset, sampling), settings


def wait_done(settings: Any, run: str, timeout: float) -> dict[str, Any]:
    from rsieve_cli.client import wait_for_run

    return wait_for_run(settings, run, timeout=timeout, poll_s=2.0)


def pipeline_run(stack: Stack, pool: Path, items: int) -> dict[str, Any]:
    pids = service_pids(stack)
    settle(pids)
    before = {n: tree_cpu_s([p]) for n, p in pids.items()}
    cpu0, wall0 = tree_cpu_s(list(pids.values())), time.monotonic()
    sampler = Sampler(stack)
    sampler.start()
    run, settings = submit(stack, pool, "bench-pipeline")
    status = wait_done(settings, run, timeout=1800)
    wall = time.monotonic() - wall0
    cpu = tree_cpu_s(list(pids.values())) - cpu0
    sampler.stop.set()
    sampler.join()
    per = {n: round(tree_cpu_s([p]) - before[n], 2) for n, p in pids.items()}
    steady = steady_state(sampler.samples, items)
    timeline = [
        {"t": round(t, 2), "done": int(d - sampler.samples[0][1]), "inflight": int(q)}
        for t, d, _, q in sampler.samples[::4]
    ]
    return {
        "run": run,
        "items": items,
        "wall_s": wall,
        "service_cpu_s": cpu,
        "cpu_ms_per_item": 1000 * cpu / items,
        "cpu_s_by_service": per,
        "steady": steady,
        "gpu_saturation_ratio": steady["items_per_s"] / IDEAL,
        "adds_up": status.get("manifest", {}).get("adds_up"),
        "timeline": timeline,
        "settings": settings,
    }


def verify_pass(stack: Stack, settings: Any, run: str, shards: dict[str, int]) -> float:
    """Seconds for the verify queue to redo every shard of `run`."""
    import redis

    from rsieve.adapters.queues import enqueue, make_celery
    from rsieve.adapters.storage import S3Store

    store, r = S3Store(settings), redis.Redis.from_url(settings.redis_url)
    for key in list(store.list(f"runs/{run}/verify/")):
        store.delete(key)
    for key in r.scan_iter(redis_keys.stage_pattern("verify", run)):
        r.delete(key)
    app = make_celery(settings)
    start = time.monotonic()
    for shard, lines in shards.items():
        enqueue(app, "rsieve.verify", run=run, shard=shard, lines=lines)
    while sum(1 for _ in store.list(f"runs/{run}/verify/")) < len(shards):
        time.sleep(0.05)
    return time.monotonic() - start


def scale_out(stack: Stack, settings: Any, run: str) -> dict[str, Any]:
    """The verify stage over the run's shards with one worker, then with two."""
    from rsieve.adapters.storage import S3Store

    index = json.loads(S3Store(settings).get(f"runs/{run}/shards.json"))
    shards = dict(index["shards"])
    one = verify_pass(stack, settings, run, shards)
    extra = stack.start_service("verifier", log_name="verifier-2")
    try:
        time.sleep(8)  # the second worker's start (imports, broker connection)
        two = verify_pass(stack, settings, run, shards)
    finally:
        os.killpg(extra.pid, 15)
        extra.wait(30)
    items = index["lines"]
    return {
        "stage": "verify",
        "shards": len(shards),
        "items": items,
        "one_worker_items_per_s": items / one,
        "two_workers_items_per_s": items / two,
        "ratio": one / two,
    }


def time_to_first_result(root: Path) -> dict[str, Any]:
    """`rsieve run examples/pool` with the stack already up (the second `make run`, on a
    new dataset so the run is new), and with the stack stopped but installed."""
    state = root / "ttfr"
    config = StackConfig.free_ports(state)
    state.mkdir(parents=True)
    (state / "config.json").write_text(
        json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in config.__dict__.items()})
    )
    env = {**os.environ, "RSIEVE_STACK_DIR": str(state)}
    rsieve = str(Path(sys.executable).with_name("rsieve"))
    out: dict[str, Any] = {}
    try:
        for label, dataset in (("stack_stopped_s", "ttfr-cold"), ("stack_up_s", "ttfr-warm")):
            start = time.monotonic()
            subprocess.run(
                [
                    rsieve,
                    "run",
                    str(ROOT / "examples" / "pool"),
                    "--out",
                    str(root / "ttfr-out"),
                    "--dataset",
                    dataset,
                ],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )
            out[label] = time.monotonic() - start
            out[f"{label[:-2]}_load_average"] = os.getloadavg()
            # What bounds it: the judge's calls (fresh and reused) from the run's report.
            report = json.loads((root / "ttfr-out" / dataset / "run_report.json").read_text())
            out[f"{label[:-2]}_judge"] = {
                "model": [j["model"] for j in report["models"]["judges"]],
                "verdicts": sum(
                    sum(f["judge_verdicts"].values()) for f in report["families"].values()
                ),
                "reused": report.get("judge_reused"),
            }
    finally:
        subprocess.run([rsieve, "stack", "down"], env=env, stdout=subprocess.DEVNULL, cwd=ROOT)
    return out


# ----------------------------------------------------------------------------- side benches
def protocol_figures() -> dict[str, Any]:
    import random

    from bench import bench_protocols as bp
    from rsieve.verify import PROTOCOLS

    data = bp.inputs(random.Random(11))
    return {name: bp.rate(PROTOCOLS[name], data[name], 0.2) for name in sorted(PROTOCOLS)}


def trace_figures() -> dict[str, Any]:
    from bench import bench_traces

    return bench_traces.measure(quick=True)


def compaction_figures(images: int = 10_000, per_image: int = 10) -> dict[str, Any]:
    from bench import bench_compaction as bc

    stream = bc._measure(bc._streaming, images, per_image)
    return {
        "qa_entries": images * per_image,
        "images": images,
        "seconds": stream["seconds"],
        "qa_per_s": images * per_image / stream["seconds"],
        "peak_rss_mb": stream["peak_rss_mb"],
    }


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--no-ttfr", action="store_true")
    parser.add_argument(
        "--only-ttfr",
        action="store_true",
        help="measure time to first result alone and merge it into --out",
    )
    parser.add_argument("--no-scale-out", action="store_true")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument(
        "--no-engine",
        action="store_true",
        help="skip the continuous-batching engine bench (bench_engine.py)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args()
    if args.only_ttfr:
        root = Path(tempfile.mkdtemp(prefix="rsieve-bench-"))
        previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
        previous["time_to_first_result"] = time_to_first_result(root)
        args.out.write_text(json.dumps(previous, indent=1, default=str))
        print(json.dumps(previous["time_to_first_result"], indent=1))
        shutil.rmtree(root, ignore_errors=True)
        return
    machine = machine_reference()

    root = Path(tempfile.mkdtemp(prefix="rsieve-bench-"))
    pool = make_pool(root / "pool", args.items)
    models = {
        MODEL: ROOT / "bench" / "triton_models" / MODEL,
        "judge-abstain": ROOT / "deploy" / "triton" / "cpu" / "judge-abstain",
    }
    env = {
        "RSIEVE_GENERATOR_MODEL": MODEL,
        "RSIEVE_JUDGE_MODEL": "judge-abstain",
        "RSIEVE_PURITY_EMBEDDING": "false",
    }
    print(f"starting the stack in {root} ...", flush=True)
    stack = start_stack(root / "stack", models, env)
    results: dict[str, Any] = {}
    try:
        print(f"pipeline: {args.items} items ...", flush=True)
        run = pipeline_run(stack, pool, args.items)
        settings = run.pop("settings")
        results["pipeline"] = run
        if not args.no_scale_out:
            print("scale-out: verify with one worker, then two ...", flush=True)
            results["scale_out"] = scale_out(stack, settings, run["run"])
    finally:
        if not args.keep:
            stack.down()
    print("floor: the same rules in one loop ...", flush=True)
    results["floor"] = floor_cpu_ms(pool)
    print("protocols and compaction ...", flush=True)
    results["protocols_decisions_per_s"] = protocol_figures()
    results["compaction"] = compaction_figures()
    results["trace_gate"] = trace_figures()
    if not args.no_ttfr:
        print("time to first result: rsieve run examples/pool ...", flush=True)
        results["time_to_first_result"] = time_to_first_result(root)
    results["gpu_saturation_ratio"] = run["gpu_saturation_ratio"]
    results["cpu_ms_per_item"] = run["cpu_ms_per_item"]
    if not args.no_engine:
        from bench import bench_engine

        engine = bench_engine.bench(args.items, machine=machine)
        results["engine"] = engine
        for key in (
            "engine_saturation_ratio",
            "engine_cpu_ms_per_item",
            "engine_scaleout_ratio",
            "prefill_tokens_ratio",
            "loop_tokens_saved_ratio",
        ):
            results[key] = engine[key]
    results["conditions"] = {
        "machine": f"{os.cpu_count()} cores, no GPU; all processes on it",
        "machine_reference": machine,
        "model": f"{MODEL}: {BATCH_S} s per batch of up to {BATCH} (ideal {IDEAL:.0f} items/s)",
        "judge": "judge-abstain (instant UNSURE)",
        "items": args.items,
        "settings": {
            k: getattr(settings, k)
            for k in ("shard_size", "max_inflight", "worker_concurrency", "generator_concurrency")
        },
        "load_average": os.getloadavg(),
    }
    if args.keep:
        print(
            f"the stack is still up: {root / 'stack' / 'state'} (RSIEVE_STACK_DIR=... "
            "rsieve stack down)"
        )
    else:
        shutil.rmtree(root, ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    if "engine" in results:
        from bench import bench_engine

        print(
            "\nthe production path (vLLM interface) against a continuous-batching engine stand-in:"
        )
        bench_engine.print_table(results["engine"])


def print_table(r: dict[str, Any]) -> None:
    p, c = r["pipeline"], r["conditions"]
    rows = [
        (
            "gpu_saturation_ratio",
            f"{r['gpu_saturation_ratio']:.3f}",
            f"{p['steady']['items_per_s']:.1f} items/s steady (10-90%) / {c['model']}",
        ),
        (
            "  mean batch, in flight",
            f"{p['steady']['mean_batch']:.1f}",
            f"requests at Triton mean {p['steady']['inflight_mean']:.1f} "
            f"(min {p['steady']['inflight_min']:.0f}, max {p['steady']['inflight_max']:.0f})",
        ),
        (
            "cpu_ms_per_item",
            f"{r['cpu_ms_per_item']:.2f}",
            f"workers + API, /proc utime+stime, {p['items']} items, {p['wall_s']:.0f} s wall",
        ),
        (
            "  floor (in-process rules)",
            f"{r['floor']['cpu_ms_per_item']:.2f}",
            "same rules, one loop, no I/O, no queue",
        ),
    ]
    if "scale_out" in r:
        s = r["scale_out"]
        rows.append(
            (
                "scale-out verify 2 vs 1",
                f"{s['ratio']:.2f}x",
                f"{s['one_worker_items_per_s']:.0f} -> {s['two_workers_items_per_s']:.0f}"
                f" items/s, {s['shards']} shards, 2 cores shared with the stack",
            )
        )
    for name, rate in r["protocols_decisions_per_s"].items():
        rows.append((f"verify {name}", f"{rate:,.0f}/s", "decisions/s, one process"))
    comp = r["compaction"]
    rows.append(
        (
            "compaction",
            f"{comp['qa_per_s']:,.0f} qa/s",
            f"{comp['qa_entries']:,} qa over {comp['images']:,} images, streaming writer",
        )
    )
    for t in r.get("trace_gate", {}).values():
        rows.append(
            (
                f"trace gate, {t['chars_mean']} chars",
                f"{t['us_per_item']:.0f} us",
                f"CPU per accepted item, every check (target 100 us); "
                f"{t['ratio_to_split']}x str.split of the trace",
            )
        )
    if "time_to_first_result" in r:
        t = r["time_to_first_result"]
        rows.append(
            (
                "time to first result",
                f"{t['stack_up_s']:.1f} s",
                "rsieve run examples/pool (36 items), stack up, to the export",
            )
        )
        rows.append(
            (
                "  stack stopped",
                f"{t['stack_stopped_s']:.1f} s",
                "same, stack installed but stopped (includes its start)",
            )
        )
    print(f"\n{'figure':<28}{'value':>14}  conditions")
    for name, value, cond in rows:
        print(f"{name:<28}{value:>14}  {cond}")
    print(
        f"settings: {c['settings']}; {c['machine']}; load average at the end "
        f"{c['load_average'][0]:.1f} (other work on the machine skews every figure); "
        f"reference work {c['machine_reference']['reference_cpu_ms']} ms CPU "
        f"({c['machine_reference']['cpu_model']})"
    )


if __name__ == "__main__":
    main()
