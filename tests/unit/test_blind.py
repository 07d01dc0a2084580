"""The blind pass (rsieve.judge.blind): what is asked again without the image, how the
replies are read, and what each policy does with an item answerable without its image
(routing, rows, the run report and the card)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from rsieve.adapters.gate import EngineGate
from rsieve.compact.rows import assemble_rows
from rsieve.compact.splits import split_kinds
from rsieve.dataset.audit import audit_run
from rsieve.dataset.card import _blind_md
from rsieve.dataset.recheck import recheck_entries
from rsieve.dataset.report import report_part, token_usage
from rsieve.generate.draws import circular_items
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.judge.blind import blind_asks, blind_passes, with_blind
from rsieve.judge.cascade import needs_judge, verify_generation
from rsieve.schemas import BlindPass, BlindPolicy, Generation
from rsieve.settings import Settings
from rsieve.verify import TrainingPolicy
from tests.unit._records import make_generation, make_item
from tests.unit.test_best_of_n import make_mcq_pool, outputs, pipeline, report, rows

POLICY = TrainingPolicy()


def reply(answer: str) -> ModelReply:
    return ModelReply(
        text=f"<think>No image; from the question alone.</think>{answer}", finish_reason="stop"
    )


def shard() -> list[Generation]:
    right = make_generation(make_item("right", line=1, references=["COFFEE"]), "COFFEE")
    wrong = make_generation(make_item("wrong", line=2, references=["TEA"]), "COFFEE")
    return [right, wrong]


def test_only_items_the_verifier_accepted_are_asked_once_with_their_question() -> None:
    asks = blind_asks(shard(), POLICY, circular=False)
    assert [a.generation.item.id for a in asks] == ["right"]
    assert asks[0].generation.item.question == "What word is shown?"


def test_a_blind_answer_that_passes_makes_the_item_answerable() -> None:
    gens = shard()
    asks = blind_asks(gens, POLICY, circular=False)
    yes = blind_passes(asks, [reply("coffee")], POLICY, "keep")[1]
    no = blind_passes(asks, [reply("I cannot tell without the image")], POLICY, "keep")[1]
    assert (yes.answerable, yes.answers, yes.policy) == (True, ["coffee"], "keep")
    assert no.answerable is False and "cannot tell" in no.raw_outputs[0]
    flagged = with_blind(gens, {1: yes})
    assert flagged[0].blind == yes and flagged[1].blind is None


def test_a_failed_blind_request_leaves_it_unknown() -> None:
    asks = blind_asks(shard(), POLICY, circular=False)
    failed = blind_passes(asks, [TimeoutError("no reply")], POLICY, "drop")[1]
    assert failed.answerable is None and failed.error == "TimeoutError: no reply"
    gen = with_blind(shard(), {1: failed})[0]
    assert verify_generation(gen).place == "accepted"  # not known: never dropped


def test_circular_sampling_asks_every_rotation_and_needs_all_right() -> None:
    options = {"A": "cat", "B": "dog", "C": "cow"}
    item = make_item(
        "mc",
        protocol="mc",
        question="Which animal?\nA. cat\nB. dog\nC. cow",
        references=["B"],
        options=options,
    )
    rotations = circular_items(item, 3)
    # The model answers each rotation right with the image: the letter of "dog".
    letters = [next(k for k, v in (it.options or {}).items() if v == "dog") for it in rotations]
    gens = [
        make_generation(it, letter).model_copy(update={"sample": k, "seed": 100 + k})
        for k, (it, letter) in enumerate(zip(rotations, letters, strict=True))
    ]
    asks = blind_asks(gens, POLICY, circular=True)
    assert [(a.generation.sample, a.generation.seed) for a in asks] == [
        (0, 100),
        (1, 101),
        (2, 102),
    ]
    assert len({a.generation.item.question for a in asks}) == 3  # each rotation as asked
    lucky = blind_passes(asks, [reply("B"), reply("B"), reply("B")], POLICY, "keep")[1]
    assert lucky.answerable is False  # one letter every time: right once only
    every = blind_passes(asks, [reply(x) for x in letters], POLICY, "keep")[1]
    assert every.answerable is True


def blind(answerable: bool | None, policy: BlindPolicy) -> BlindPass:
    return BlindPass(
        answerable=answerable, answers=["COFFEE"], raw_outputs=["COFFEE"], policy=policy
    )


@pytest.mark.parametrize(
    ("policy", "place", "kinds"),
    [
        ("keep", "accepted", ("RS_think", "RS_nothink")),
        ("nothink", "accepted", ("RS_nothink",)),
        ("drop", "rejected", ("rejected",)),
    ],
)
def test_each_policy_places_an_answerable_item(
    policy: BlindPolicy, place: str, kinds: tuple[str, ...]
) -> None:
    gen = make_generation(make_item(references=["COFFEE"]), "COFFEE")
    out = verify_generation(gen.model_copy(update={"blind": blind(True, policy)}))
    assert out.place == place and split_kinds(out) == kinds
    if policy == "drop":
        assert out.reason == "answerable_without_image" and not needs_judge(out)
    # Not answerable: every policy keeps the item in both training splits.
    kept = verify_generation(gen.model_copy(update={"blind": blind(False, policy)}))
    assert kept.place == "accepted" and split_kinds(kept) == ("RS_think", "RS_nothink")


def test_rows_report_and_card_carry_the_blind_pass() -> None:
    gens = [
        make_generation(make_item(f"i{k}", line=k, image=f"img{k}"), "COFFEE") for k in range(1, 5)
    ]
    flags: list[bool | None] = [True, False, None, True]
    outcomes = [
        verify_generation(g.model_copy(update={"blind": blind(f, "drop")}))
        for g, f in zip(gens, flags, strict=True)
    ]
    rows = assemble_rows(outcomes)
    entries = {qa["id"]: qa for rs in rows.values() for row in rs for qa in row["qa"]}
    assert {i: e["answerable_without_image"] for i, e in entries.items()} == {
        "i1": True,
        "i2": False,
        "i3": None,
        "i4": True,
    }
    assert {qa["id"] for row in rows["SynthWords_rejected"] for qa in row["qa"]} == {"i1", "i4"}
    fam = report_part(outcomes, [])["families"]["SynthWords"]
    assert (fam["accepted"], fam["rejected"]) == (2, 2)
    assert fam["rejected_by_reason"] == {"answerable_without_image": 2}
    assert (fam["blind_asked"], fam["blind_answerable"], fam["blind_failed"]) == (3, 2, 1)
    assert [e["id"] for e in fam["blind_examples"]] == ["i1", "i4"]
    card = "\n".join(
        _blind_md({"blind_pass": True, "blind_policy": "drop"}, {"families": {"SynthWords": fam}})
    )
    assert "| SynthWords | 3 | 2 | 66.7% (20.8%-93.9%) | 1 |" in card
    assert "rejected with reason `answerable_without_image`" in card
    assert "Not run" in "\n".join(_blind_md({}, {"families": {"SynthWords": fam}}))


def test_a_policy_without_the_blind_pass_is_refused() -> None:
    with pytest.raises(ValueError, match="blind_policy=drop does nothing"):
        Settings(blind_policy="drop")
    assert Settings(blind_pass=True, blind_policy="drop").blind_policy == "drop"


def test_recheck_finds_an_answerable_entry_where_the_policy_keeps_it_out() -> None:
    gen = make_generation(make_item(references=["COFFEE"]), "COFFEE")
    out = verify_generation(gen.model_copy(update={"blind": blind(True, "keep")}))
    rows = assemble_rows([out])  # kept in both splits, as policy keep does
    entries = [
        (split.removeprefix("SynthWords_"), "SynthWords", qa)
        for split, rs in rows.items()
        for row in rs
        for qa in row["qa"]
    ]
    checks = {
        policy: sorted(
            d["split"]
            for d in recheck_entries(
                entries, calibration=None, bound=None, blind_policy=policy
            ).differences
            if d["check"] == "blind_pass"
        )
        for policy in (None, "keep", "nothink", "drop")
    }
    assert checks == {
        None: [],
        "keep": [],
        "nothink": ["RS_think"],
        "drop": ["RS_nothink", "RS_think"],
    }


class ShortcutReader:
    """A stand-in (not a model) for multiple choice: with the image it answers the letter
    of the right word; without it, it still knows the even items (their question gives
    them away) and says "A" for the odd ones, right in one rotation of four."""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.asked: list[ModelRequest] = []

    def bind(self, gate: EngineGate, on_ready: Callable[[ModelInfo], None]) -> ShortcutReader:
        self.on_ready = on_ready
        return self

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        requests = singles(requests)  # one reply per sample, as an engine without n
        self.info = ModelInfo(name="shortcut-reader", version="1", interface="rsieve")
        self.on_ready(self.info)
        self.asked += requests
        replies: list[ModelReply | Exception] = []
        for r in requests:
            i = int(re.findall(r"alpha(\d+)", r.prompt)[0])
            right = f"{['alpha', 'beta', 'gamma', 'delta'][i % 4]}{i}"
            letter = re.findall(rf"^([A-D])\. {right}$", r.prompt, re.M)[0]
            if r.image is None and i % 2:
                letter = "A"
            replies.append(ModelReply(text=f"<think>I look.</think>{letter}", finish_reason="stop"))
        return replies


def test_the_blind_pass_on_every_service_with_circular_sampling_and_drop(tmp_path: Path) -> None:
    pool = make_mcq_pool(tmp_path / "pool", count=40)
    model = ShortcutReader()
    sampling = {"samples": 4, "circular": True, "blind_pass": True, "blind_policy": "drop"}
    ctx, store, run, _ = pipeline(pool, model, dataset="blind", sampling=sampling)  # type: ignore[arg-type]
    # Every item was right in its four rotations with the image, and asked again without
    # it in each of the four, with the same questions.
    seeing = [r for r in model.asked if r.image is not None]
    blind = [r for r in model.asked if r.image is None]
    assert len(seeing) == len(blind) == 160
    assert sorted(r.prompt for r in blind) == sorted(r.prompt for r in seeing)
    fam = report(store, "blind", run)["families"]["SynthChoice"]
    # Even items are answered right blind in every rotation: dropped. Odd ones say "A"
    # blind, right in one rotation only: not answerable, kept.
    assert (fam["blind_asked"], fam["blind_answerable"], fam["blind_failed"]) == (40, 20, 0)
    assert (fam["accepted"], fam["rejected"]) == (20, 20)
    assert fam["rejected_by_reason"] == {"answerable_without_image": 20}
    assert fam["judge_verdicts"]["CORRECT"] == 0 and sum(fam["judge_verdicts"].values()) == 0
    placed = rows(store, "blind")
    for split, expected in (
        ("SynthChoice_rejected", True),
        ("SynthChoice_RS_think", False),
        ("SynthChoice_RS_nothink", False),
    ):
        entries = [qa for row in placed[split] for qa in row["qa"]]
        assert entries and {qa["answerable_without_image"] for qa in entries} == {expected}
        assert {int(qa["id"].split("-")[1]) % 2 for qa in entries} == {0 if expected else 1}
    index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
    assert audit_run(index, outputs(ctx, run)).ok


def test_the_blind_requests_count_with_the_generators_tokens() -> None:
    gens = shard()
    asks = blind_asks(gens, POLICY, circular=False)
    counted = ModelReply(
        text="<think>x</think>TEA", finish_reason="stop", input_tokens=12, output_tokens=3
    )
    found = blind_passes(asks, [counted], POLICY, "keep")[1]
    assert (found.input_tokens, found.output_tokens) == ([12], [3])
    seen = gens[0].model_copy(update={"input_tokens": 100, "output_tokens": 20, "blind": found})
    outcomes = [verify_generation(seen), verify_generation(gens[1])]
    generator = token_usage(outcomes)["total"]["generator"]
    # Two generations (one without counts) and one blind request.
    assert (generator["calls"], generator["prompt_tokens"], generator["completion_tokens"]) == (
        3,
        112,
        23,
    )
    assert generator["calls_without_usage"] == 1
