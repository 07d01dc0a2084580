"""The vllm-engine-standin's scheduler (bench/triton_models/vllm-engine-standin/1/engine.py)
on a fake clock: capacity, KV budget, preemption, the peak formulas and the integrals the
benchmark reads, all asserted as numbers."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ENGINE_PY = (
    Path(__file__).resolve().parents[2]
    / "bench"
    / "triton_models"
    / "vllm-engine-standin"
    / "1"
    / "engine.py"
)


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_engine_standin", ENGINE_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


engine_mod = _load()
EPS = 1e-9  # step boundaries are sums of floats: "at" a boundary means just after it
# engine.py is loaded from its file (its folder is no package), so mypy does not see its
# types: an engine is Any here.
Engine = engine_mod.Engine


def test_one_sequence_finishes_after_its_steps_and_its_prefill() -> None:
    eng = Engine(
        max_num_seqs=4,
        step_base_ms=4,
        step_per_seq_ms=1,
        prefill_ms_per_token=0.5,
        kv_budget_tokens=10_000,
    )
    eng.submit("a", prompt_tokens=100, output_tokens=50, now=10.0)
    end = 10.0 + 100 * 0.0005 + 50 * 0.005  # prefill 50 ms, then 50 steps of 5 ms
    assert eng.next_event_time(10.0) == pytest.approx(end)
    assert eng.advance(end - 1e-6) == []
    assert eng.clock == 49  # every whole step before `now` is credited
    assert eng.advance(end + EPS) == [("a", 50)]
    assert (eng.generated_tokens, eng.prefill_tokens, eng.steps) == (50, 100, 50)
    assert eng.prefill_seconds == pytest.approx(0.05)
    assert eng.busy_seconds == pytest.approx(0.30) and eng.kv_used == 0
    assert eng.next_event_time(end + EPS) is None


def test_max_num_seqs_is_never_exceeded() -> None:
    rng = random.Random(1)
    eng = Engine(
        max_num_seqs=4,
        step_base_ms=2,
        step_per_seq_ms=0.5,
        prefill_ms_per_token=0,
        kv_budget_tokens=1_000_000,
    )
    lengths = {i: rng.randint(1, 80) for i in range(60)}
    t, peak = 0.0, 0
    done: dict[int, int] = {}
    for i, n in lengths.items():
        eng.submit(i, 10, n, t)
        peak = max(peak, len(eng.running))
    while len(done) < len(lengths):
        t += 0.0013
        done.update(eng.advance(t))
        peak = max(peak, len(eng.running))
        assert len(eng.running) <= 4
    assert peak == 4 and done == lengths
    assert eng.admitted == eng.finished == 60


def test_a_full_kv_budget_holds_requests_until_a_sequence_finishes() -> None:
    eng = Engine(
        max_num_seqs=64,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=100,
    )
    for rid in "abc":
        eng.submit(rid, prompt_tokens=40, output_tokens=10, now=0.0)
    # a and b take 80 tokens and grow 2 a step; c's 40 more do not fit.
    assert (len(eng.running), len(eng.waiting), eng.kv_used) == (2, 1, 80)
    assert eng.advance(0.0099) == [] and len(eng.waiting) == 1 and eng.kv_used == 98
    assert sorted(eng.advance(0.010 + EPS)) == [("a", 10), ("b", 10)]
    assert list(eng.running) == ["c"] and not eng.waiting and eng.preemptions == 0
    assert eng.advance(0.020 + EPS) == [("c", 10)]


def test_growth_past_the_budget_preempts_the_newest_sequence_which_finishes_later() -> None:
    eng = Engine(
        max_num_seqs=64,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=100,
    )
    eng.submit("old", 10, 60, 0.0)
    eng.submit("new", 10, 60, 0.0)
    # 20 + 2 a step: 100 after 40 steps, so the 41st step would overflow.
    eng.advance(0.0405)
    assert eng.preemptions == 1 and list(eng.running) == ["old"]
    assert [s.rid for s in eng.waiting] == ["new"] and eng.waiting[0].generated == 40
    assert eng.kv_used == 10 + 40
    done = eng.advance(0.060 + EPS)
    assert done == [("old", 60)]
    # Readmitted at once: its 10 + 40 tokens are prefilled again, 20 to go.
    assert list(eng.running) == ["new"] and eng.prefill_tokens == 10 + 10 + 50
    assert eng.advance(0.0799) == []
    assert eng.advance(0.080 + EPS) == [("new", 60)]
    assert eng.generated_tokens == 120 and eng.finished == 2 and eng.kv_used == 0


def test_preempted_sequence_goes_to_the_front_of_the_queue() -> None:
    eng = Engine(
        max_num_seqs=2,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=100,
    )
    eng.submit("a", 10, 60, 0.0)
    eng.submit("b", 10, 60, 0.0)
    eng.submit("c", 5, 5, 0.0)  # capacity-blocked behind a and b
    eng.advance(0.0405)
    assert [s.rid for s in eng.waiting] == ["b", "c"]  # FIFO: c is not admitted before b


def _saturated(
    eng: Any, seconds: float, lengths: list[int], prompt: int, dt: float = 0.01
) -> tuple[list[int], float]:
    """Keep at least max_num_seqs requests waiting for `seconds`; the finished lengths."""
    t, rid, finished = 0.0, 0, []
    while t < seconds:
        while len(eng.waiting) < eng.max_num_seqs:
            eng.submit(rid, prompt, lengths[rid % len(lengths)], t)
            rid += 1
        t = min(seconds, t + dt)
        finished += [n for _, n in eng.advance(t)]
        assert len(eng.running) == eng.max_num_seqs  # never a short step when queued
    return finished, t


def test_saturated_decode_rate_equals_the_peak_formula() -> None:
    eng = Engine(
        max_num_seqs=8,
        step_base_ms=4,
        step_per_seq_ms=0.5,
        prefill_ms_per_token=0,
        kv_budget_tokens=1_000_000,
    )
    assert eng.peak_decode_tokens_per_s() == pytest.approx(8 / 0.008)
    _, t = _saturated(eng, 20.0, [37, 50, 91], prompt=100)
    assert eng.generated_tokens / t == pytest.approx(eng.peak_decode_tokens_per_s(), rel=0.01)
    assert eng.running_seconds / t == pytest.approx(8, rel=1e-9)
    assert eng.steps == eng.clock == eng.generated_tokens // 8


def test_peak_item_rate_formula_matches_a_long_run() -> None:
    eng = Engine(
        max_num_seqs=16,
        step_base_ms=4,
        step_per_seq_ms=0.1,
        prefill_ms_per_token=0.01,
        kv_budget_tokens=10_000_000,
    )
    rng = random.Random(7)
    lengths = [engine_mod.lognormal_tokens(rng, 50, 400) for _ in range(4000)]
    finished, t = _saturated(eng, 60.0, lengths, prompt=300)
    # Expected: 16 / (5.6 ms * mean L + 16 * 0.01 ms * 300), about 29 items/s here.
    mean_len = statistics.fmean(finished)
    predicted = eng.peak_items_per_s(mean_len, 300)
    assert 20 < predicted < 40
    assert len(finished) / t == pytest.approx(predicted, rel=0.03)
    # The prefill the formula charges is what the engine spent.
    assert eng.prefill_seconds == pytest.approx(eng.admitted * 300 * 1e-5)


def test_running_integral_is_the_mean_running() -> None:
    rng = random.Random(3)
    eng = Engine(
        max_num_seqs=6,
        step_base_ms=3,
        step_per_seq_ms=0.2,
        prefill_ms_per_token=0.01,
        kv_budget_tokens=800,
    )
    dt, rid, sampled, busy = 0.0001, 0, 0.0, 0.0
    start = None
    for tick in range(1, 60_001):
        t = tick * dt
        if rng.random() < 0.0005:  # bursts, and idle gaps between them
            for _ in range(rng.randint(1, 10)):
                eng.submit(rid, rng.randint(20, 200), rng.randint(1, 120), t)
                rid += 1
        eng.advance(t)
        if start is None and t >= 1.0:
            start = (t, eng.running_seconds, eng.busy_seconds)
        elif start is not None:  # the running count over (t - dt, t], sampled
            sampled += len(eng.running) * dt
            busy += dt if eng.running else 0.0
    assert start is not None
    t0, running0, busy0 = start
    # The run exercised the KV budget, and the engine was idle at times.
    assert eng.preemptions > 0 and eng.finished > 50 and busy < t - t0 - 0.3
    mean_from_counter = (eng.running_seconds - running0) / (t - t0)
    assert mean_from_counter == pytest.approx(sampled / (t - t0), rel=0.02)
    assert mean_from_counter > 1.0
    assert eng.busy_seconds - busy0 == pytest.approx(busy, rel=0.02)


def test_waking_only_at_events_gives_the_same_run() -> None:
    """The model's loop wakes only at next_event_time: nothing finishes in between."""

    def run(event_driven: bool) -> list[tuple[object, int, float]]:
        eng = Engine(
            max_num_seqs=3,
            step_base_ms=2,
            step_per_seq_ms=0.3,
            prefill_ms_per_token=0.02,
            kv_budget_tokens=400,
        )
        for i in range(12):
            eng.submit(i, 30 + i, 20 + 7 * i, 0.0)
        t, out = 0.0, []
        while eng.running or eng.waiting:
            if event_driven:
                nxt = eng.next_event_time(t)
                assert nxt is not None and nxt >= t
                t = nxt
            else:
                t += 0.0001
            out += [(rid, n, t) for rid, n in eng.advance(t)]
        return out

    events, fine = run(True), run(False)
    assert [(r, n) for r, n, _ in events] == [(r, n) for r, n, _ in fine]
    for (_, _, te), (_, _, tf) in zip(events, fine, strict=True):
        assert tf - 0.0001 <= te + 1e-9 and te <= tf + 1e-9


def test_a_request_longer_than_the_kv_budget_is_cut_to_fit() -> None:
    eng = Engine(max_num_seqs=2, kv_budget_tokens=100)
    assert eng.submit("x", 30, 500, 0.0) == 70
    with pytest.raises(ValueError):
        eng.submit("y", 100, 1, 0.0)


def test_lognormal_lengths_have_the_configured_median_and_p99() -> None:
    rng = random.Random(0)
    draws = sorted(engine_mod.lognormal_tokens(rng, 300, 4000) for _ in range(20_000))
    assert statistics.median(draws) == pytest.approx(300, rel=0.04)
    assert draws[int(0.99 * len(draws))] == pytest.approx(4000, rel=0.10)
    assert min(draws) >= 1
    plain = [engine_mod.lognormal_tokens(rng, 12, 60) for _ in range(20_000)]
    assert statistics.median(plain) == pytest.approx(12, rel=0.09)
    assert math.isclose(sorted(plain)[19_800], 60, rel_tol=0.15)
