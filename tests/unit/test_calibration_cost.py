"""Calibration costs what it uses: each family's eligible rate comes from its item count
known when the pool was planned (shards.json `families`), so a run probes about 1.5 x the
calibration size per family whatever the number of shards, and the run-wide bottom-k that
`summarise` keeps stays exact. Through the pure functions and through the judge task."""

from __future__ import annotations

import json
from collections.abc import Sequence

import fakeredis
import pytest

from rsieve.clean.cleaning import family_items
from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest
from rsieve.judge.calibration import (
    CalibrationShard,
    calibration_key,
    calibration_record,
    summarise,
)
from rsieve.judge.probes import (
    CALIBRATION_OVERSAMPLING,
    calibration_probes,
    calibration_rates,
    probe_prompt,
    sample_for_calibration,
    sample_rank,
)
from rsieve.run.shards import shard_label
from rsieve.schemas import Outcome, RunSpec, ShardOutput
from rsieve.settings import Settings
from services.judge.tasks import register as judge_tasks
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent
from tests.unit._records import accepted, make_item

SHARDS, PER_SHARD, SIZE = 64, 96, 60
FAMILY = "SynthWords"
WORDS = ["COFFEE", "TEA", "BREAD", "Water 12", "MILK 305", "SUGAR", "SALT 7", "OIL"]


def _shards(shards: int = SHARDS, per_shard: int = PER_SHARD) -> list[list[Outcome]]:
    """`shards` shards of `per_shard` verifier-accepted items of one family."""
    return [
        [
            accepted(
                make_item(
                    f"w-{s}-{i}",
                    line=s * per_shard + i + 1,
                    family=FAMILY,
                    references=[f"{WORDS[i % len(WORDS)]} {s}x{i}"],
                )
            )
            for i in range(per_shard)
        ]
        for s in range(shards)
    ]


@pytest.fixture(scope="module")
def shards() -> list[list[Outcome]]:
    return _shards()


def test_rates_from_the_family_counts() -> None:
    rates = calibration_rates({"Big": 10_000, "Small": 50, "Empty": 0}, size=60, rate=1.0)
    assert rates == {"Big": CALIBRATION_OVERSAMPLING * 60 / 10_000, "Small": 1.0, "Empty": 1.0}
    # The configured rate stays a cap; size 0 probes nothing.
    assert calibration_rates({"Big": 10_000}, size=60, rate=0.001) == {"Big": 0.001}
    assert calibration_rates({"Big": 10_000}, size=0) == {"Big": 0.0}
    assert CALIBRATION_OVERSAMPLING == 1.5


def test_family_counts_from_the_cleaning_report() -> None:
    report = {
        "families": {
            "A": {"purity": {"items": 12, "kept": 10}, "mcq": {}},
            "B": {"purity": None, "mcq": {}, "duplicate_items": 3},  # every item a duplicate
            "C": {"purity": {"items": 2, "kept": 0}, "mcq": {}},
        }
    }
    assert family_items(report) == {"A": 10}
    assert family_items({}) == {}


def test_64_shards_probe_about_the_size_run_wide(shards: list[list[Outcome]]) -> None:
    everything = [o for shard in shards for o in shard]
    rates = calibration_rates({FAMILY: len(everything)}, size=SIZE)
    records = []
    for shard in shards:
        records += [
            calibration_record(p, model="m", prompt=probe_prompt(p), raw_output="WRONG")
            for p in calibration_probes(shard, size=SIZE, rates=rates)
        ]
    probed = {r.probe.item_id for r in records}
    assert SIZE <= len(probed) <= 2 * SIZE
    # Enough are eligible: the run-wide bottom-k is exactly that of every accepted item.
    bottom = sorted((sample_rank(o.generation.item.id), o.generation.item.id) for o in everything)
    summary = summarise(records, size=SIZE)[FAMILY]
    assert summary["items"] == SIZE
    kept = {r.probe.item_id for r in records if r.probe.rank <= bottom[SIZE - 1][0]}
    assert kept == {i for _, i in bottom[:SIZE]}
    # Every sampled item has its known-wrong probes, another item's reference included,
    # though most shards sample one item or none (its peers are the shard's accepted).
    kinds = {r.probe.kind for r in records}
    assert {"agreement", "other_reference", "digit_changed", "master_key"} <= kinds
    # The flat rate probed `size` items per family in every shard: 64 x 60.
    flat = {o.generation.item.id for s in shards for o in sample_for_calibration(s, size=SIZE)}
    assert len(flat) == SHARDS * SIZE


class ProbeCounter:
    """A judge that answers WRONG and keeps every prompt it was sent."""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.prompts: list[str] = []

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="judge-m", version="1", interface="rsieve", kind="llm")
        self.prompts += [r.prompt for r in requests]
        return [ModelReply(text="WRONG", finish_reason="stop") for _ in requests]


@pytest.mark.parametrize("planned", [True, False])
def test_the_judge_task_probes_at_most_twice_the_size_over_64_shards(
    shards: list[list[Outcome]], planned: bool
) -> None:
    # Unplanned, each shard probes the calibration size whatever the others do: 8 shards
    # show the flat rate as 64 would, at an eighth of the judge calls.
    shards = shards if planned else shards[:8]
    store, judge = MemoryStore(), ProbeCounter()
    settings = Settings(judge_model="judge-m", judge_calibration_size=SIZE)
    ctx = bootstrap(
        settings,
        store=store,
        redis_client=fakeredis.FakeRedis(),
        send=Sent(),
        judge_model=lambda name: judge,
    )
    judge_tasks(ctx)
    run = "cost-000000000000"
    spec = RunSpec(
        run=run,
        dataset="cost",
        pool_uri="s3://rsieve/p/",
        pool_sha256="0" * 64,
        settings={},
        protocols={},
    )
    store.put(f"runs/{run}/run.json", spec.model_dump_json().encode())
    names = [shard_label(n) for n in range(len(shards))]
    index: dict[str, object] = {
        "shards": dict.fromkeys(names, PER_SHARD),
        "lines": len(shards) * PER_SHARD,
        "blank_lines": [],
    }
    if planned:
        index["families"] = {FAMILY: SHARDS * PER_SHARD}
    store.put(f"runs/{run}/shards.json", json.dumps(index).encode())
    for name, shard in zip(names, shards, strict=True):
        out = ShardOutput(run=run, shard=name, stage="verify", lines=PER_SHARD, verified=shard)
        ctx.save(out)
        ctx.app.tasks["rsieve.judge"](run=run, shard=name, lines=PER_SHARD)
    stored = [
        CalibrationShard.model_validate_json(store.get(calibration_key(run, n))) for n in names
    ]
    probed = {r.probe.item_id for s in stored for r in s.records}
    stops = [st for s in stored for st in s.stops.values()]
    # No shard holds the whole family: each asks its whole part of the sample, and every
    # part's probes (all judged WRONG) count towards the run's decision.
    assert stops and all(st.asked == st.capacity and not st.complete for st in stops)
    if not planned:  # a run planned before family counts: the flat rate, size per shard
        assert len(probed) == len(shards) * SIZE and all(s.rates == {} for s in stored)
        return
    assert SIZE <= len(probed) <= 2 * SIZE
    assert len(judge.prompts) == sum(len(s.records) for s in stored)
    rate = CALIBRATION_OVERSAMPLING * SIZE / (SHARDS * PER_SHARD)
    assert all(s.rates == {FAMILY: rate} for s in stored)
    assert summarise([r for s in stored for r in s.records], size=SIZE)[FAMILY]["items"] == SIZE
