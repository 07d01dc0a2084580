"""Adaptive best-of-n (rsieve.generate.adaptive, docs/sampling.md "Adaptive sampling"): the
rule alone, then every stage's task on the FakeStack with the stochastic stand-in of
test_best_of_n (not a model: right with probability p per sample, decided by its seed)."""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rsieve.dataset.audit import audit_run
from rsieve.generate.adaptive import Adaptive, adaptive_of, next_round, stopped
from rsieve.generate.draws import sample_seed
from rsieve.generate.generation import ModelInfo, ModelReply, singles
from rsieve.generate.think import LOOP_FINISH
from rsieve.intervals import wilson
from rsieve.settings import Settings, identity
from tests.unit.test_best_of_n import StochasticStandIn, make_pool, outputs, pipeline, report

P = 0.3
ITEMS = 120


def test_the_wilson_interval_is_the_published_one() -> None:
    # Wilson score intervals at 95% (Newcombe 1998, table I; Brown, Cai & DasGupta 2001).
    lo, hi = wilson(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    lo, hi = wilson(0, 8)
    assert lo == 0.0 and round(hi, 4) == 0.3244
    lo, hi = wilson(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_defaults_stop_keep_first_at_its_first_pass() -> None:
    base: dict[str, Any] = {"samples": 8, "temperature": 0.7}
    assert adaptive_of(Settings(**base)) == Adaptive(samples=8, enough=1, round=2)
    # distinct wants several different answers: every sample unless `enough` is set.
    assert not adaptive_of(Settings(**base, keep="distinct", max_kept=3)).on
    assert adaptive_of(Settings(**base, keep="distinct", enough=3)).round == 3
    windowed = adaptive_of(Settings(**base, pass_rate_window=[0.2, 0.8]))
    assert windowed == Adaptive(samples=8, enough=0, window=(0.2, 0.8), round=2)
    assert not adaptive_of(Settings(**base, circular=True)).on
    assert not adaptive_of(Settings()).on
    assert adaptive_of(Settings(**base, enough=0)) == Adaptive(samples=8, round=2)
    assert adaptive_of(Settings(**base, sample_round=3)).round == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"samples": 4, "temperature": 0.7, "enough": 5}, "more than samples"),
        ({"samples": 4, "temperature": 0.7, "enough": 1, "circular": True}, "every rotation"),
        (
            {"samples": 4, "temperature": 0.7, "enough": 1, "pass_rate_window": [0.2, 0.8]},
            "pass-rate interval decides",
        ),
        ({"enough": 1}, "needs samples > 1"),
    ],
)
def test_contradictory_stopping_rules_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**settings)


def test_easy_items_stop_after_one_round_and_undecided_ones_get_more() -> None:
    rule = Adaptive(samples=8, enough=1, round=2)
    counts = [8, 8, 8]
    first = next_round(counts, {}, rule)
    assert first == [0, 1, 8, 9, 16, 17]
    # Item 0 passed in round 1; item 1 failed twice; item 2's second call failed.
    done = {0: False, 1: True, 8: False, 9: False, 16: False, 17: None}
    assert next_round(counts, done, rule) == [10, 11, 18, 19]
    done |= {10: False, 11: False, 18: True, 19: False}
    assert next_round(counts, done, rule) == [12, 13]
    done |= {12: False, 13: False, 14: False, 15: False}
    assert next_round(counts, done, rule) == []  # every sample drawn
    assert stopped(0, 8, 8, rule) == "all_drawn"
    assert stopped(1, 2, 2, rule) == "enough"


def test_a_resumed_round_is_completed_before_anything_is_decided() -> None:
    rule = Adaptive(samples=8, enough=1, round=4)
    # A delivery stored samples 0 and 1 (sample 0 passed) before it died: the round ends
    # as an uninterrupted one would (samples 2 and 3), then the item stops.
    assert next_round([8], {0: True, 1: False}, rule) == [2, 3]
    assert next_round([8], {0: True, 1: False, 2: False, 3: True}, rule) == []


def test_the_pass_rate_interval_decides_with_a_window() -> None:
    # 0 of 4: the interval [0, 0.49] lies inside [0, 0.9]: kept, no more samples.
    inside = Adaptive(samples=16, window=(0.0, 0.9), round=4)
    assert stopped(0, 4, 4, inside) == "inside_window"
    assert next_round([16], dict.fromkeys(range(4), False), inside) == []
    # 0 of 4 or of 8 lies wholly below 0.5: outside, whatever the other samples would say.
    above = Adaptive(samples=16, window=(0.5, 1.0), round=4)
    assert stopped(1, 4, 4, above) is None  # [0.05, 0.70]: not yet
    assert stopped(0, 4, 4, above) == "outside_window"  # [0, 0.49]
    assert stopped(0, 8, 8, above) == "outside_window"
    # 4 of 8: [0.22, 0.78] straddles 0.5: another round.
    assert stopped(4, 8, 8, above) is None
    assert next_round([16], {k: k % 2 == 0 for k in range(8)}, above) == [8, 9, 10, 11]


def _first_pass(item_id: str, samples: int) -> int | None:
    """The sample at which the stand-in first answers right (its draw for a seed)."""
    for k in range(samples):
        if random.Random(sample_seed(0, item_id, k)).random() < P:
            return k
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pool = make_pool(tmp_path_factory.mktemp("adaptive") / "pool", count=ITEMS)
    done = {}
    for name, enough in (("fixed", 0), ("adaptive", None)):
        model = StochasticStandIn(P)
        ctx, store, run, _ = pipeline(
            pool, model, dataset=name, samples=8, temperature=0.7, enough=enough
        )
        done[name] = (ctx, store, run, model)
    return done


def test_each_item_gets_rounds_until_its_first_pass(runs: dict[str, Any]) -> None:
    ctx, _, run, model = runs["adaptive"]
    gens = [g for out in outputs(ctx, run)["generate"].values() for g in out.generations]
    drawn: dict[str, int] = {}
    for g in gens:
        drawn[g.item.id] = drawn.get(g.item.id, 0) + 1
    assert len(drawn) == ITEMS
    for item_id, n in drawn.items():
        first = _first_pass(item_id, 8)
        # Rounds of 2: the round holding the first pass is the last one.
        assert n == (8 if first is None else 2 * math.ceil((first + 1) / 2)), item_id
    assert len(model.asked) == len(gens) < 8 * ITEMS
    easy = sum(n == 2 for n in drawn.values())
    assert 0 < easy < ITEMS and any(n == 8 for n in drawn.values())


def test_adaptive_accepts_what_every_sample_accepts_with_fewer_samples(
    runs: dict[str, Any],
) -> None:
    fixed = report(runs["fixed"][1], "fixed", runs["fixed"][2])
    adaptive = report(runs["adaptive"][1], "adaptive", runs["adaptive"][2])
    f, a = fixed["families"]["SynthWords"], adaptive["families"]["SynthWords"]
    # A sample's seed is its own, so adaptive draws a prefix of the fixed run's samples: an
    # item is accepted exactly when one of its eight passes, either way.
    assert a["accepted"] == f["accepted"] > 0 and a["adds_up"] and f["adds_up"]
    sa, sf = adaptive["sampling"]["SynthWords"], fixed["sampling"]["SynthWords"]
    assert sf["samples"] == 8 * ITEMS and sf["samples_not_drawn"] == 0
    assert sa["samples"] + sa["samples_not_drawn"] == 8 * ITEMS
    assert sum(sa["drawn_histogram"].values()) == ITEMS
    assert sum(int(n) * v for n, v in sa["drawn_histogram"].items()) == sa["samples"]
    assert set(sa["drawn_histogram"]) <= {"2", "4", "6", "8"}
    assert sa["samples"] / sf["samples"] < 0.8
    card = runs["adaptive"][1].get(f"datasets/adaptive/commits/{runs['adaptive'][2]}/README.md")
    assert "drawn per item (n: items)" in card.decode()
    assert (
        "answered each question up to 8 times in rounds of 2 (adaptive best-of-n: an item "
        "got no more once 1 of its samples passed)"
    ) in card.decode()


def test_the_audit_holds_with_variable_samples(runs: dict[str, Any]) -> None:
    ctx, _, run, _ = runs["adaptive"]
    index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
    result = audit_run(index, outputs(ctx, run))
    assert result.ok, result.problems
    gens = sum(len(o.generations) for o in outputs(ctx, run)["generate"].values())
    assert result.samples == gens


def test_a_runs_identity_names_its_stopping_rule() -> None:
    base: dict[str, Any] = {"samples": 8, "temperature": 0.7}
    extras: list[dict[str, Any]] = [{}, {"enough": 0}, {"enough": 2}, {"sample_round": 4}]
    ids = {
        json.dumps(identity(Settings(**base, **extra).fingerprint()), sort_keys=True)
        for extra in extras
    }
    assert len(ids) == 4


class Looping(StochasticStandIn):
    """The stochastic stand-in, but a sample whose seed is even was cut in a repetition
    loop after 300 tokens (what the adapters return when rsieve.generate.loops fires)."""

    async def generate_many_async(self, requests: Any) -> list[Any]:
        replies = await super().generate_many_async(requests)
        self.info = ModelInfo(
            name="looping-stand-in",
            version="1",
            interface="rsieve",
            kind="stand-in",
            sampling={"temperature": 0.7, "max_new_tokens": 4096},
        )
        out = []
        for request, reply in zip(singles(requests), replies, strict=True):
            if request.seed is not None and request.seed % 2 == 0:
                reply = ModelReply(
                    text="<think>Wait, let me look again. " * 9,
                    finish_reason=LOOP_FINISH,
                    output_tokens=300,
                )
            out.append(reply)
        return out


def test_a_loop_cut_is_a_failure_counted_with_the_tokens_it_saved(tmp_path: Path) -> None:
    pool = make_pool(tmp_path / "pool", count=40)
    model = Looping(P)
    ctx, store, run, _ = pipeline(pool, model, dataset="loops", samples=4, temperature=0.7)
    gens = [g for out in outputs(ctx, run)["generate"].values() for g in out.generations]
    cut = [g for g in gens if g.seed is not None and g.seed % 2 == 0]
    assert cut and all(g.failure == LOOP_FINISH and g.answer is None for g in cut)
    # A loop is never a pass: its item gets its next round.
    fam = report(store, "loops", run)["families"]["SynthWords"]
    assert fam["repetition_loops"] == len(cut)
    assert fam["loop_tokens_generated"] == 300 * len(cut)
    assert fam["loop_tokens_saved"] == (4096 - 300) * len(cut)
    assert fam["adds_up"]
    settled = [o for out in outputs(ctx, run)["judge"].values() for o in out.outcomes]
    only_loops = [o for o in settled if o.place == "rejected" and o.reason == LOOP_FINISH]
    assert fam["rejected_by_reason"].get(LOOP_FINISH, 0) == len(only_loops)
    card = store.get(f"datasets/loops/commits/{run}/README.md").decode()
    assert "## Loops cut short" in card and f"| {len(cut)} | {300 * len(cut):,} |" in card


def test_an_items_round_is_one_request_with_its_samples_seeds() -> None:
    from rsieve.generate.draws import Draw, circular_items
    from rsieve.generate.generation import round_requests
    from rsieve.images import prepare_image
    from rsieve.schemas import Item
    from tests.e2e.pools import picture
    from tests.unit._records import make_item

    buf = io.BytesIO()
    picture("round", (48, 32)).save(buf, format="PNG")
    image = prepare_image(buf.getvalue(), max_side=64, max_pixels=64 * 64)

    def item(line: int, question: str) -> Item:
        return make_item(f"i{line}", line=line, question=question, protocol="mc")

    a, b = item(1, "Say A"), item(2, "Say B")
    entries = [((a, image), Draw(k, 100 + k)) for k in range(4)]
    entries += [((b, image), Draw(k, 200 + k)) for k in range(4)]
    requests = round_requests(entries, [0, 1, 2, 4, 5])
    assert [(r.prompt, r.seed, r.seeds) for r in requests] == [
        ("Say A", 100, (101, 102)),
        ("Say B", 200, (201,)),
    ]
    assert [r.n for r in requests] == [3, 2] and singles(requests)[1].seed == 101
    # Circular sampling rotates the question per sample: each sample its own request.
    mcq = item(3, "Pick one\nA. x\nB. y\nC. z")
    rotated = [((it, image), Draw(k, 300 + k)) for k, it in enumerate(circular_items(mcq, 3))]
    assert [r.n for r in round_requests(rotated, [0, 1, 2])] == [1, 1, 1]
    # One sample per item (no best-of-n): each its own request, no seed.
    plain = [((a, image), None), ((b, image), None)]
    assert [(r.seed, r.seeds) for r in round_requests(plain, [0, 1])] == [(None, ()), (None, ())]
