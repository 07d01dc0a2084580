"""How the pipeline's own cost grows with pool size: one run per size on the real local stack.

    .venv/bin/python -m bench.bench_scale [--sizes 20000,200000] [--repeat-small 3]
                                          [--out bench/scale.json] [--keep]

For each size a fresh local stack (rsieve_cli.local.stack: Redis, SeaweedFS, Triton, one
worker per service, the API; bench_pipeline.start_stack) runs a synthetic pool of that many
items as its own dataset. The generator's model is `instant-standin` (bench/triton_models):
a STAND-IN, not a model, that answers at once with the answer the pool wrote into each
image's PNG tEXt chunk, so model time is about zero and what is measured is the rsieve
services' own work. `judge-abstain` (an instant UNSURE) judges.

The pool: the families of scripts/make_example_pool.py (SynthWords and SynthAmounts on the
alnum protocol, SynthChoice on mc), each image a tiny PNG of random blocks (distinct
sha256 and distinct perceptual hashes, so no line is a near-duplicate of another), a
quarter of them answered wrong by the stand-in (those go to the judge).

Per size:
- cpu_ms_per_item: CPU seconds of every service's process tree (workers, their children,
  the API; /proc utime+stime, as bench_pipeline) over the run, per item;
- peak_rss_mb: per service, the largest RSS of its process tree (sum over the tree,
  sampled every 0.5 s with psutil), and the largest single process (prefork children
  share pages, which the sum counts once per child);
- stages: seconds after submission when ingest and compaction (from the workers' logs:
  ingest's one task; compaction's coordinator, routing and partition tasks) started and
  ended, and when each shard stage stored its first and last
  shard (the workers' Redis progress records, rsieve.adapters.metrics.progress);
- longest task: the longest task of the run (Celery's "succeeded in" log lines), and its
  share of task_time_limit_s, past which Celery kills it.

The smallest size runs `--repeat-small` times (3), before and after the others, each on a
fresh stack; its figures are those of its median run (by CPU per item), with every run's
CPU per item beside them. A run of the small size lasts under a minute, so a few seconds of
anything else on the machine move its CPU per item by 10-20%: more than the margin the
ratio's target leaves. Repeating the small size costs a few minutes; the large size, 10-15
minutes a run, runs once.

Top level: cost_ratio (cpu_ms_per_item, largest size / the smallest's median run), with
cost_ratio_range (against the smallest size's dearest and cheapest run), and peak_rss_ratio
(the largest service peak at the largest size / at the smallest). Writes bench/scale.json
after every run and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import redis
from PIL import Image, PngImagePlugin

from bench.bench_pipeline import (
    machine_reference,
    service_pids,
    settle,
    start_stack,
    submit,
    tree_cpu_s,
)
from rsieve.adapters.metrics import progress
from rsieve.schemas import STAGES
from rsieve_cli.local.stack import Stack
from scripts.make_example_pool import AMOUNTS_QUESTION, LETTERS, WORDS_QUESTION, choice_question

ROOT = Path(__file__).resolve().parents[1]

MODEL = "instant-standin"
JUDGE = "judge-abstain"
MODELS = {
    MODEL: ROOT / "bench" / "triton_models" / MODEL,
    JUDGE: ROOT / "deploy" / "triton" / "cpu" / JUDGE,
}
SETTINGS = {
    "RSIEVE_GENERATOR_MODEL": MODEL,
    "RSIEVE_JUDGE_MODEL": JUDGE,
    "RSIEVE_PURITY_EMBEDDING": "false",
}
SERVICE_NAMES = ("cleaner", "generator", "verifier", "judge", "compactor", "api")
RSS_PERIOD_S = 0.5
WRONG_EVERY = 4  # every 4th item is answered wrong by the stand-in (and goes to the judge)
_SUCCEEDED = re.compile(r"^Task (\S+)\[[^\]]+\] succeeded in ([0-9.e+-]+)s")


# ----------------------------------------------------------------------------- the pool
def _png(rng: random.Random, answer: str) -> bytes:
    """A 48x48 grey PNG of 8x8 random blocks (its own perceptual hash) carrying the
    stand-in's answer in a tEXt chunk."""
    img = Image.frombytes("L", (8, 8), rng.randbytes(64))
    img = img.resize((48, 48), Image.Resampling.NEAREST)
    meta = PngImagePlugin.PngInfo()
    meta.add_text("bench-answer", answer)
    buf = io.BytesIO()
    img.save(buf, format="PNG", pnginfo=meta)
    return buf.getvalue()


def _item(i: int, rng: random.Random) -> tuple[dict[str, Any], str]:
    """Line `i` of the pool without its image, and the answer the stand-in will give."""
    wrong = i % WRONG_EVERY == WRONG_EVERY - 1
    kind = i % 10
    if kind < 5:
        word = f"w{i:06d}x"
        rec = {"family": "SynthWords", "question": WORDS_QUESTION, "answer": word}
        return rec, "wrong" if wrong else word
    if kind < 8:
        digits = f"{rng.randrange(10**6, 10**8)}"
        rec = {"family": "SynthAmounts", "question": AMOUNTS_QUESTION, "answer": digits}
        return rec, "wrong" if wrong else digits
    options = [f"o{i:06d}{letter.lower()}" for letter in LETTERS]
    right = i % len(LETTERS)
    rec = {
        "family": "SynthChoice",
        "question": choice_question(options),
        "answer": LETTERS[right],
        "protocol": "mc",
    }
    return rec, LETTERS[(right + 1) % len(LETTERS)] if wrong else LETTERS[right]


def make_scale_pool(folder: Path, count: int, seed: int) -> Path:
    """`count` items (items.jsonl and one PNG each) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with (folder / "items.jsonl").open("w") as lines:
        for i in range(count):
            rec, said = _item(i, rng)
            data = _png(rng, said)
            name = f"{i:06d}.png"
            (folder / name).write_bytes(data)
            source = {
                "generator": "bench/bench_scale.py",
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            line = {"id": f"scale-{i:06d}", "image": name, "source": source, **rec}
            lines.write(json.dumps(line) + "\n")
    return folder


# ----------------------------------------------------------------------------- memory
def tree_rss(pid: int) -> tuple[int, int]:
    """(sum, largest) RSS in bytes of a process and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    sizes = []
    for p in procs:
        try:
            sizes.append(p.memory_info().rss)
        except psutil.Error:
            pass
    return sum(sizes), max(sizes, default=0)


class RssSampler(threading.Thread):
    """Every `period` seconds, each service tree's RSS; keeps the peaks."""

    def __init__(self, pids: dict[str, int], period: float = RSS_PERIOD_S) -> None:
        super().__init__(daemon=True)
        self.pids, self.period = pids, period
        self.peak_tree = dict.fromkeys(pids, 0)
        self.peak_proc = dict.fromkeys(pids, 0)
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for name, pid in self.pids.items():
                total, largest = tree_rss(pid)
                self.peak_tree[name] = max(self.peak_tree[name], total)
                self.peak_proc[name] = max(self.peak_proc[name], largest)
            self.samples += 1
            self.stop.wait(self.period)


def _mb(peaks: dict[str, int]) -> dict[str, float]:
    return {name: round(b / 2**20, 1) for name, b in peaks.items()}


# ----------------------------------------------------------------------------- what the run left
def task_log(
    logs: Path, run: str, services: tuple[str, ...] = SERVICE_NAMES[:-1]
) -> list[dict[str, Any]]:
    """Every task of `run` the workers of `services` logged as finished: task name, end
    (epoch s), seconds."""
    done = []
    for service in services:
        path = logs / f"{service}.log"
        if not path.exists():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            if f'"{run}"' not in raw:
                continue
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            found = _SUCCEEDED.match(entry.get("msg", ""))
            if found and entry.get("run") == run:
                done.append({"task": found[1], "end": entry["ts"], "s": float(found[2])})
    return done


def wait_for_compaction(logs: Path, run: str, timeout: float) -> None:
    """The run is done once its manifest is stored; the compaction task ends a little later
    (the browsing copies of the commit), and its log line with it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(t["task"] == "rsieve.compact" for t in task_log(logs, run, ("compactor",))):
            return
        time.sleep(0.5)


def log_errors(logs: Path, run: str) -> int:
    """Log lines at level error or above that name `run` (retries, failures, time limits)."""
    count = 0
    for service in SERVICE_NAMES[:-1]:
        path = logs / f"{service}.log"
        for raw in path.read_text(errors="replace").splitlines() if path.exists() else []:
            if f'"{run}"' in raw and ('"level": "error"' in raw or '"level": "critical"' in raw):
                count += 1
    return count


def stage_times(
    redis_url: str, run: str, submitted: float, tasks: list[dict[str, Any]]
) -> dict[str, dict[str, float | int | None]]:
    """Seconds after submission: ingest and compaction start and end (their tasks);
    each shard stage's first and last stored shard (Redis progress records)."""

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - submitted, 2)

    out: dict[str, dict[str, float | int | None]] = {}
    for stage, task in (("ingest", "rsieve.ingest"), ("compact", "rsieve.compact")):
        # Compaction: the coordinator and, for a run of several partitions, its routing
        # and partition tasks (services/compactor): from the first start to the last end.
        runs = [t for t in tasks if t["task"] == task or t["task"].startswith(task + "_")]
        out[stage] = (
            {
                "start_s": rel(min(t["end"] - t["s"] for t in runs)),
                "end_s": rel(max(t["end"] for t in runs)),
                "task_s": max(t["s"] for t in runs),
                "tasks": len(runs),
            }
            if runs
            else {}
        )
    client = redis.Redis.from_url(redis_url)
    try:
        records = progress(client, run, STAGES)
    finally:
        client.close()
    for stage in STAGES:
        rec = records[stage]
        out[stage] = {
            "shards": rec["shards"],
            "first_s": rel(rec["first_t"]),
            "end_s": rel(rec["last_t"]),
        }
    order = ["ingest", *STAGES, "compact"]
    return {stage: out[stage] for stage in order}


def longest_tasks(tasks: list[dict[str, Any]], limit_s: float) -> dict[str, Any]:
    """The longest task of each kind, and the longest of all with its share of the limit."""
    by_task: dict[str, float] = {}
    for t in tasks:
        by_task[t["task"]] = max(by_task.get(t["task"], 0.0), t["s"])
    name = max(by_task, key=lambda k: by_task[k], default=None)
    return {
        "task": name,
        "seconds": round(by_task.get(name, 0.0), 3) if name else None,
        "share_of_time_limit": round(by_task[name] / limit_s, 4) if name else None,
        "task_time_limit_s": limit_s,
        "by_task_s": {k: round(v, 3) for k, v in sorted(by_task.items())},
        "tasks": len(tasks),
    }


# ----------------------------------------------------------------------------- one size
def run_size(stack: Stack, pool: Path, items: int) -> dict[str, Any]:
    """One run of `pool` on `stack`: CPU, RSS peaks, stage times, longest task, wall."""
    from rsieve_cli.client import wait_for_run

    pids = service_pids(stack)
    settle(pids)
    before = {n: tree_cpu_s([p]) for n, p in pids.items()}
    sampler = RssSampler(pids)
    sampler.start()
    t0 = time.time()
    run, settings = submit(stack, pool, f"bench-scale-{items}")
    status = wait_for_run(settings, run, timeout=900 + 0.1 * items, poll_s=1.0)
    done_at = time.time()
    wait_for_compaction(stack.logs, run, timeout=120)
    sampler.stop.set()
    sampler.join()
    cpu = {n: tree_cpu_s([p]) - before[n] for n, p in pids.items()}
    submitted = float(status.get("submitted_at") or t0)
    tasks = task_log(stack.logs, run)
    total_cpu = sum(cpu.values())
    return {
        "run": run,
        "items": items,
        "upload_and_submit_s": round(submitted - t0, 2),
        "wall_s": round(done_at - submitted, 2),
        "service_cpu_s": round(total_cpu, 2),
        "cpu_ms_per_item": round(1000 * total_cpu / items, 3),
        "cpu_s_by_service": {n: round(v, 2) for n, v in cpu.items()},
        "peak_rss_mb": _mb(sampler.peak_tree),
        "peak_process_rss_mb": _mb(sampler.peak_proc),
        "rss_samples": sampler.samples,
        "stages": stage_times(settings.redis_url, run, submitted, tasks),
        "longest_task": longest_tasks(tasks, float(settings.task_time_limit_s)),
        "log_errors": log_errors(stack.logs, run),
        "adds_up": (status.get("manifest") or {}).get("adds_up"),
        "shard_size": settings.shard_size,
    }


def bench_size(root: Path, items: int, keep: bool) -> dict[str, Any]:
    """A pool of `items`, a fresh stack, the run, the stack stopped (unless `keep`)."""
    start = time.monotonic()
    pool = make_scale_pool(root / "pool", items, seed=items)
    made = time.monotonic() - start
    print(f"  pool of {items:,} made in {made:.0f} s; starting the stack ...", flush=True)
    stack = start_stack(root / "stack", MODELS, SETTINGS)
    try:
        print(f"  running {items:,} items ...", flush=True)
        result = run_size(stack, pool, items)
    finally:
        if keep:
            print(f"  the stack is still up: RSIEVE_STACK_DIR={stack.dir} rsieve stack down")
        else:
            stack.down()
    if not keep:
        shutil.rmtree(pool, ignore_errors=True)
    result["pool_make_s"] = round(made, 1)
    result["bench_s"] = round(time.monotonic() - start, 1)
    return result


# ----------------------------------------------------------------------------- report
def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Of several runs of one size, the one whose CPU per item is the median (the lower of
    the two middle ones for an even count), with every run's CPU per item and peak beside
    it: the size's figures are that run's, so they come from one run, not a mix."""
    ordered = sorted(runs, key=lambda r: r["cpu_ms_per_item"])
    out = dict(ordered[(len(ordered) - 1) // 2])
    out["repeats"] = {
        "runs": len(runs),
        "cpu_ms_per_item": [r["cpu_ms_per_item"] for r in runs],
        "largest_peak_rss_mb": [max(r["peak_rss_mb"].values()) for r in runs],
        "cpu_spread": round(ordered[-1]["cpu_ms_per_item"] / ordered[0]["cpu_ms_per_item"], 3),
    }
    return out


def summary(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    small, large = sizes[0], sizes[-1]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    small_cpu = small.get("repeats", {}).get("cpu_ms_per_item", [small["cpu_ms_per_item"]])
    return {
        "cost_ratio": ratio(large["cpu_ms_per_item"], small["cpu_ms_per_item"]),
        # what the ratio would be against the dearest and the cheapest run of the small size
        "cost_ratio_range": [
            ratio(large["cpu_ms_per_item"], max(small_cpu)),
            ratio(large["cpu_ms_per_item"], min(small_cpu)),
        ],
        "peak_rss_ratio": ratio(
            max(large["peak_rss_mb"].values()), max(small["peak_rss_mb"].values())
        ),
        "peak_process_rss_ratio": ratio(
            max(large["peak_process_rss_mb"].values()), max(small["peak_process_rss_mb"].values())
        ),
        "peak_rss_ratio_by_service": {
            n: ratio(large["peak_rss_mb"][n], small["peak_rss_mb"][n]) for n in small["peak_rss_mb"]
        },
        "longest_task_ratio_by_task": {
            t: ratio(large["longest_task"]["by_task_s"].get(t, 0.0), s)
            for t, s in small["longest_task"]["by_task_s"].items()
        },
    }


def run_order(sizes: list[int], repeat_small: int) -> list[int]:
    """The smallest size `repeat_small` times, around the others (half before, half after),
    so a drift of the machine during the bench reaches both sides of the ratio."""
    small, rest = sizes[0], sizes[1:]
    before = (repeat_small + 1) // 2
    return [small] * before + rest + [small] * (repeat_small - before)


def _cell(value: float | int | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def print_table(result: dict[str, Any]) -> None:
    sizes = result["sizes"]
    print(f"\n{'items':>9} {'wall s':>8} {'cpu ms/item':>12} {'longest task':>28} {'of limit':>9}")
    for r in sizes:
        lt = r["longest_task"]
        print(
            f"{r['items']:>9,} {r['wall_s']:>8.1f} {r['cpu_ms_per_item']:>12.2f} "
            f"{(lt['task'] or '-') + ' ' + _cell(lt['seconds']) + ' s':>28} "
            f"{_cell(100 * (lt['share_of_time_limit'] or 0)) + '%':>9}"
        )
    print("\npeak RSS MB per service: process tree / largest process")
    print(f"{'items':>9}" + "".join(f"{n:>17}" for n in SERVICE_NAMES))
    for r in sizes:
        cells = "".join(
            f"{_cell(r['peak_rss_mb'].get(n)) + ' / ' + _cell(r['peak_process_rss_mb'].get(n)):>17}"
            for n in SERVICE_NAMES
        )
        print(f"{r['items']:>9,}{cells}")
    order = list(sizes[0]["stages"])
    print("\nstages, s after submission (ingest/compact: end and task s; shard stages: first-last)")
    print(f"{'items':>9}" + "".join(f"{s:>17}" for s in order))
    for r in sizes:
        stage_cells = []
        for stage in order:
            st = r["stages"][stage]
            if "task_s" in st:
                stage_cells.append(f"{_cell(st['end_s'])} ({_cell(st['task_s'])})")
            else:
                stage_cells.append(f"{_cell(st.get('first_s'))}-{_cell(st.get('end_s'))}")
        print(f"{r['items']:>9,}" + "".join(f"{c:>17}" for c in stage_cells))
    print("\nlongest task of each kind, s:")
    for r in sizes:
        by = r["longest_task"]["by_task_s"]
        print(
            f"{r['items']:>9,}  "
            + ", ".join(f"{k.removeprefix('rsieve.')} {v:.2f}" for k, v in by.items())
        )
    for r in sizes:
        if r["repeats"]["runs"] > 1:
            cpu = ", ".join(f"{c:.2f}" for c in r["repeats"]["cpu_ms_per_item"])
            print(f"\n{r['items']:,} items, {r['repeats']['runs']} runs: cpu ms/item {cpu}")
    if len(sizes) > 1:
        low, high = result["cost_ratio_range"]
        print(
            f"\ncost_ratio {result['cost_ratio']} (against the median run of the smallest size; "
            f"{low}-{high} against its dearest and cheapest)  peak_rss_ratio "
            f"{result['peak_rss_ratio']}; log errors: "
            + ", ".join(f"{r['items']:,}: {r['log_errors']}" for r in sizes)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="20000,200000", help="pool sizes, comma separated")
    parser.add_argument(
        "--repeat-small",
        type=int,
        default=3,
        help="runs of the smallest size (its figures are the median run's)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "scale.json")
    parser.add_argument("--keep", action="store_true", help="leave each stack and pool in place")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    order = run_order(sizes, max(1, args.repeat_small)) if len(sizes) > 1 else sizes

    machine = machine_reference()
    root = Path(tempfile.mkdtemp(prefix="rsieve-scale-"))
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    result: dict[str, Any] = {"sizes": []}
    try:
        for k, n in enumerate(order):
            print(f"size {n:,}, run {k + 1} of {len(order)} ({root / str(k)})", flush=True)
            runs[n].append(bench_size(root / str(k), n, args.keep))
            result["sizes"] = [median_run(runs[m]) for m in sizes if runs[m]]
            result.update(summary(result["sizes"]))
            result["order"] = order
            result["conditions"] = {
                "machine": f"{os.cpu_count()} cores; every process on it",
                "model": f"{MODEL} (a stand-in: answers at once), judge {JUDGE}",
                "stack": "a fresh local stack per run, one worker per service",
                "load_average": os.getloadavg(),
                "machine_reference": machine,
            }
            args.out.write_text(json.dumps(result, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print_table(result)
    print(
        f"machine: {machine['cores']} cores ({machine['cpu_model']}), reference work "
        f"{machine['reference_cpu_ms']} ms CPU\nwritten: {args.out}"
    )


if __name__ == "__main__":
    main()
