"""One of each of a run's bookkeeping: the run id written and read by one core module
(rsieve.run.submission), the people's review tally counted by one function for the card
and the API, and one resume (services.runs.reconcile) for `rsieve reconcile` and the API's
POST /runs/<run>/resume. On fakes (tests/fakes.py), no stack."""

from __future__ import annotations

import json

import fakeredis
import pytest
from fastapi import HTTPException

from rsieve import keys, redis_keys
from rsieve.dataset.commit import human_review
from rsieve.judge.calibration import review_tally
from rsieve.run.submission import RUN_PATTERN, is_run_id, run_id
from rsieve.schemas import RunSpec
from rsieve.settings import Settings
from services.api import runs as api_runs
from services.api.routes import runs as routes
from services.context import Context
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent

RUN = "ds-0123456789ab"


def test_a_run_id_is_what_its_parse_accepts_and_nothing_else() -> None:
    made = run_id("f" * 64, "my.data_set-1", {"temperature": 0.0}, {"alnum": "1"})
    assert made.startswith("my.data_set-1-") and len(made) == len("my.data_set-1-") + 12
    assert is_run_id(made) and RUN_PATTERN.fullmatch(made)
    for name in ("ds", "ds-0123456789a", "ds-0123456789abc", "ds-0123456789AB", "-0123456789ab"):
        assert not is_run_id(name), name
    assert not is_run_id("../x-0123456789ab") and not is_run_id("ds-0123456789ab\n")


def context() -> tuple[Context, Sent]:
    sent = Sent()
    ctx = bootstrap(Settings(), store=MemoryStore(), redis_client=fakeredis.FakeRedis(), send=sent)
    spec = RunSpec(
        run=RUN, dataset="ds", pool_uri="s3://b/p", pool_sha256="0", settings={}, protocols={}
    )
    ctx.store.put(keys.run_spec(RUN), spec.model_dump_json().encode())
    return ctx, sent


def test_the_api_refuses_a_name_that_is_no_run_id_before_it_reads() -> None:
    ctx, _ = context()
    assert api_runs.spec(ctx, RUN).run == RUN
    with pytest.raises(HTTPException) as refused:
        api_runs.spec(ctx, "ds-0123456789AB")
    assert refused.value.status_code == 404


REVIEWS = [
    {"item_id": "a", "family": "SynthWords", "verdict": "confirmed"},
    {"item_id": "b", "family": "SynthWords", "verdict": "wrong"},
    {"item_id": "c", "family": "SynthWords", "verdict": "unsure"},  # not a verdict we count
    {"item_id": "d", "family": "SynthChoice", "verdict": "maybe"},
]
TALLY = {"SynthChoice": {"confirmed": 0, "wrong": 0}, "SynthWords": {"confirmed": 1, "wrong": 1}}


def test_an_unknown_verdict_is_skipped_by_the_card_and_by_the_api() -> None:
    assert review_tally(REVIEWS) == TALLY
    assert human_review(REVIEWS)[0] == TALLY
    ctx, _ = context()
    for review in REVIEWS:
        ctx.store.put(keys.review(RUN, review["item_id"]), json.dumps(review).encode())
    shard = {"run": RUN, "shard": "00000", "size": 30, "rate": 0.1, "records": []}
    ctx.store.put(keys.calibration(RUN, "00000"), json.dumps(shard).encode())
    assert routes.calibration(RUN, ctx)["human_review"] == TALLY


def test_the_apis_resume_is_reconcile() -> None:
    """A stopped run with its first shard generated and its second only cleaned: the API's
    resume clears the stop and sends each shard's next missing stage, as reconcile does."""
    ctx, sent = context()
    index = {"lines": 8, "shards": {"00000": 4, "00001": 4}}
    ctx.store.put(keys.shards(RUN), json.dumps(index).encode())
    for stage, shard in (("clean", "00000"), ("generate", "00000"), ("clean", "00001")):
        ctx.store.put(keys.stage_output(RUN, stage, shard), b"{}")
    ctx.redis.set(redis_keys.run_stopped(RUN), "every item failed")
    answered = routes.resume(RUN, ctx)
    assert not ctx.redis.exists(redis_keys.run_stopped(RUN))
    expected = [
        ("rsieve.verify", {"shard": "00000", "lines": 4}),
        ("rsieve.generate", {"shard": "00001", "lines": 4}),
    ]
    assert sorted(sent.tasks, key=str) == sorted(
        [(task, {"run": RUN} | kwargs) for task, kwargs in expected], key=str
    )
    assert sorted(map(tuple, answered["enqueued"]), key=str) == sorted(expected, key=str)
    ctx.redis.set(redis_keys.run_stopped(RUN), "every item failed")
    assert sorted(ctx.reconcile(RUN), key=str) == sorted(expected, key=str)
    assert not ctx.redis.exists(redis_keys.run_stopped(RUN))
