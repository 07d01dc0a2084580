"""Judge: a text-only second look, by the model named in settings, at every answer the
verifier rejected (only CORRECT promotes), and the calibration probes of the shard's
verifier-accepted answers through the same model. Calibration is stored first: the judge
output marks the shard done. The last shard judged triggers compaction."""

from __future__ import annotations

import json
from typing import Any

from rsieve.adapters.model import ModelRequest
from rsieve.adapters.tokenizer import preload_chat_template
from rsieve.calibration import (
    CalibrationShard,
    calibration_key,
    calibration_probes,
    calibration_record,
    probe_prompt,
)
from rsieve.cascade import apply_verdict, judge_prompt
from rsieve.sampling import in_window, settle_all, to_judge
from rsieve.schemas import ShardOutput
from services.common import Context


def register(ctx: Context) -> None:
    preload_chat_template(ctx.settings.judge_tokenizer)

    @ctx.task("rsieve.judge")
    def judge(run: str, shard: str, lines: int) -> None:
        if not ctx.done(run, "judge", shard):
            s, model = ctx.run_settings(run), ctx.settings.judge_model
            verified = ctx.load(run, "verify", shard).verified
            # Best-of-n: only items none of whose samples passed, the first few samples.
            pending = to_judge(verified, s.judge_samples)
            probes = calibration_probes(
                verified, size=s.judge_calibration_size, rate=s.judge_calibration_rate
            )
            prompts = [judge_prompt(verified[i]) for i in pending]
            prompts += [probe_prompt(p) for p in probes]
            judge = ctx.judge_model(model)
            replies = judge.generate_many([ModelRequest(p) for p in prompts])
            kind = judge.info.kind if judge.info else None
            # What the judge received: special tokens of its tokenizer neutralised.
            prompts = [
                r.user_text if not isinstance(r, Exception) and r.user_text is not None else p
                for p, r in zip(prompts, replies, strict=True)
            ]

            def reply(k: int) -> dict[str, Any]:
                r = replies[k]  # raw output, finish reason, failure, token counts
                if isinstance(r, Exception):
                    return {"raw_output": None, "finish_reason": "stop", "failure": str(r)}
                return {
                    "raw_output": r.text,
                    "finish_reason": r.finish_reason,
                    "input_tokens": r.input_tokens,
                    "output_tokens": r.output_tokens,
                }

            records = [
                calibration_record(
                    probe, model=model, prompt=prompts[k], model_kind=kind, **reply(k)
                )
                for k, probe in enumerate(probes, start=len(pending))
            ]
            ctx.store.put(
                calibration_key(run, shard),
                CalibrationShard(
                    run=run,
                    shard=shard,
                    size=s.judge_calibration_size,
                    rate=s.judge_calibration_rate,
                    records=records,
                )
                .model_dump_json()
                .encode(),
                content_type="application/json",
            )
            outcomes = list(verified)
            for k, i in enumerate(pending):
                outcomes[i] = apply_verdict(
                    verified[i], model=model, prompt=prompts[k], model_kind=kind, **reply(k)
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
        shards = json.loads(ctx.store.get(f"runs/{run}/shards.json"))["shards"]
        if ctx.last_done(f"rsieve:judged:{run}", shard, len(shards)):
            ctx.next("rsieve.compact", run=run)
