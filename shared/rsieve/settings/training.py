"""How a run decides what becomes a training target: the training rules beyond the
benchmark's pass mark (docs/verifiers.md) and the trace gate (docs/traces.md). Like the
sampling, every stage reads these from the run's spec, not from its own environment
(Context.run_settings), so a worker started with other settings still decides the run as
its id says."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from rsieve.schemas import TRACE_CHECKS, TraceCheck
from rsieve.settings.roles import DECIDES
from rsieve.verify import DEFAULT_TRAINING_RULES, TrainingPolicy, check_training_rules


class TrainingSettings(BaseModel):
    # Training acceptance (docs/verifiers.md): the rule an answer the benchmark passes must
    # also meet to become a training target, per protocol (one not named: `benchmark`, the
    # pass as is) and per family (overriding its protocol's). What it refuses is a
    # `near_miss` rejection, which the judge may promote like any other.
    training_rules: Annotated[dict[str, str], DECIDES] = Field(
        default_factory=lambda: dict(DEFAULT_TRAINING_RULES)
    )
    family_training_rules: Annotated[dict[str, str], DECIDES] = {}
    # The trace gate (rsieve.compact.traces, docs/traces.md): the checks run on every
    # accepted answer's reasoning before it may enter `_RS_think` (an empty list turns the
    # gate off), and their constants.
    trace_checks: Annotated[list[TraceCheck], DECIDES] = Field(
        default_factory=lambda: list(TRACE_CHECKS)
    )
    # `repetition`: spans of this many tokens; failed when the most repeated one covers
    # this share of the trace.
    trace_repetition_span: Annotated[int, DECIDES] = Field(8, ge=2, le=32)
    trace_repetition_max_share: Annotated[float, DECIDES] = Field(0.3, gt=0, le=1)
    # `language_mixing`: a run of this many characters of another script fails the trace.
    trace_mixing_min_chars: Annotated[int, DECIDES] = Field(2, ge=1)
    # `length`: outside the family's median +- this many scaled MADs, the half-width never
    # under the floor; only in a family with at least trace_length_min_traces traces.
    trace_length_mads: Annotated[float, DECIDES] = Field(6.0, gt=0)
    trace_length_floor_chars: Annotated[int, DECIDES] = Field(400, ge=0)
    trace_length_min_traces: Annotated[int, DECIDES] = Field(20, ge=2)

    @model_validator(mode="after")
    def _training_rules_exist(self) -> TrainingSettings:
        check_training_rules(self.training_rules, self.family_training_rules)
        return self

    def training_policy(self) -> TrainingPolicy:
        return TrainingPolicy(self.training_rules, self.family_training_rules)


# Its fields, in the order they are declared.
TRAINING = tuple(TrainingSettings.model_fields)
