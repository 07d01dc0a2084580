"""bench/bench_scale.py's arithmetic: the smallest size repeated around the others, its
figures from its median run, and the ratios against that run."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return importlib.import_module("bench.bench_scale")


def _run(cpu: float, peak: float, items: int = 20) -> dict:
    return {
        "items": items,
        "cpu_ms_per_item": cpu,
        "peak_rss_mb": {"cleaner": peak, "api": peak / 2},
        "peak_process_rss_mb": {"cleaner": peak / 2, "api": peak / 4},
        "longest_task": {"by_task_s": {"rsieve.compact": cpu}},
    }


def test_the_small_size_runs_before_and_after_the_others(bench: ModuleType) -> None:
    assert bench.run_order([20, 200], 3) == [20, 20, 200, 20]
    assert bench.run_order([20, 200], 1) == [20, 200]
    assert bench.run_order([20, 100, 200], 2) == [20, 100, 200, 20]


def test_a_size_is_its_median_run_whole(bench: ModuleType) -> None:
    runs = [_run(3.0, 900), _run(1.0, 100), _run(2.0, 500)]
    median = bench.median_run(runs)
    # one run's figures, not a mix: the median CPU run's own peak comes with it
    assert (median["cpu_ms_per_item"], median["peak_rss_mb"]["cleaner"]) == (2.0, 500)
    assert median["repeats"]["cpu_ms_per_item"] == [3.0, 1.0, 2.0]
    assert median["repeats"]["cpu_spread"] == 3.0
    assert bench.median_run([_run(1.0, 1), _run(4.0, 1)])["cpu_ms_per_item"] == 1.0


def test_ratios_against_the_median_with_the_range_beside(bench: ModuleType) -> None:
    small = bench.median_run([_run(2.0, 400), _run(2.5, 500), _run(1.6, 300)])
    large = bench.median_run([_run(2.2, 440, items=200)])
    out = bench.summary([small, large])
    assert out["cost_ratio"] == 1.1
    assert out["cost_ratio_range"] == [0.88, 1.375]
    assert out["peak_rss_ratio"] == 1.1


def test_the_machine_reference_is_the_median_of_its_rounds(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference work's CPU, so that figures from two machines can be compared: the
    median round (a shared machine's speed moves from moment to moment), and the fastest
    beside it, in milliseconds."""
    pipeline = importlib.import_module("bench.bench_pipeline")  # imported by bench_scale
    clock = iter([10.0, 10.05, 20.0, 20.03, 30.0, 30.04])
    monkeypatch.setattr(pipeline.time, "process_time", lambda: next(clock))
    reference = pipeline.machine_reference(rounds=3)
    assert reference["reference_cpu_ms"] == 40.0
    assert reference["reference_cpu_ms_fastest"] == 30.0
    assert reference["cores"] == os.cpu_count()
    assert reference["cpu_model"]
