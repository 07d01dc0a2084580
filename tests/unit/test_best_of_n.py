"""Best-of-n through every stage's registered task, the generator's included, wired by
`bootstrap` with fakes: a stochastic stand-in model (named as one: not a model) that
answers right with probability p per sample, drawn from the sample's seed; a judge that
abstains (UNSURE), so yields come from the verifier alone. Checked: the yield at n
against 1 - (1 - p)^n, reruns, `distinct`, the judge's gate, the rows, the report and the
audit."""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rsieve import redis_keys
from rsieve.adapters.gate import EngineGate
from rsieve.compact.rows import FEATURES, SAMPLE_FIELDS
from rsieve.compact.settle import dataset_conflict
from rsieve.dataset.audit import audit_run
from rsieve.generate.draws import sample_seed
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest, singles
from rsieve.schemas import ShardOutput
from rsieve.settings import Settings
from rsieve.verify import canonical
from services.context import Context
from tests.e2e.pools import picture
from tests.fakes import MemoryStore
from tests.fakestack import FakeStack

ITEMS = 240
P = 0.3
ABSTAIN = ModelInfo(name="abstaining-judge", version="1", interface="rsieve", kind="stand-in")


class StochasticStandIn:
    """A stand-in for a sampled VLM (not a model): right with probability `p` per sample,
    decided by the sample's seed (or, asked without one, by the question: greedy, the same
    every time). A right answer takes one of `forms` of the reference; a wrong one is a
    word of its own. Every answer has reasoning that names its seed."""

    def __init__(self, p: float, forms: Callable[[str, random.Random], str] | None = None):
        self.p, self.forms = p, forms or (lambda ref, rng: ref)
        self.info: ModelInfo | None = None
        self.asked: list[ModelRequest] = []

    def bind(self, gate: EngineGate, on_ready: Callable[[ModelInfo], None]) -> StochasticStandIn:
        self.on_ready = on_ready
        return self

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        requests = singles(requests)  # one reply per sample, as an engine without n
        self.info = ModelInfo(
            name="stochastic-stand-in", version="1", interface="rsieve", kind="stand-in"
        )
        self.on_ready(self.info)
        self.asked += requests
        replies: list[ModelReply | Exception] = []
        for r in requests:
            seed = (
                r.seed
                if r.seed is not None
                else int(hashlib.sha256(r.prompt.encode()).hexdigest()[:8], 16)
            )
            rng = random.Random(seed)
            named = re.search(r"Say the word (\w+)", r.prompt)  # (make_pool)
            assert named is not None
            reference = named[1]
            answer = self.forms(reference, rng) if rng.random() < self.p else f"wrong{seed % 97}"
            replies.append(
                ModelReply(text=f"<think>seed {seed}</think>{answer}", finish_reason="stop")
            )
        return replies


class Abstain:
    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.asked = 0

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ABSTAIN
        self.asked += len(requests)
        return [ModelReply(text="UNSURE", finish_reason="stop") for _ in requests]


def make_pool(folder: Path, count: int = ITEMS, protocol: str = "alnum") -> Path:
    """`count` items on pictures of their own; the question names the answer's word,
    which the stand-in reads (a test of sampling, not of reading)."""
    folder.mkdir(parents=True)
    lines = []
    for i in range(count):
        word = f"W{i:04d}X"
        buf = io.BytesIO()
        picture(f"bon-{i}", (96, 64)).save(buf, format="PNG")
        (folder / f"{i}.png").write_bytes(buf.getvalue())
        lines.append(
            json.dumps(
                {
                    "id": f"bon-{i}",
                    "family": "SynthWords",
                    "image": f"{i}.png",
                    "question": f"Say the word {word}",
                    "answer": word,
                    "protocol": protocol,
                    "source": {"sha256": hashlib.sha256(buf.getvalue()).hexdigest()},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def pipeline(
    pool: Path,
    model: StochasticStandIn,
    dataset: str = "bon",
    sampling: dict[str, Any] | None = None,
    **settings: Any,
) -> tuple[Context, MemoryStore, str, Abstain]:
    """The pool through every task on the FakeStack (tests/fakestack.py); `settings`: the
    services', `sampling`: the run's own (as POST /runs takes it)."""
    judge = Abstain()
    stack = FakeStack(judge=judge, generator=model, **({"shard_size": 64} | settings))
    run = stack.run(pool, dataset, sampling=sampling)
    return stack.ctx, stack.store, run, judge


def outputs(ctx: Context, run: str) -> dict[str, dict[str, ShardOutput]]:
    index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
    return {
        stage: {shard: ctx.load(run, stage, shard) for shard in index["shards"]}
        for stage in ("clean", "generate", "verify", "judge")
    }


def report(store: MemoryStore, dataset: str, run: str) -> dict[str, Any]:
    return dict(json.loads(store.get(f"datasets/{dataset}/commits/{run}/run_report.json")))


def rows(store: MemoryStore, dataset: str) -> dict[str, list[dict[str, Any]]]:
    manifest = json.loads(store.get(f"datasets/{dataset}/manifest.json"))
    out: dict[str, list[dict[str, Any]]] = {}
    for shard in manifest["shards"]:
        table = pq.read_table(io.BytesIO(store.get(f"datasets/{dataset}/{shard['path']}")))
        out.setdefault(shard["split"], []).extend(table.drop(["image"]).to_pylist())
    return out


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pool(tmp_path_factory.mktemp("bon") / "pool")


@pytest.fixture(scope="module")
def runs(pool: Path) -> dict[int, tuple[Context, MemoryStore, str, Abstain, StochasticStandIn]]:
    done = {}
    for n in (1, 4, 8):
        model = StochasticStandIn(P)
        # Every sample drawn (enough=0): the yield of fixed n; adaptive stopping is
        # tests/unit/test_adaptive.py's.
        kw: dict[str, Any] = {} if n == 1 else {"samples": n, "temperature": 0.7, "enough": 0}
        ctx, store, run, judge = pipeline(pool, model, **kw)
        done[n] = (ctx, store, run, judge, model)
    return done


def test_the_yield_at_n_is_one_minus_the_chance_that_every_sample_fails(
    runs: dict[int, Any],
) -> None:
    for n, (_, store, run, _, model) in runs.items():
        accepted = report(store, "bon", run)["families"]["SynthWords"]["accepted"]
        expected = 1 - (1 - P) ** n
        half = 1.96 * math.sqrt(expected * (1 - expected) / ITEMS)  # 95% binomial interval
        assert abs(accepted / ITEMS - expected) <= half, (n, accepted / ITEMS, expected)
        assert len(model.asked) == n * ITEMS


def test_every_sample_is_asked_with_its_own_derived_seed(runs: dict[int, Any]) -> None:
    _, _, _, _, greedy = runs[1]
    assert all(r.seed is None for r in greedy.asked)  # one sample: the request as before
    ctx, _, run, _, model = runs[4]
    seeds = [r.seed for r in model.asked]
    assert len(set(seeds)) == len(seeds) == 4 * ITEMS
    gens = [g for out in outputs(ctx, run)["generate"].values() for g in out.generations]
    for g in gens:
        assert g.sample is not None and g.seed == sample_seed(0, g.item.id, g.sample)


def test_a_rerun_with_the_same_seed_reproduces_every_row(pool: Path, runs: dict[int, Any]) -> None:
    _, store, _, _, _ = runs[4]
    _, again, _, _ = pipeline(pool, StochasticStandIn(P), samples=4, temperature=0.7, enough=0)
    assert rows(again, "bon") == rows(store, "bon")
    _, other, _, _ = pipeline(
        pool, StochasticStandIn(P), samples=4, temperature=0.7, seed=1, enough=0
    )
    assert rows(other, "bon") != rows(store, "bon")


def test_rows_carry_the_pass_rate_and_the_samples_only_with_best_of_n(
    runs: dict[int, Any],
) -> None:
    plain = rows(runs[1][1], "bon")
    assert all(
        set(qa) == set(FEATURES["qa"].feature)
        for r in plain.values()
        for row in r
        for qa in row["qa"]
    )
    sampled = rows(runs[4][1], "bon")
    accepted = [qa for row in sampled["SynthWords_RS_nothink"] for qa in row["qa"]]
    rejected = [qa for row in sampled["SynthWords_rejected"] for qa in row["qa"]]
    assert accepted and rejected
    for qa in accepted:
        assert set(SAMPLE_FIELDS) <= set(qa)
        assert 1 <= qa["passed"] <= qa["samples"] == 4 and qa["pass_rate"] == qa["passed"] / 4
        assert qa["answer"] == qa["org_answer"]  # the stand-in's right answer is the word
    for qa in rejected:
        assert qa["passed"] == 0 and qa["wrong_answers"] and qa["wrong_vlm"] in qa["wrong_answers"]
    # `first` keeps one entry per item.
    ids = [qa["id"] for qa in accepted]
    assert len(ids) == len(set(ids))
    rep = report(runs[4][1], "bon", runs[4][2])
    summary = rep["sampling"]["SynthWords"]
    assert summary["items"] == ITEMS and summary["samples"] == 4 * ITEMS
    assert sum(summary["pass_histogram"].values()) == ITEMS
    assert summary["accepted_at_n"] == len(ids)
    assert summary["accepted_at_1"] < summary["accepted_at_n"]
    assert "sampling" not in report(runs[1][1], "bon", runs[1][2])
    card = runs[4][1].get(f"datasets/bon/commits/{runs[4][2]}/README.md").decode()
    assert "## Best-of-n" in card and "answered every question 4 times" in card
    row = f"| SynthWords | {ITEMS} | {4 * ITEMS} | {summary['accepted_at_n']} |"
    assert row in card
    plain = runs[1][1].get(f"datasets/bon/commits/{runs[1][2]}/README.md").decode()
    assert "## Best-of-n" not in plain and "times" not in plain.split("## ")[1]


def test_the_judge_sees_only_items_no_sample_passed_within_its_cap(runs: dict[int, Any]) -> None:
    ctx, store, run, judge, _ = runs[4]
    failed_items = ITEMS - report(store, "bon", run)["families"]["SynthWords"]["accepted"]
    assert judge.asked == failed_items  # judge_samples 1: one call per such item
    settled = [o for out in outputs(ctx, run)["judge"].values() for o in out.outcomes]
    assert len(settled) == ITEMS
    for o in settled:
        assert o.samples is not None and o.samples.n == 4
        assert (o.verdict is not None) == (o.place == "rejected")


def test_the_audit_counts_items_and_samples(runs: dict[int, Any]) -> None:
    for n, (ctx, _, run, _, _) in runs.items():
        index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
        result = audit_run(index, outputs(ctx, run))
        assert result.ok, result.problems
        assert result.samples == n * ITEMS
        assert result.families["SynthWords"]["generate"]["out"] == ITEMS
    # A lost sample is found.
    ctx, _, run, _, _ = runs[4]
    outs = outputs(ctx, run)
    shard = next(iter(outs["verify"]))
    outs["verify"][shard] = outs["verify"][shard].model_copy(
        update={"verified": outs["verify"][shard].verified[1:]}
    )
    index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
    assert any("samples generated" in p for p in audit_run(index, outs).problems)


def test_distinct_never_keeps_two_answers_that_normalise_the_same(tmp_path: Path) -> None:
    """Right answers come as forms anls normalises together (case, spacing) or as one it
    does not (a trailing 'S', which the benchmark accepts: distance 1/7; training at the
    benchmark's pass, so it is kept, not refused as a near miss)."""

    def forms(reference: str, rng: random.Random) -> str:
        return rng.choice([reference.lower(), f"  {reference} ", reference, reference + "S"])

    pool = make_pool(tmp_path / "pool", count=40, protocol="anls")
    _ctx, store, _run, _ = pipeline(
        pool,
        StochasticStandIn(0.9, forms),
        samples=8,
        temperature=0.7,
        keep="distinct",
        max_kept=8,
        training_rules={"anls": "benchmark"},
    )
    accepted = [qa for row in rows(store, "bon")["SynthWords_RS_nothink"] for qa in row["qa"]]
    by_item: dict[str, list[str]] = {}
    for qa in accepted:
        by_item.setdefault(qa["id"], []).append(qa["answer"])
    folded = {i: [canonical("anls", a) for a in answers] for i, answers in by_item.items()}
    assert all(len(f) == len(set(f)) for f in folded.values()), folded
    assert max(len(f) for f in folded.values()) == 2  # both forms kept where both came


def test_several_samples_need_a_dataset_of_their_own(runs: dict[int, Any]) -> None:
    _, store, _, _, _ = runs[1]
    manifest = json.loads(store.get("datasets/bon/manifest.json"))
    assert dataset_conflict(manifest, 1) is None
    assert "another dataset" in (dataset_conflict(manifest, 4) or "")
    sampled = json.loads(runs[4][1].get("datasets/bon/manifest.json"))
    assert sampled["sampled"] is True and "sampled" not in manifest


def test_a_run_chooses_its_own_sampling(pool: Path, runs: dict[int, Any]) -> None:
    """The services at their defaults (one sample); the submission asks for four: every
    stage reads them from the run's spec, and the rows are those of services set to four."""
    ctx, store, run, _ = pipeline(
        pool, StochasticStandIn(P), sampling={"samples": 4, "temperature": 0.7, "enough": 0}
    )
    assert ctx.settings.samples == 1 and ctx.spec(run).settings["samples"] == 4
    assert run == runs[4][2]  # the same run id as services set to four
    assert rows(store, "bon") == rows(runs[4][1], "bon")


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"samples": 4}, "RSIEVE_TEMPERATURE"),
        ({"samples": 4, "temperature": 0.7, "judge_model": "x"}, "may choose only"),
    ],
)
def test_a_runs_sampling_is_validated(pool: Path, sampling: dict[str, Any], message: str) -> None:
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as err:
        pipeline(pool, StochasticStandIn(P), sampling=sampling)
    assert err.value.status_code == 422 and message in str(err.value.detail)
    assert "s3_secret_key" not in str(err.value.detail)


def test_a_pass_rate_window_quarantines_accepted_items_outside_it(
    pool: Path, runs: dict[int, Any]
) -> None:
    """The same samples as the n = 8 run (same seeds): the accepted items whose pass rate
    lies outside [0.2, 0.8] are quarantined, with their own reason; the rest is as it was."""
    window = [0.2, 0.8]
    ctx, store, run, _ = pipeline(
        pool, StochasticStandIn(P), samples=8, temperature=0.7, pass_rate_window=window
    )
    histogram = report(runs[8][1], "bon", runs[8][2])["sampling"]["SynthWords"]["pass_histogram"]
    outside = sum(
        count
        for rate, count in histogram.items()
        if (k := int(rate.split("/")[0])) > 0 and not window[0] <= k / 8 <= window[1]
    )
    assert outside > 0
    fam = report(store, "bon", run)["families"]["SynthWords"]
    assert fam["quarantined_by_reason"] == {"pass_rate_window": outside}
    accepted_before = report(runs[8][1], "bon", runs[8][2])["families"]["SynthWords"]["accepted"]
    assert fam["accepted"] == accepted_before - outside
    assert fam["adds_up"]
    index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
    assert audit_run(index, outputs(ctx, run)).ok
    for qa in (q for row in rows(store, "bon")["SynthWords_RS_nothink"] for q in row["qa"]):
        assert window[0] <= qa["pass_rate"] <= window[1]


def test_a_pass_rate_window_needs_several_samples() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="several samples"):
        Settings(pass_rate_window=[0.2, 0.8])
    with pytest.raises(ValidationError, match="low <= high"):
        Settings(samples=4, temperature=0.7, pass_rate_window=[0.8, 0.2])


class SameLetter:
    """A stand-in (not a model) that answers "A" to every question."""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.asked: list[ModelRequest] = []

    def bind(self, gate: EngineGate, on_ready: Callable[[ModelInfo], None]) -> SameLetter:
        self.on_ready = on_ready
        return self

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        requests = singles(requests)  # one reply per sample, as an engine without n
        self.info = ModelInfo(name="same-letter", version="1", interface="rsieve", kind="stand-in")
        self.on_ready(self.info)
        self.asked += requests
        return [ModelReply(text="<think>always A</think>A", finish_reason="stop") for _ in requests]


def make_mcq_pool(folder: Path, count: int = 40) -> Path:
    """A 4-option family whose right letters are A, B, C, D in turn."""
    folder.mkdir(parents=True)
    lines = []
    for i in range(count):
        buf = io.BytesIO()
        picture(f"mcq-{i}", (96, 64)).save(buf, format="PNG")
        (folder / f"{i}.png").write_bytes(buf.getvalue())
        words = [f"alpha{i}", f"beta{i}", f"gamma{i}", f"delta{i}"]
        block = "\n".join(f"{letter}. {w}" for letter, w in zip("ABCD", words, strict=True))
        lines.append(
            json.dumps(
                {
                    "id": f"mcq-{i}",
                    "family": "SynthChoice",
                    "image": f"{i}.png",
                    "question": f"Which word is shown?\nOptions:\n{block}\nAnswer with the letter.",
                    "answer": "ABCD"[i % 4],
                    "protocol": "mc",
                    "source": {"sha256": hashlib.sha256(buf.getvalue()).hexdigest()},
                }
            )
        )
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_circular_sampling_never_accepts_a_lucky_letter(tmp_path: Path) -> None:
    pool = make_mcq_pool(tmp_path / "pool")
    model = SameLetter()
    _, once, run1, _ = pipeline(pool, model, dataset="mcq")  # type: ignore[arg-type]
    fam = report(once, "mcq", run1)["families"]["SynthChoice"]
    assert fam["accepted"] == 40 // 4  # a quarter: the items whose right letter is A
    model = SameLetter()
    ctx, circ, run4, _ = pipeline(
        pool,
        model,  # type: ignore[arg-type]
        dataset="mcq",
        samples=4,
        circular=True,  # greedy: the rotations differ, not the seeds
    )
    fam = report(circ, "mcq", run4)["families"]["SynthChoice"]
    assert fam["accepted"] == 0
    # "A" is right in exactly one rotation of every item: each is a lucky guess once.
    assert fam["rejected_by_reason"] == {"circular_inconsistent": 40}
    settled = [o for out in outputs(ctx, run4)["judge"].values() for o in out.outcomes]
    assert all(o.samples is not None and len(o.samples.passed) == 1 for o in settled)
    # Each item was asked once per rotation: the four option orders, the reference moved.
    by_item: dict[str, list[str]] = {}
    for out in outputs(ctx, run4)["generate"].values():
        for g in out.generations:
            by_item.setdefault(g.item.id, []).append(g.item.question)
            words = g.item.options or {}
            (right,) = g.item.references
            assert (
                words[right]
                == dict(zip("ABCD", ["alpha", "beta", "gamma", "delta"], strict=True))[
                    "ABCD"[int(g.item.id.split("-")[1]) % 4]
                ]
                + g.item.id.split("-")[1]
            )
    assert all(len(set(questions)) == 4 for questions in by_item.values())
    index = json.loads(ctx.store.get(f"runs/{run4}/shards.json"))
    assert audit_run(index, outputs(ctx, run4)).ok


@pytest.mark.parametrize("n", [1, 4])
def test_an_item_isolated_by_the_verifier_is_accounted_by_its_quarantine(
    runs: dict[int, Any], n: int
) -> None:
    """As a poison item leaves (ItemGuard, max_deliveries): generated, then quarantined
    at the verifier with all its samples; the audit holds."""
    from rsieve.schemas import Quarantined

    ctx, _, run, _, _ = runs[n]
    outs = outputs(ctx, run)
    shard = next(iter(outs["verify"]))
    line = outs["verify"][shard].verified[0].generation.item.line
    item = outs["verify"][shard].verified[0].generation.item
    poisoned = Quarantined(
        id=item.id, line=line, family=item.family, stage="verify", reason="max_deliveries"
    )
    outs["verify"][shard] = outs["verify"][shard].model_copy(
        update={
            "verified": [
                o for o in outs["verify"][shard].verified if o.generation.item.line != line
            ],
            "quarantined": [*outs["verify"][shard].quarantined, poisoned],
        }
    )
    outs["judge"][shard] = outs["judge"][shard].model_copy(
        update={
            "outcomes": [o for o in outs["judge"][shard].outcomes if o.generation.item.line != line]
        }
    )
    index = json.loads(ctx.store.get(f"runs/{run}/shards.json"))
    result = audit_run(index, outs)
    assert result.ok, result.problems


class CountsCalls(StochasticStandIn):
    """The stand-in, counting its calls: a round asked in batches is one call a batch, a
    round asked item by item one call an item."""

    def __init__(self, p: float) -> None:
        super().__init__(p)
        self.calls = 0

    async def generate_many_async(
        self, requests: Sequence[ModelRequest]
    ) -> list[ModelReply | Exception]:
        self.calls += 1
        return await super().generate_many_async(requests)


def test_adaptive_rounds_are_one_delivery_and_stay_batched(tmp_path: Path) -> None:
    """The rounds adaptive best-of-n asks are one delivery of the shard (ItemGuard counts a
    delivery per task call, not per round): with `max_deliveries` 1 a shard asked in four
    rounds is still asked a batch at a time, never item by item as a shard that keeps
    killing its worker is."""
    pool = make_pool(tmp_path / "pool", count=24)
    model = CountsCalls(P)
    ctx, _, run, _ = pipeline(pool, model, samples=8, temperature=0.7, max_deliveries=1)
    shards = json.loads(ctx.store.get(f"runs/{run}/shards.json"))["shards"]
    assert len(shards) == 1
    shard = next(iter(shards))
    per_item = Counter(g.item.id for g in ctx.load(run, "generate", shard).generations)
    rounds = math.ceil(max(per_item.values()) / 2)  # two samples a round
    assert rounds >= 3  # the rounds past the first are past max_deliveries
    assert ctx.redis.get(redis_keys.deliveries("generate", run, shard)) == b"1"
    batch = ctx.settings.progress_batch_items  # samples a call
    asked = [sum(2 for n in per_item.values() if n > 2 * r) for r in range(rounds)]
    assert asked[-1] > 2 and model.calls == sum(math.ceil(n / batch) for n in asked)
