"""Judge each thing once (rsieve.judge.judgecache): the content-addressed key, what is stored and
read back, and the judge stage with a fake model: the example pool judged twice, the second
run asks nothing and its report and card count the verdicts as reused."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import fakeredis
import pytest

from rsieve.generate.generation import ModelInfo, ModelReply, ModelRequest
from rsieve.judge.calibration import CalibrationShard, calibration_key
from rsieve.judge.cascade import apply_verdict, judge_prompt, verify_generation
from rsieve.judge.judgecache import (
    CACHE_PREFIX,
    JudgeIdentity,
    cache_entry,
    judge_identity,
    read_cached,
    reply_fields,
    to_send,
    verdict_key,
)
from rsieve.judge.verdicts import TEMPLATE_SHA256
from rsieve.schemas import ShardOutput
from rsieve.settings import Settings
from services.api.submission import submit
from services.cleaner.tasks import register as clean_tasks
from services.compactor.tasks import register as compact_tasks
from services.context import Context
from services.judge.ask import ask_once
from services.judge.tasks import register as judge_tasks
from services.verifier.tasks import register as verify_tasks
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent
from tests.unit._records import make_generation, make_item
from tests.unit.test_services_with_fakes import fake_generate, run_task

ROOT = Path(__file__).resolve().parents[2]
JUDGE = JudgeIdentity("judge-m", "ab" * 32, 64)
PROMPT = "grade this"


# --- the key ---------------------------------------------------------------------------


def test_the_key_is_content_addressed_outside_runs() -> None:
    key = verdict_key(JUDGE, PROMPT)
    assert key.startswith(CACHE_PREFIX) and not key.startswith("runs/")
    assert key == verdict_key(JudgeIdentity("judge-m", "ab" * 32, 64), "grade this")
    assert JUDGE.template_sha256 == TEMPLATE_SHA256  # the judge template's, by default


@pytest.mark.parametrize(
    ("judge", "prompt"),
    [
        (JudgeIdentity("judge-other", "ab" * 32, 64), PROMPT),  # another model
        (JudgeIdentity("judge-m", "cd" * 32, 64), PROMPT),  # other weights
        (JudgeIdentity("judge-m", "", 64), PROMPT),  # weights undeclared
        (JudgeIdentity("judge-m", "ab" * 32, 64, template_sha256="0" * 64), PROMPT),
        (JudgeIdentity("judge-m", "ab" * 32, 65), PROMPT),  # another budget
        (JudgeIdentity("judge-m", "ab" * 32, 64, asked='{"interface": "vllm"}'), PROMPT),
        (JUDGE, PROMPT + " "),  # a prompt one byte longer
        (JUDGE, "grade\u2060 this"),  # a neutralised special token is another prompt
    ],
)
def test_every_part_changes_the_key(judge: JudgeIdentity, prompt: str) -> None:
    assert verdict_key(judge, prompt) != verdict_key(JUDGE, PROMPT)


def test_the_settings_name_the_judge_and_how_it_is_asked() -> None:
    s = Settings(judge_model="j", judge_weights_sha256="ab" * 32, judge_max_new_tokens=32)
    judge = judge_identity(s)
    assert (judge.model, judge.weights_sha256, judge.max_new_tokens) == ("j", "ab" * 32, 32)
    assert judge.template_sha256 == TEMPLATE_SHA256
    keys = {
        verdict_key(judge_identity(Settings(**kw)), PROMPT)
        for kw in (
            {},
            {"judge_interface": "rsieve"},
            {"judge_interface": "vllm", "judge_tokenizer": "/ckpt"},
            {"judge_interface": "vllm", "judge_tokenizer": "/ckpt", "reasoning": False},
            {"judge_interface": "openai", "judge_openai_url": "http://h/v1"},
            {
                "judge_interface": "openai",
                "judge_openai_url": "http://h/v1",
                "openai_extra_body": {"chat_template_kwargs": {"enable_thinking": True}},
            },
        )
    }
    assert len(keys) == 6
    # What never reaches the judge does not split the cache: the generator's sampling
    # (the judge is greedy), a server's address, the reasoning switch of a server that
    # renders the prompt itself.
    same = {
        verdict_key(judge_identity(Settings(**kw)), PROMPT)
        for kw in (
            {"judge_interface": "rsieve"},
            {"judge_interface": "rsieve", "temperature": 0.7, "samples": 2, "reasoning": False},
            {"judge_interface": "rsieve", "judge_triton_grpc_url": "elsewhere:8001"},
        )
    }
    assert len(same) == 1


def test_parts_cannot_run_into_each_other() -> None:
    # The parts are encoded apart: moving text from one part to the next is another key.
    a = JudgeIdentity("judge-m", "", 64)
    b = JudgeIdentity("judge-", "m", 64)
    assert verdict_key(a, PROMPT) != verdict_key(b, PROMPT)


# --- what is stored and read back -------------------------------------------------------


def _reply(text: str, finish: str = "stop", user: str | None = PROMPT) -> ModelReply:
    return ModelReply(
        text=text, finish_reason=finish, input_tokens=30, output_tokens=2, user_text=user
    )


def test_an_answered_call_is_stored_and_read_back_only_for_its_own_parts() -> None:
    entry = cache_entry(JUDGE, PROMPT, _reply("CORRECT"), model_kind="llm", model_version="3")
    assert entry is not None
    data = entry.model_dump_json().encode()
    assert read_cached(data, JUDGE, PROMPT) == entry
    assert read_cached(data, JUDGE, "another prompt") is None
    assert read_cached(data, JudgeIdentity("judge-m", "ab" * 32, 128), PROMPT) is None
    assert read_cached(b"not json", JUDGE, PROMPT) is None
    assert read_cached(b'{"model": "judge-m"}', JUDGE, PROMPT) is None


def test_a_failed_call_is_never_stored_a_truncated_reply_is() -> None:
    assert cache_entry(JUDGE, PROMPT, RuntimeError("UNAVAILABLE")) is None
    # What the judge received is not the prompt looked up: its key would not name it.
    assert cache_entry(JUDGE, PROMPT, _reply("WRONG", user="other text")) is None
    # Cut off at the budget: what this judge answers within this budget (in the key).
    truncated = cache_entry(JUDGE, PROMPT, _reply("The answer is", finish="length"))
    assert truncated is not None and truncated.finish_reason == "length"


@pytest.mark.parametrize(
    ("text", "finish"), [("CORRECT", "stop"), ("WRONG", "stop"), ("x", "stop"), ("a", "length")]
)
def test_a_reused_reply_is_applied_as_a_fresh_one(text: str, finish: str) -> None:
    pending = verify_generation(make_generation(make_item(references=["TEA"]), "COFFEE"))
    prompt = judge_prompt(pending)
    reply = _reply(text, finish, user=prompt)
    entry = cache_entry(JUDGE, prompt, reply, model_kind="llm")
    assert entry is not None
    fresh = apply_verdict(pending, model="judge-m", prompt=prompt, **reply_fields(reply, "llm"))
    again = apply_verdict(pending, model="judge-m", prompt=prompt, **reply_fields(entry))
    assert fresh.verdict is not None and again.verdict is not None
    assert again.verdict.reused and not fresh.verdict.reused
    assert again.verdict.model_copy(update={"reused": False}) == fresh.verdict
    assert (again.place, again.reason, again.promoted_by) == (
        fresh.place,
        fresh.reason,
        fresh.promoted_by,
    )


def test_only_the_first_of_each_miss_is_sent() -> None:
    keys = ["a", "b", "a", "c", "b"]
    entry = cache_entry(JUDGE, PROMPT, _reply("WRONG"))
    assert entry is not None
    assert to_send(keys, {"c": entry}) == [0, 1]


class CountingJudge:
    """Answers WRONG, CORRECT to prompts holding "yes"; counts the prompts it was sent."""

    def __init__(self) -> None:
        self.info: ModelInfo | None = None
        self.prompts: list[str] = []

    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="judge-m", version="1", interface="rsieve", kind="llm")
        self.prompts += [r.prompt for r in requests]
        return [
            RuntimeError("UNAVAILABLE")
            if "fail" in r.prompt
            else ModelReply(
                text="CORRECT" if "yes" in r.prompt else "WRONG",
                finish_reason="stop",
                input_tokens=10,
                output_tokens=1,
                user_text=r.prompt,
            )
            for r in requests
        ]


def test_ask_once_sends_each_miss_once_and_reuses_the_rest() -> None:
    store, judge = MemoryStore(), CountingJudge()
    first = ask_once(store, judge, JUDGE, ["yes 1", "no 2", "yes 1", "fail 3"])
    assert judge.prompts == ["yes 1", "no 2", "fail 3"]
    assert [f.get("reused", False) for f in first] == [False, False, True, False]
    assert first[2]["raw_output"] == "CORRECT" and first[2]["model_kind"] == "llm"
    assert first[3]["raw_output"] is None and "UNAVAILABLE" in first[3]["failure"]
    assert len(list(store.list(CACHE_PREFIX))) == 2  # the failed call is not stored
    again = ask_once(store, judge, JUDGE, ["no 2", "yes 1", "fail 3"])
    assert judge.prompts[3:] == ["fail 3"]  # only the failed call is asked again
    assert [f.get("reused", False) for f in again] == [True, True, False]
    assert [f["prompt"] for f in again] == ["no 2", "yes 1", "fail 3"]
    # Another budget is another judgement: asked again.
    ask_once(store, judge, JudgeIdentity("judge-m", "ab" * 32, 65), ["no 2"])
    assert judge.prompts[4:] == ["no 2"]


# --- the judge stage: the example pool judged twice -------------------------------------


class TableJudge(CountingJudge):
    def generate_many(self, requests: Sequence[ModelRequest]) -> list[ModelReply | Exception]:
        self.info = ModelInfo(name="table-judge", version="1", interface="rsieve", kind="test")
        self.prompts += [r.prompt for r in requests]
        return [
            ModelReply(
                text="CORRECT" if "COFFEE" in r.prompt else "WRONG",
                finish_reason="stop",
                input_tokens=len(r.prompt.split()),
                output_tokens=1,
            )
            for r in requests
        ]


def _context(store: MemoryStore, judge: CountingJudge) -> tuple[Context, Sent]:
    sent = Sent()
    # A bound this pool's families can clear (4 clean verdicts), so calibration is asked.
    settings = Settings(
        purity_embedding=False,
        judge_model="table-judge",
        judge_calibration_size=3,
        judge_false_promotion_bound=0.5,
    )
    context = bootstrap(
        settings,
        store=store,
        redis_client=fakeredis.FakeRedis(),
        send=sent,
        judge_model=lambda name: judge,
    )
    for register in (clean_tasks, verify_tasks, judge_tasks, compact_tasks):
        register(context)
    return context, sent


def _run_pool(context: Context, sent: Sent, uri: str, dataset: str) -> str:
    run = submit(context, uri, dataset)
    sent.tasks.clear()
    run_task(context, "rsieve.ingest", run=run)
    for kw in [kw for task, kw in sent.tasks if task == "rsieve.clean"]:
        run_task(context, "rsieve.clean", **kw)
        fake_generate(context, **kw)
        run_task(context, "rsieve.verify", **kw)
        run_task(context, "rsieve.judge", **kw)
    run_task(context, "rsieve.compact", run=run)
    return run


def test_the_second_run_of_a_pool_asks_the_judge_nothing(tmp_path: Path) -> None:
    from rsieve.adapters.exports import export_dataset
    from tests.fakestack import upload_once

    store, judge = MemoryStore(), TableJudge()
    context, sent = _context(store, judge)
    uri = upload_once(store, ROOT / "examples" / "pool")
    first = _run_pool(context, sent, uri, "one")
    asked = len(judge.prompts)
    assert list(store.list(CACHE_PREFIX))  # the verdicts are stored outside runs/
    assert asked > 0 and len(set(judge.prompts)) == asked  # each prompt asked once
    second = _run_pool(context, sent, uri, "two")
    assert second != first
    assert len(judge.prompts) == asked  # the second run called the judge zero times

    reports = {d: json.loads(store.get(f"datasets/{d}/run_report.json")) for d in ("one", "two")}
    one, two = reports["one"], reports["two"]
    verdicts = sum(sum(f["judge_verdicts"].values()) for f in two["families"].values())
    assert verdicts > 0
    assert one["judge_reused"]["verdicts"] == 0
    assert two["judge_reused"]["verdicts"] == verdicts
    assert all(
        f["judge_reused"] == sum(f["judge_verdicts"].values()) for f in two["families"].values()
    )
    # The same verdicts, the same places: a reused reply is applied as a fresh one.
    for key in ("accepted", "rejected", "promoted_by_judge", "judge_verdicts"):
        assert {f: v[key] for f, v in one["families"].items()} == {
            f: v[key] for f, v in two["families"].items()
        }
    tokens = two["tokens"]["total"]["judge"]
    probes = two["judge_reused"]["calibration"]
    assert probes > 0 and tokens["calibration"]["reused"] == probes
    assert (tokens["calls"], tokens["prompt_tokens"], tokens["reused"]) == (0, 0, verdicts)
    assert tokens["calibration"]["calls"] == 0
    # Moved from tests/e2e/test_judge_cache.py (docs/testing.md): every call the first
    # report counts is one the judge was sent, and nothing else was sent; the second run's
    # calibration and card count every verdict and probe as reused.
    usage = one["tokens"]["total"]["judge"]
    assert asked == usage["calls"] + usage["calibration"]["calls"] > 0
    assert usage["calibration"]["calls"] + one["judge_reused"]["calibration"] == probes
    assert two["calibration"] and all(
        c["reused"] == sum(c["probes"].values()) for c in two["calibration"].values()
    )
    # Sequential calibration: each family stopped where its bound was decided, and the
    # report and the card say why, per family.
    for family, c in one["calibration"].items():
        stop = c["stop"]
        assert stop["asked"] <= stop["capacity"] and c["held_back"] == (stop["stop"] != "cleared")
        if stop["stop"] == "cleared":  # no more than a round past the 4 verdicts 0.5 needs
            assert 4 <= stop["n"] and c["false_promotion"]["hi"] < 0.5
        assert f"- {family}: {c['reason']}." in store.get("datasets/one/README.md").decode()
    card = (export_dataset(store, "two", tmp_path) / "README.md").read_text()
    assert f"Reused: {verdicts} of the {verdicts} verdicts" in card
    assert f"and {probes} calibration probes were judged before" in card
    assert "reused from the verdict cache: no call was made for them" in card
    # The first run: every verdict a call; a probe prompt asked twice in one shard (two
    # items with the same question and reference) was one call, then reused.
    calls = one["tokens"]["total"]["judge"]
    assert calls["calls"] == verdicts
    assert calls["calibration"]["calls"] + one["judge_reused"]["calibration"] == probes
    assert asked == verdicts + calls["calibration"]["calls"]
    assert all(s["reused"] > 0 for s in two["calibration"].values())
    card = store.get("datasets/two/README.md").decode()
    assert f"Reused: {verdicts} of the {verdicts} verdicts" in card
    assert f"and {probes} calibration probes were judged before" in card
    assert "were reused from the verdict cache: no call was made" in card
    within = one["judge_reused"]["calibration"]
    first_card = store.get("datasets/one/README.md").decode()
    if within:  # a probe prompt asked twice within the first run's rounds
        assert f"Reused: 0 of the {verdicts} verdicts and {within} calibration probes" in first_card
    else:
        assert "Reused:" not in first_card
    # The stored records say so, record by record.
    index = json.loads(store.get(f"runs/{second}/shards.json"))
    for shard in index["shards"]:
        out = ShardOutput.model_validate_json(store.get(f"runs/{second}/judge/{shard}.json"))
        assert all(o.verdict.reused for o in out.outcomes if o.verdict is not None)
        cal = CalibrationShard.model_validate_json(store.get(calibration_key(second, shard)))
        assert all(r.reused for r in cal.records)
