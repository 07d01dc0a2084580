"""What a submission may choose for its own run (POST /runs `sampling`, `rsieve run
--samples`): the generator's sampling and what best-of-n keeps (docs/sampling.md). The
run's spec records them and every stage reads them from there
(services.runs.run_settings)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from rsieve.schemas import BlindPolicy
from rsieve.settings.roles import DECIDES, SINCE_FIRST_ID


class SamplingSettings(BaseModel):
    temperature: Annotated[float, DECIDES] = 0.0
    # Nucleus sampling (1.0: off); sent to the vLLM and OpenAI-compatible interfaces.
    top_p: Annotated[float, DECIDES] = Field(1.0, gt=0, le=1)
    # Best-of-n (docs/sampling.md): answers asked per question. 1, at temperature 0, is the
    # card's process; more need a temperature above 0. Sample k of an item is asked with
    # seed sample_seed(seed, item id, k), so a rerun asks exactly the same.
    samples: Annotated[int, DECIDES] = Field(1, ge=1, le=64)
    seed: Annotated[int, DECIDES] = Field(0, ge=0, lt=2**31)
    # Adaptive best-of-n (rsieve.generate.adaptive): an item stops once `enough` of its
    # samples passed (None: 1 with keep first and no pass-rate window, else 0; 0: off), or
    # once the Wilson interval of its pass rate lies wholly inside or outside the
    # pass-rate window. Samples go out `sample_round` per item at a time (0: max(enough,
    # samples / 4)), so an easy item stops after its first round.
    enough: Annotated[int | None, SINCE_FIRST_ID] = Field(None, ge=0, le=64)
    sample_round: Annotated[int, SINCE_FIRST_ID] = Field(0, ge=0, le=64)
    # Accepted answers kept per item: `first` keeps the first; `distinct` every one whose
    # answer the protocol does not match to a kept one's and whose reasoning differs.
    keep: Annotated[Literal["first", "distinct"], SINCE_FIRST_ID] = "first"
    max_kept: Annotated[int, DECIDES] = Field(1, ge=1)
    # When no sample of an item passed the verifier: judge calls for it, at most (its
    # first rejected samples).
    judge_samples: Annotated[int, DECIDES] = Field(1, ge=1)
    # When some sample of an item passed: also judge its refused samples, one call per
    # distinct refused answer (its form under the item's protocol), so a preference pair
    # never teaches against a right answer the verifier did not recognise.
    judge_pair_rejections: Annotated[bool, SINCE_FIRST_ID] = False
    # Keep only accepted items whose pass rate lies in [low, high] (e.g. [0.2, 0.8], as
    # InternVL3.5 does); the others are quarantined `pass_rate_window`. Empty: off.
    pass_rate_window: Annotated[list[float], SINCE_FIRST_ID] = []
    # Multiple choice (items with options): sample k sees the options rotated by k
    # (VLMEvalKit's CircularEval); the item is accepted only when every sample is.
    circular: Annotated[bool, SINCE_FIRST_ID] = False
    # The blind pass (docs/traces.md): every item the verifier accepted is asked again
    # without its image; one the model still answers right is `answerable_without_image`.
    # blind_policy: what such an item does: `keep` (flagged only), `nothink` (kept out of
    # `_RS_think`) or `drop` (rejected, reason answerable_without_image).
    blind_pass: Annotated[bool, SINCE_FIRST_ID] = False
    blind_policy: Annotated[BlindPolicy, SINCE_FIRST_ID] = "keep"

    @model_validator(mode="after")
    def _pass_rate_window_is_a_range(self) -> SamplingSettings:
        w = self.pass_rate_window
        if w and not (len(w) == 2 and 0 <= w[0] <= w[1] <= 1):
            raise ValueError(f"pass_rate_window {w} is not [low, high] with 0 <= low <= high <= 1")
        if w and self.samples == 1:
            raise ValueError("a pass-rate window needs several samples (samples > 1)")
        return self

    @model_validator(mode="after")
    def _enough_is_a_stopping_rule(self) -> SamplingSettings:
        if self.enough and self.samples == 1:
            raise ValueError("enough stops an item's sampling early: it needs samples > 1")
        if self.enough and self.enough > self.samples:
            raise ValueError(f"enough={self.enough} is more than samples={self.samples}")
        if self.enough and self.circular:
            raise ValueError(
                "circular sampling accepts an item only when every rotation passes: every "
                "sample is drawn, so enough does not apply"
            )
        if self.enough and self.pass_rate_window:
            raise ValueError(
                "enough stops an item before its pass rate is known; with a pass-rate "
                "window the item's pass-rate interval decides when it stops"
            )
        return self

    @model_validator(mode="after")
    def _samples_need_a_temperature(self) -> SamplingSettings:
        if self.samples > 1 and self.temperature <= 0 and not self.circular:
            raise ValueError(
                f"samples={self.samples} at temperature 0 asks the same greedy answer "
                f"{self.samples} times: set RSIEVE_TEMPERATURE above 0 (e.g. 0.7), or "
                "rotate the options (circular)"
            )
        if self.circular and self.samples < 2:
            raise ValueError("circular sampling needs several samples (one per rotation)")
        return self

    @model_validator(mode="after")
    def _pair_rejections_need_passed_items(self) -> SamplingSettings:
        if self.judge_pair_rejections and self.samples == 1:
            raise ValueError(
                "judge_pair_rejections judges the refused samples of items another sample "
                "of which passed: it needs several samples (samples > 1)"
            )
        if self.judge_pair_rejections and self.circular:
            raise ValueError(
                "circular sampling accepts an item only when every rotation passes, so an "
                "accepted item has no refused sample: judge_pair_rejections does not apply"
            )
        return self

    @model_validator(mode="after")
    def _blind_policy_needs_the_blind_pass(self) -> SamplingSettings:
        if self.blind_policy != "keep" and not self.blind_pass:
            raise ValueError(
                f"blind_policy={self.blind_policy} does nothing without the blind pass: "
                "set RSIEVE_BLIND_PASS=true (rsieve run|submit --blind-pass)"
            )
        return self


# Its fields, in the order they are declared.
SAMPLING = tuple(SamplingSettings.model_fields)
