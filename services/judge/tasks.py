"""Judge: a text-only second look, by the model named in settings, at every answer the
verifier rejected (only CORRECT promotes), and the calibration probes of the shard's
verifier-accepted answers through the same model. Each prompt is judged once: the verdict
cache answers what was judged before (ask.py). Calibration is stored first: the judge
output marks the shard done. The last shard judged triggers compaction."""

from __future__ import annotations

import json
from collections import Counter

from rsieve import keys, redis_keys
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
from rsieve.judge.judgecache import judge_identity
from rsieve.judge.probes import calibration_probes, calibration_rates, probe_prompt
from rsieve.judge.sequential import (
    decided_here,
    family_stops,
    next_round,
    order_probes,
    whole_families,
)
from rsieve.schemas import ShardOutput
from services.common import Context
from services.judge.ask import Pacing, ask_once, judge_specials
from services.progress import observe_pace


def register(ctx: Context) -> None:
    preload_chat_template(ctx.settings.judge_tokenizer)

    @ctx.task("rsieve.judge")
    def judge(run: str, shard: str, lines: int) -> None:
        index = json.loads(ctx.store.get(keys.shards(run)))
        if not ctx.done(run, "judge", shard):
            s, model = ctx.run_settings(run), ctx.settings.judge_model
            verified = ctx.load(run, "verify", shard).verified
            # Best-of-n: only items none of whose samples passed, the first few samples;
            # with judge_pair_rejections, also each distinct refused answer of passed items.
            pending = to_judge(verified, s.judge_samples, s.judge_pair_rejections)
            pairs = refused_of_passed(verified) if s.judge_pair_rejections else {}
            # Each family's eligible rate from its items when the pool was planned: about
            # 1.5 x size items probed per family run-wide, whatever the number of shards.
            families = {o.generation.item.family for o in verified}
            rates = calibration_rates(
                {f: n for f, n in (index.get("families") or {}).items() if f in families},
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
            # Exactly what the judge receives (its tokenizer's special tokens neutralised,
            # as its client does), known before the call: the verdict cache's key.
            specials = judge_specials(ctx.settings.judge_tokenizer)
            who, client = judge_identity(ctx.settings), ctx.judge_model(model)
            # Each batch's verdicts stored as it returns (a redelivery asks only the rest),
            # the judge's pace observed for the shards' time limits (services/progress.py).
            pacing = Pacing(
                batch=ctx.settings.progress_batch_items,
                paced=lambda seconds, items: observe_pace(ctx, "judge", seconds, items),
            )
            in_shard = Counter(
                f for f, _ in {(o.generation.item.family, o.generation.item.id) for o in verified}
            )
            planned = index.get("families") or {}
            bound = s.judge_false_promotion_bound
            complete = decided_here(in_shard, planned, bound)
            # Calibration first, sequentially: each round asks every undecided family the
            # verdicts it still needs, in one batch; a family stops once decided.
            records: dict[int, CalibrationRecord] = {}
            states: dict[int, str] = {}
            while batch := next_round(
                probes, states, bound, complete=complete, stop=s.judge_calibration_stop
            ):
                probe_replies = ask_once(
                    ctx.store,
                    client,
                    who,
                    [neutralise(probe_prompt(probes[i]), specials) for i in batch],
                    **pacing,
                )
                for i, reply in zip(batch, probe_replies, strict=True):
                    records[i] = calibration_record(probes[i], model=model, **reply)
                    states[i] = record_state(records[i])[0]
            stops = family_stops(probes, states, bound, complete=complete)
            # A family whose complete calibration already shows false promotions beyond
            # the bound is not judged (judge_skipped), never paid for.
            skipped = hopeless_families(
                records.values(),
                whole_families(in_shard, planned),
                size=s.judge_calibration_size,
                bound=bound,
            )
            asked = [i for i in pending if verified[i].generation.item.family not in skipped]
            replies = ask_once(
                ctx.store,
                client,
                who,
                [neutralise(judge_prompt(verified[i]), specials) for i in asked],
                **pacing,
            )
            ctx.put_sealed(
                keys.calibration(run, shard),
                CalibrationShard(
                    run=run,
                    shard=shard,
                    size=s.judge_calibration_size,
                    rate=s.judge_calibration_rate,
                    records=[records[i] for i in sorted(records)],
                    rates=rates,
                    skipped=skipped,
                    stops=stops,
                ),
            )
            outcomes = list(verified)
            for i in pending:
                if i not in asked:
                    outcomes[i] = skip_judge(verified[i])
            for k, i in enumerate(asked):
                outcomes[i] = apply_verdict(verified[i], model=model, **replies[k])
            # A refused answer's other samples take its verdict, the same prompt's reply
            # reused: the judge is asked once per distinct answer, and no call is counted.
            reply_of = dict(zip(asked, replies, strict=True))
            for i, lead in pairs.items():
                if i == lead:
                    continue
                outcomes[i] = (
                    apply_verdict(verified[i], model=model, **(reply_of[lead] | {"reused": True}))
                    if lead in reply_of
                    else skip_judge(verified[i])
                )
            # One per item; a pass-rate window (when set) quarantines what lies outside.
            outcomes, outside = in_window(
                settle_all(outcomes, s.keep, s.max_kept, s.circular), s.pass_rate_window
            )
            ctx.save(
                ShardOutput(
                    run=run,
                    shard=shard,
                    stage="judge",
                    lines=lines,
                    outcomes=outcomes,
                    quarantined=outside,
                )
            )
        # Every shard that finishes counts itself; whichever sees all of them enqueues the
        # compaction (more than one may: compaction is idempotent). A Redis set, not a
        # listing of the judged shards, which would make a run's judging quadratic.
        if ctx.last_done(redis_keys.judged(run), shard, len(index["shards"])):
            ctx.next("rsieve.compact", run=run)
