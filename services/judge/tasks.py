"""Judge: a text-only second look, by the model named in settings, at every answer the
verifier rejected (only CORRECT promotes), and the calibration probes of the shard's
verifier-accepted answers through the same model. Each prompt is judged once: the verdict
cache answers what was judged before (ask.py). Calibration is stored first: the judge
output marks the shard done. The last shard judged triggers compaction."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rsieve import keys, redis_keys
from rsieve.adapters.model import Model
from rsieve.adapters.tokenizer import preload_chat_template
from rsieve.compact.settle import in_window, refused_of_passed, settle_all, to_judge
from rsieve.generate.chat import neutralise
from rsieve.judge.calibration import (
    CalibrationRecord,
    CalibrationShard,
    calibration_record,
    hopeless_families,
    record_state,
)
from rsieve.judge.cascade import apply_verdict, judge_prompt, skip_judge
from rsieve.judge.judgecache import JudgeIdentity, judge_identity
from rsieve.judge.probes import calibration_probes, calibration_rates, probe_prompt
from rsieve.judge.sequential import (
    decided_here,
    family_stops,
    next_round,
    order_probes,
    whole_families,
)
from rsieve.schemas import Outcome, ShardOutput
from rsieve.settings import Settings
from services.context import Context
from services.judge.ask import Pacing, ask_once, judge_specials
from services.progress import observe_pace


def register(ctx: Context) -> None:
    preload_chat_template(ctx.settings.judge_tokenizer)

    @ctx.task("rsieve.judge")
    def judge(run: str, shard: str, lines: int) -> None:
        index = json.loads(ctx.store.get(keys.shards(run)))
        if not ctx.done(run, "judge", shard):
            ctx.save(judge_shard(ctx, run, shard, lines, index))
        # Every shard that finishes counts itself; whichever sees all of them enqueues the
        # compaction (more than one may: compaction is idempotent). A Redis set, not a
        # listing of the judged shards, which would make a run's judging quadratic.
        if ctx.last_done(redis_keys.judged(run), shard, len(index["shards"])):
            ctx.next("rsieve.compact", run=run)


@dataclass
class JudgeCalls:
    """How this shard asks the judge: exactly what it receives (its tokenizer's special
    tokens neutralised, as its client does), known before the call, is the verdict cache's
    key; each batch's verdicts stored as it returns (a redelivery asks only the rest), the
    judge's pace observed for the shards' time limits (services/progress.py)."""

    ctx: Context
    client: Model
    who: JudgeIdentity
    specials: tuple[str, ...]
    pacing: Pacing

    @classmethod
    def of(cls, ctx: Context) -> JudgeCalls:
        s = ctx.settings
        specials = judge_specials(s.judge_tokenizer)
        who, client = judge_identity(s), ctx.judge_model(s.judge_model)
        pacing = Pacing(
            batch=s.progress_batch_items,
            paced=lambda seconds, items: observe_pace(ctx, "judge", seconds, items),
        )
        return cls(ctx, client, who, specials, pacing)

    def ask(self, prompts: list[str]) -> list[dict[str, Any]]:
        """Each prompt's reply fields (services/judge/ask.py, `ask_once`)."""
        sent = [neutralise(p, self.specials) for p in prompts]
        return ask_once(self.ctx.store, self.client, self.who, sent, **self.pacing)


def judge_shard(
    ctx: Context, run: str, shard: str, lines: int, index: dict[str, Any]
) -> ShardOutput:
    """One shard judged: its calibration probes first (`calibrate`, stored before the
    output, which marks the shard done), then the rejected answers of the families its
    calibration leaves worth judging; the outcomes settled one per item."""
    s, model = ctx.run_settings(run), ctx.settings.judge_model
    verified = ctx.load(run, "verify", shard).verified
    # Best-of-n: only items none of whose samples passed, the first few samples;
    # with judge_pair_rejections, also each distinct refused answer of passed items.
    pending = to_judge(verified, s.judge_samples, s.judge_pair_rejections)
    pairs = refused_of_passed(verified) if s.judge_pair_rejections else {}
    calls = JudgeCalls.of(ctx)
    calibration = calibrate(s, calls, run, shard, verified, index.get("families") or {})
    skipped = calibration.skipped
    asked = [i for i in pending if verified[i].generation.item.family not in skipped]
    replies = calls.ask([judge_prompt(verified[i]) for i in asked])
    ctx.put_sealed(keys.calibration(run, shard), calibration)
    outcomes = judged_outcomes(
        verified, pending, dict(zip(asked, replies, strict=True)), pairs, model
    )
    # One per item; a pass-rate window (when set) quarantines what lies outside.
    outcomes, outside = in_window(
        settle_all(outcomes, s.keep, s.max_kept, s.circular), s.pass_rate_window
    )
    return ShardOutput(
        run=run, shard=shard, stage="judge", lines=lines, outcomes=outcomes, quarantined=outside
    )


def calibrate(
    s: Settings,
    calls: JudgeCalls,
    run: str,
    shard: str,
    verified: list[Outcome],
    planned: dict[str, int],
) -> CalibrationShard:
    """The shard's calibration, sequentially: each round asks every undecided family the
    verdicts it still needs, in one batch; a family stops once decided. `planned`: each
    family's items when the pool was planned (its eligible rate is from them: about
    1.5 x size items probed per family run-wide, whatever the number of shards)."""
    families = {o.generation.item.family for o in verified}
    rates = calibration_rates(
        {f: n for f, n in planned.items() if f in families},
        size=s.judge_calibration_size,
        rate=s.judge_calibration_rate,
    )
    probes = order_probes(
        calibration_probes(
            verified,
            size=s.judge_calibration_size,
            rate=s.judge_calibration_rate,
            rates=rates,
            policy=s.training_policy(),
        )
    )
    in_shard = Counter(
        f for f, _ in {(o.generation.item.family, o.generation.item.id) for o in verified}
    )
    bound, model = s.judge_false_promotion_bound, calls.ctx.settings.judge_model
    complete = decided_here(in_shard, planned, bound)
    records: dict[int, CalibrationRecord] = {}
    states: dict[int, str] = {}
    while batch := next_round(
        probes, states, bound, complete=complete, stop=s.judge_calibration_stop
    ):
        probe_replies = calls.ask([probe_prompt(probes[i]) for i in batch])
        for i, reply in zip(batch, probe_replies, strict=True):
            records[i] = calibration_record(probes[i], model=model, **reply)
            states[i] = record_state(records[i])[0]
    # A family whose complete calibration already shows false promotions beyond the
    # bound is not judged (judge_skipped), never paid for.
    skipped = hopeless_families(
        records.values(),
        whole_families(in_shard, planned),
        size=s.judge_calibration_size,
        bound=bound,
    )
    return CalibrationShard(
        run=run,
        shard=shard,
        size=s.judge_calibration_size,
        rate=s.judge_calibration_rate,
        records=[records[i] for i in sorted(records)],
        rates=rates,
        skipped=skipped,
        stops=family_stops(probes, states, bound, complete=complete),
    )


def judged_outcomes(
    verified: list[Outcome],
    pending: list[int],
    reply_of: dict[int, dict[str, Any]],
    pairs: dict[int, int],
    model: str,
) -> list[Outcome]:
    """The verifier's outcomes with the judge's verdicts applied: each pending one asked
    (`reply_of`, by position) takes its reply, one not asked is skipped (judge_skipped)."""
    outcomes = list(verified)
    for i in pending:
        if i not in reply_of:
            outcomes[i] = skip_judge(verified[i])
    for i, reply in reply_of.items():
        outcomes[i] = apply_verdict(verified[i], model=model, **reply)
    # A refused answer's other samples take its verdict, the same prompt's reply
    # reused: the judge is asked once per distinct answer, and no call is counted.
    for i, lead in pairs.items():
        if i == lead:
            continue
        outcomes[i] = (
            apply_verdict(verified[i], model=model, **(reply_of[lead] | {"reused": True}))
            if lead in reply_of
            else skip_judge(verified[i])
        )
    return outcomes
