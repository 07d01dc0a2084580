"""judge_pair_rejections (docs/sampling.md): with best-of-n, the judge also sees each
distinct refused answer of an item the verifier passed, once per answer form; the other
samples of that form share its verdict; the item's place and kept answer stay the
verifier's; the report counts these verdicts and their calls apart. The pure rules
(`to_judge`, `refused_of_passed`, `settle`, `hold_back`) and the judge service on the
FakeStack with a scripted generator and a judge that says CORRECT to one answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import pytest

from rsieve.adapters.gate import EngineGate
from rsieve.compact.settle import Keep, answer_form, refused_of_passed, settle, to_judge
from rsieve.generate.draws import sample_seed
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.judge.calibration import hold_back
from rsieve.judge.cascade import apply_verdict, judge_prompt, verify_generation
from rsieve.schemas import Item, Outcome
from rsieve.settings import Settings
from rsieve_cli.shell import Failure
from tests.fakestack import FakeStack
from tests.unit._records import make_generation, make_item
from tests.unit.test_best_of_n import make_pool, outputs, report, rows
from tests.unit.test_training_exports import export


def _samples(item: Item, answers: Sequence[str | None]) -> list[Outcome]:
    """Verified samples of one item; None is a generation failure (never judged)."""
    out = []
    for k, answer in enumerate(answers):
        gen = make_generation(
            item, answer, failure="truncated_reasoning" if answer is None else None
        ).model_copy(update={"sample": k})
        out.append(verify_generation(gen))
    return out


def _shard() -> list[Outcome]:
    passed = make_item("passed", line=1)  # reference COFFEE
    failed = make_item("failed", line=2)
    return [
        *_samples(passed, ["COFFEE", "tea", " T-E-A ", "milk", None]),
        *_samples(failed, ["water", "juice"]),
    ]


def test_to_judge_picks_one_per_distinct_refused_answer_of_a_passed_item_only_when_on() -> None:
    verified = _shard()
    off = to_judge(verified, judge_samples=1)
    assert off == to_judge(verified, 1, pair_rejections=False) == [5]  # the failed item's first
    on = to_judge(verified, 1, pair_rejections=True)
    # tea (1) and milk (3); " T-E-A " is tea's form under alnum, the failure is not scored.
    assert on == [1, 3, 5]
    assert refused_of_passed(verified) == {1: 1, 2: 1, 3: 3}
    # judge_samples still caps only the items no sample passed.
    assert to_judge(verified, 2, pair_rejections=True) == [1, 3, 5, 6]


def test_an_answer_without_a_form_is_told_apart_by_its_folded_text() -> None:
    item = make_item("n", protocol="number", references=["12"])
    a, b, c, d = _samples(item, ["n/a", "  n/a ", "none", "12.5"])
    assert answer_form(a) == answer_form(b) == ("text", "n/a")
    assert answer_form(c) != answer_form(a)
    assert answer_form(d) == ("form", "12.5")


def _judged(o: Outcome, verdict: str) -> Outcome:
    return apply_verdict(o, model="judge", prompt=judge_prompt(o), raw_output=verdict)


def test_a_correct_on_a_refused_sample_counts_in_the_pass_rate_only() -> None:
    right, refused = _samples(make_item("passed"), ["COFFEE", "surely COFFEE"])
    promoted = _judged(refused, "CORRECT")
    assert promoted.place == "accepted" and promoted.promoted_by == "judge"
    # The judge's promotion first in sample order: settled as before, it would lead.
    promoted = promoted.model_copy(
        update={"generation": promoted.generation.model_copy(update={"sample": 0})}
    )
    right = right.model_copy(
        update={"generation": right.generation.model_copy(update={"sample": 1})}
    )
    keeps: tuple[Keep, ...] = ("first", "distinct")
    for keep in keeps:
        item = settle([right, promoted], keep=keep, max_kept=4)
        assert item.place == "accepted" and item.promoted_by == "verifier"
        assert item.generation.sample == 1
        assert item.samples is not None
        assert item.samples.passed == [0, 1] and item.samples.kept == [1]
    # The judge's promotion leads where no sample passed the verifier, as before.
    alone = settle([promoted, _judged(_samples(make_item("x"), ["x", "y"])[1], "WRONG")])
    assert alone.promoted_by == "judge"


def test_the_hold_back_takes_a_refused_samples_promotion_back_out_of_the_pass_rate() -> None:
    right, refused = _samples(make_item("passed"), ["COFFEE", "surely COFFEE"])
    item = settle([right, _judged(refused, "CORRECT")])
    held = hold_back([item], {}, 0.05)[0]  # no calibration: every judge promotion held back
    assert held.place == "accepted" and held.promoted_by == "verifier"
    assert held.samples is not None and held.samples.passed == [0]
    (other,) = held.samples.others
    assert other.place == "rejected" and other.reason == "judge_untrusted"
    assert other.verdict is not None and other.verdict.verdict == "CORRECT"


def test_the_setting_needs_several_samples_and_no_rotation() -> None:
    with pytest.raises(ValueError, match="samples > 1"):
        Settings(judge_pair_rejections=True)
    with pytest.raises(ValueError, match="circular"):
        Settings(judge_pair_rejections=True, samples=4, circular=True)
    assert Settings(judge_pair_rejections=True, samples=4, temperature=0.7).judge_pair_rejections


# --- the judge service --------------------------------------------------------------------

SAMPLES = 4
# Item number -> the answer of each sample (make_pool's item i has reference W000iX).
SCRIPT = {
    0: ["nope", "W0000X", " No-pe ", "surely W0000X"],  # passed; refused: nope (twice), surely
    1: ["W0001X"] * SAMPLES,  # passed; nothing refused
    2: ["nope", "nada", "nope", "nada"],  # none passed: judged as before, its first sample
}


class Scripted:
    """A stand-in generator (not a model): sample k of item i answers SCRIPT[i][k], the
    sample read back from its seed."""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.by_seed = {
            sample_seed(0, f"bon-{i}", k): answers[k]
            for i, answers in SCRIPT.items()
            for k in range(SAMPLES)
        }

    def bind(self, gate: EngineGate, on_ready: Callable[[ModelInfo], None]) -> Scripted:
        self.on_ready = on_ready
        return self

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="scripted", version="1", interface="rsieve", kind="stand-in")
        self.on_ready(self.info)
        return [
            ModelReply(
                text=f"<think>sample</think>{self.by_seed[r.seed or 0]}", finish_reason="stop"
            )
            for r in singles(requests)
        ]


class SurelyJudge:
    """A stand-in judge: CORRECT to a candidate with `surely`, WRONG to anything else; every
    prompt it was sent is recorded."""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.prompts: list[str] = []

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="surely-judge", version="1", interface="rsieve", kind="stand-in")
        self.prompts += [r.prompt for r in requests]
        return [
            ModelReply(
                text="CORRECT" if "surely" in r.prompt else "WRONG",
                finish_reason="stop",
                input_tokens=100,
                output_tokens=1,
            )
            for r in requests
        ]


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Any, ...]]:
    pool = make_pool(tmp_path_factory.mktemp("pairs") / "pool", count=len(SCRIPT))
    done = {}
    for on in (False, True):
        judge = SurelyJudge()
        stack = FakeStack(judge=judge, generator=Scripted(), shard_size=64)
        sampling = {"samples": SAMPLES, "temperature": 0.7, "enough": 0}
        run = stack.run(pool, "pairs", sampling=sampling | {"judge_pair_rejections": on})
        done[on] = (stack, run, judge)
    return done


def _judged_items(stack: FakeStack, run: str) -> dict[str, Outcome]:
    outs = outputs(stack.ctx, run)["judge"].values()
    return {o.generation.item.id: o for out in outs for o in out.outcomes}


def test_the_judge_is_asked_once_per_distinct_refused_answer(both: dict[bool, Any]) -> None:
    _, _, off = both[False]
    assert len(off.prompts) == 1 and "nope" in off.prompts[0]  # item 2's first sample only
    stack, run, judge = both[True]
    assert len(judge.prompts) == len(set(judge.prompts)) == 3
    assert sum("surely" in p for p in judge.prompts) == 1
    assert sum("nope" in p and "W0000X" in p for p in judge.prompts) == 1  # nope x2: one call
    item = _judged_items(stack, run)["bon-0"]
    assert item.samples is not None
    by_sample = {o.generation.sample: o for o in item.samples.others}
    first, again = by_sample[0].verdict, by_sample[2].verdict
    assert first is not None and again is not None
    assert first.verdict == again.verdict == "WRONG"
    assert not first.reused and again.reused and again.prompt == first.prompt
    assert by_sample[3].promoted_by == "judge" and by_sample[3].place == "accepted"


def test_a_correct_on_a_refused_answer_leaves_the_item_where_it_was(
    both: dict[bool, Any],
) -> None:
    (s_off, r_off, _), (s_on, r_on, _) = both[False], both[True]
    off, on = _judged_items(s_off, r_off), _judged_items(s_on, r_on)
    assert {i: o.place for i, o in on.items()} == {i: o.place for i, o in off.items()}
    assert on["bon-0"].generation.sample == off["bon-0"].generation.sample == 1
    assert on["bon-0"].promoted_by == "verifier"
    assert on["bon-0"].samples is not None and off["bon-0"].samples is not None
    assert off["bon-0"].samples.passed == [1] and on["bon-0"].samples.passed == [1, 3]
    # Compaction: no calibration (the FakeStack asks none), so the promotion is held back
    # and leaves the pass rate the rows carry; the kept answer is the verifier's either way.
    for stack in (s_off, s_on):
        accepted = [
            qa for row in rows(stack.store, "pairs")["SynthWords_RS_nothink"] for qa in row["qa"]
        ]
        (qa,) = [qa for qa in accepted if qa["id"] == "bon-0"]
        assert qa["answer"] == "W0000X" and qa["sample"] == 1 and qa["passed"] == 1


def test_the_report_counts_the_pair_rejections_apart(both: dict[bool, Any]) -> None:
    (s_off, r_off, _), (s_on, r_on, _) = both[False], both[True]
    off, on = report(s_off.store, "pairs", r_off), report(s_on.store, "pairs", r_on)
    fam_off, fam_on = off["families"]["SynthWords"], on["families"]["SynthWords"]
    assert "pair_rejections" not in fam_off
    assert fam_on["pair_rejections"] == {
        "asked": 2,
        "reused": 1,
        "CORRECT": 1,
        "WRONG": 2,
        "UNSURE": 0,
        "FAILED": 0,
    }
    # The judge's own counts mean what they meant: the items no sample passed.
    for key in ("judge_verdicts", "judge_reused", "accepted", "rejected"):
        assert fam_on[key] == fam_off[key], key
    judge_off, judge_on = off["tokens"]["total"]["judge"], on["tokens"]["total"]["judge"]
    assert "pair_rejections" not in judge_off
    assert judge_on["calls"] == judge_off["calls"] == 1
    assert judge_on["pair_rejections"]["calls"] == 2
    assert judge_on["pair_rejections"]["prompt_tokens"] == 200
    assert judge_on["pair_rejections"]["reused"] == 1
    assert on["tokens"]["total"]["all"]["calls"] == off["tokens"]["total"]["all"]["calls"] + 2
    card_on = s_on.store.get(f"datasets/pairs/commits/{r_on}/README.md").decode()
    card_off = s_off.store.get(f"datasets/pairs/commits/{r_off}/README.md").decode()
    assert "refused samples of accepted items" in card_on and "3 samples, 2 asked" in card_on
    assert "refused samples of accepted items" not in card_off
    assert s_on.ctx.spec(r_on).settings["judge_pair_rejections"] is True
    assert (
        "judge_pair_rejections" not in s_off.ctx.spec(r_off).settings
        or not (s_off.ctx.spec(r_off).settings["judge_pair_rejections"])
    )
    assert r_on != r_off


def test_the_dpo_export_never_pairs_against_an_answer_the_judge_called_correct(
    both: dict[bool, Any], tmp_path: Path
) -> None:
    """`rsieve export --format dpo` on both runs: without the setting every refused sample
    of bon-0 is a rejected side, `surely W0000X` (right in another form) too; with it, the
    judge's CORRECT keeps that one out, and `--rejected-requires judge_wrong` has the
    verdicts it needs (without them it keeps nothing)."""

    def pairs(on: bool, **kw: Any) -> set[tuple[int, int]]:
        stack, run, _ = both[on]
        try:
            folder = export(stack.ctx, run, tmp_path / f"{on}-{len(kw)}", "dpo", **kw)
        except Failure:
            return set()
        ds = datasets.load_dataset(str(folder))["SynthWords_pairs"]
        return {(r["chosen_sample"], r["rejected_sample"]) for r in ds if r["id"] == "bon-0"}

    assert pairs(False) == {(1, 0), (1, 2), (1, 3)}
    assert pairs(True) == {(1, 0), (1, 2)}
    assert pairs(True, rejected_requires="judge_wrong") == {(1, 0), (1, 2)}
    assert pairs(False, rejected_requires="judge_wrong") == set()
