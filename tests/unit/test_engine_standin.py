"""The vllm-engine-standin's scheduler (bench/triton_models/vllm-engine-standin/1/engine.py)
on a fake clock: capacity, KV budget, preemption, prefill overrides (prefix cache, n > 1),
progress and abort, the peak formulas and the integrals the benchmark reads, all asserted
as numbers; and its outputs' text: streamed prefixes, reasoning that never loops, loops
that do."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import sys
import time
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


def _consistent(eng: Any, finished: dict[object, int], aborted_generated: int) -> None:
    """Every token generated belongs to a finished, aborted or live sequence; the KV held is
    the running sequences' prompt + generated; every admission ended or runs."""
    live = sum(eng.progress(rid) for rid in [*eng.running, *(s.rid for s in eng.waiting)])
    assert eng.generated_tokens == sum(finished.values()) + aborted_generated + live
    assert eng.kv_used == sum(s.prompt + eng.progress(r) for r, s in eng.running.items())


def test_abort_of_a_running_sequence_frees_its_kv_and_returns_what_it_would_generate() -> None:
    eng = Engine(
        max_num_seqs=2,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=1000,
    )
    eng.submit("a", 100, 50, 0.0)
    eng.submit("b", 100, 30, 0.0)
    eng.submit("c", 40, 10, 0.0)  # waits: two run at most
    eng.advance(0.0105)
    assert (eng.progress("a"), eng.progress("b"), eng.progress("c")) == (10, 10, 0)
    assert eng.kv_used == 2 * (100 + 10)
    assert eng.abort("a", 0.0105) == 40
    # a's 110 tokens are freed, and c takes its place at the next step boundary.
    assert eng.kv_used == 110 and "a" not in eng.running and eng.aborted == 1
    with pytest.raises(KeyError):
        eng.progress("a")
    finished = dict(eng.advance(0.0115))
    assert list(eng.running) == ["b", "c"] and eng.kv_used == 111 + 40
    _consistent(eng, finished, aborted_generated=10)
    while eng.running:
        finished.update(eng.advance(eng.next_event_time(0.0) + EPS))
    assert finished == {"b": 30, "c": 10}
    assert eng.generated_tokens == 10 + 30 + 10 and eng.kv_used == 0
    assert eng.admitted == eng.finished + eng.preemptions + 1  # a: aborted while running


def test_abort_of_a_waiting_sequence_returns_its_whole_length_and_keeps_the_queue() -> None:
    eng = Engine(
        max_num_seqs=1,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=1000,
    )
    for rid, n in (("a", 20), ("b", 15), ("c", 5)):
        eng.submit(rid, 10, n, 0.0)
    eng.advance(0.0055)
    assert eng.abort("b", 0.0055) == 15
    assert [s.rid for s in eng.waiting] == ["c"] and eng.kv_used == 10 + 5
    assert eng.prefill_tokens == 10  # b was never prefilled
    finished = dict(eng.advance(0.0205))
    assert finished == {"a": 20} and list(eng.running) == ["c"]
    _consistent(eng, finished, aborted_generated=0)
    with pytest.raises(KeyError):
        eng.abort("b", 0.021)


def test_aborting_the_only_running_sequence_admits_the_queue_at_once() -> None:
    eng = Engine(
        max_num_seqs=4,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=1,
        kv_budget_tokens=100,
    )
    eng.submit("big", 60, 30, 0.0)
    eng.submit("next", 50, 10, 0.0)  # 60 + 50 > 100: held back by the KV budget
    assert list(eng.running) == ["big"] and len(eng.waiting) == 1
    assert eng.abort("big", 0.070) == 30 - 10  # 60 ms of prefill, then 10 steps of 1 ms
    assert list(eng.running) == ["next"] and eng.kv_used == 50
    # The new step starts at the abort, with next's own prefill (50 ms) and nothing else.
    assert eng.next_event_time(0.070) == pytest.approx(0.070 + 0.050 + 0.010)
    assert eng.advance(0.1305) == [("next", 10)]


def test_abort_of_a_sequence_finished_but_not_yet_reported_drops_its_report() -> None:
    eng = Engine(max_num_seqs=2, step_base_ms=1, step_per_seq_ms=0, prefill_ms_per_token=0)
    eng.submit("a", 10, 5, 0.0)
    eng.submit("late", 10, 5, 0.0100)  # runs the engine to 10 ms: a finishes unreported
    assert eng.abort("a", 0.0100) == 0
    assert eng.advance(0.0100) == [] and eng.finished == 1 and eng.aborted == 0


def test_a_prefill_override_prefills_only_what_it_says_and_counts_the_rest_cached() -> None:
    eng = Engine(
        max_num_seqs=8,
        step_base_ms=4,
        step_per_seq_ms=0,
        prefill_ms_per_token=1,
        kv_budget_tokens=100_000,
    )
    # One request of n = 3 outputs: the first prefills the prompt, the others share it.
    for i in range(3):
        eng.submit(("r", i), 200, 10, 0.0, prefill_tokens=200 if i == 0 else 0)
    assert eng.prefill_tokens == 200 and eng.prefix_cached_tokens == 400
    assert eng.prefill_seconds == pytest.approx(0.2)
    assert eng.kv_used == 3 * 200  # the KV budget charges each its prompt: conservative
    assert eng.next_event_time(0.0) == pytest.approx(0.2 + 10 * 0.004)
    done = eng.advance(0.25)
    assert sorted(n for _, n in done) == [10, 10, 10]
    # A prefix-cache hit: nothing prefilled, the step is a plain decode step.
    eng.submit("hit", 200, 10, 1.0, prefill_tokens=0)
    assert (eng.prefill_tokens, eng.prefix_cached_tokens) == (200, 600)
    assert eng.next_event_time(1.0) == pytest.approx(1.0 + 10 * 0.004)
    with pytest.raises(ValueError):
        eng.submit("x", 10, 1, 2.0, prefill_tokens=11)


def test_a_preempted_cache_hit_prefills_prompt_and_generated_on_readmission() -> None:
    eng = Engine(
        max_num_seqs=64,
        step_base_ms=1,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=100,
    )
    eng.submit("old", 10, 60, 0.0)
    eng.submit("new", 10, 60, 0.0, prefill_tokens=0)
    eng.advance(0.0405)  # as in the preemption test above: new is preempted at 40 tokens
    assert eng.preemptions == 1 and eng.prefill_tokens == 10
    eng.advance(0.060 + EPS)
    assert list(eng.running) == ["new"] and eng.prefill_tokens == 10 + 10 + 40


def test_progress_grows_with_the_steps_and_stays_below_the_total() -> None:
    eng = Engine(
        max_num_seqs=2,
        step_base_ms=2,
        step_per_seq_ms=0,
        prefill_ms_per_token=0,
        kv_budget_tokens=10_000,
    )
    eng.submit("a", 10, 40, 0.0)
    eng.submit("b", 10, 40, 0.0)
    eng.submit("c", 10, 40, 0.0)
    seen = []
    for tick in range(1, 40):
        eng.advance(tick * 0.002 + EPS)
        seen.append(eng.progress("a"))
        assert eng.progress("c") == 0  # waiting
    assert seen == list(range(1, 40))
    assert eng.advance(0.080 + EPS) == [("a", 40), ("b", 40)]
    assert eng.progress("c") == 0 and list(eng.running) == ["c"]
    eng.advance(0.090 + EPS)
    assert eng.progress("c") == 5


# ---------------------------------------------------------------------- text
texts = engine_mod.Texts()


def ends_in_loop(text: str, max_unit: int = 512, repeats: int = 4) -> bool:
    """The detector the stand-in is made for: the text's last characters are one unit of at
    most max_unit characters repeated at least `repeats` times, exactly."""
    for unit in range(1, min(max_unit, len(text) // repeats) + 1):
        if text.endswith(text[-unit:] * repeats):
            return True
    return False


def test_normal_reasoning_never_ends_in_a_loop_and_differs_per_output() -> None:
    rng = random.Random(11)
    seen = set()
    for i in range(600):
        tokens = rng.randint(1, 900)
        text = texts.compose(
            random.Random(i),
            opening="<think>\n",
            plain=False,
            answer="WORD",
            tokens=tokens,
            truncated=i % 2 == 0,
        )
        assert not ends_in_loop(text), text[-600:]
        # Every prefix a stream would have shown at any token is no loop either.
        for k in (tokens // 3, tokens // 2, tokens - 1):
            assert not ends_in_loop(text[: engine_mod.prefix_chars(text, tokens, k)])
        if tokens > 50:
            assert abs(len(text) - 4 * tokens) <= 16
            seen.add(text[:200])
    assert len(seen) > 250  # drawn at their own offsets: no two outputs alike
    again = texts.compose(
        random.Random(5), opening="", plain=False, answer="X", tokens=300, truncated=False
    )
    first = texts.compose(
        random.Random(5), opening="", plain=False, answer="X", tokens=300, truncated=False
    )
    assert again == first and first.endswith("</think>\n\nX")


def test_a_loop_repeats_one_unit_exactly_to_the_end_and_is_caught_after_4_repeats() -> None:
    for i, unit in enumerate(engine_mod.LOOP_UNITS):
        assert 40 <= len(unit) <= 120
        rng = random.Random(i)
        text = texts.compose(
            rng,
            opening="<think>\n",
            plain=False,
            answer="A",
            tokens=1000,
            truncated=False,
            loop=(100, unit),
        )
        assert len(text) == len("<think>\n") + 4000 and "</think>" not in text
        body = text.removeprefix("<think>\n")
        start = body.index(unit)
        assert 350 <= start <= 405  # 100 tokens of reasoning first
        assert not ends_in_loop(body[:start])
        # Streamed token by token, a detector fires once 4 units are out, not before.
        caught = next(
            k
            for k in range(1, 1001)
            if ends_in_loop(text[: engine_mod.prefix_chars(text, 1000, k)])
        )
        shown = engine_mod.prefix_chars(text, 1000, caught) - len("<think>\n")
        # (A few characters early at most: the reasoning's ". " before the first unit is
        # also how a unit ends, so the repeated stretch begins there.)
        assert start + 4 * len(unit) - 3 <= shown < start + 4 * len(unit) + 4
        assert ends_in_loop(text)
        assert body[start:].startswith(unit * 8)


def test_prefixes_of_an_output_add_up_to_its_text() -> None:
    text = texts.compose(
        random.Random(1), opening="", plain=False, answer="OK", tokens=77, truncated=False
    )
    cuts = [engine_mod.prefix_chars(text, 77, k) for k in (0, 1, 13, 13, 40, 76, 77, 90)]
    assert cuts == sorted(cuts) and cuts[0] == 0 and cuts[-2:] == [len(text)] * 2
    pieces = [text[a:b] for a, b in zip([0, *cuts], cuts, strict=False)]
    assert "".join(pieces) == text
    # A plain answer shorter than 4 characters a token: still whole at the last token.
    plain = texts.compose(
        random.Random(1), opening="", plain=True, answer="WORD", tokens=3, truncated=False
    )
    assert plain == "WORD" and engine_mod.prefix_chars(plain, 3, 2) == 2


def test_texts_are_cheap() -> None:
    rng = random.Random(0)
    start = time.perf_counter()
    for _ in range(5000):
        texts.compose(rng, opening="", plain=False, answer="X", tokens=500, truncated=False)
    assert time.perf_counter() - start < 0.5  # a few microseconds an output
