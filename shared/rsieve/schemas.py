"""Pydantic models at every boundary: pool lines, stage records, messages, reports.

Stage records nest: an `Item` (cleaned) is carried inside its `Generation`, which is
carried inside its `Outcome`, so the compactor needs only the last stage's output to
assemble rows, and every decision can be recomputed from what is stored.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rsieve.envelope import unseal
from rsieve.hashindex import REFERENCE_CROPS

__all__ = [
    "MODEL_KINDS",
    "QUARANTINE_REASONS",
    "REJECT_REASONS",
    "STAGE_TASKS",
    "TASK_QUEUES",
    "THINKING_MODES",
    "TRACE_CHECKS",
    "BlindPass",
    "BlindPolicy",
    "Decision",
    "Generation",
    "ImageRef",
    "Item",
    "Outcome",
    "PoolItem",
    "Quarantined",
    "RunRequest",
    "RunSpec",
    "Samples",
    "ShardOutput",
    "ShardQuarantine",
    "ShardTask",
    "TraceCheck",
    "TraceReport",
    "TrainingDecision",
    "Verdict",
]

# Why an item reached no split. Every reason has a counter in the run report.
QUARANTINE_REASONS: dict[str, str] = {
    "invalid_utf8": "the pool line is not valid UTF-8",
    "invalid_json": "the pool line is not a JSON object",
    "invalid_item": "a required field is missing or has the wrong type",
    "multi_image": "the row holds more than one image; rsieve answers one image per question",
    "no_image": "the row names no image",
    "unsupported_turn": "the conversation row has no question answered on its one image "
    "(a question holding another medium or several images, or no user turn answered by "
    "an assistant turn)",
    "empty_question": "the question is empty or whitespace",
    "empty_answer_reference": "the reference answer is empty",
    "text_too_long": "question or reference longer than the text limit",
    "duplicate_id": "an earlier line of the pool has the same id",
    "unknown_protocol": "the family has no verification protocol and the item names none",
    "image_outside_pool": "the image path leaves the pool folder",
    "missing_image": "the image file named by the item does not exist",
    "image_digest_mismatch": "the image bytes in the pool's packs differ from the sha256 "
    "its pack index records (a corrupt upload)",
    "unreadable_image": "the image bytes do not decode as an image",
    "image_too_large": "the image exceeds the pixel or byte limit",
    "provenance": "the recorded source does not resolve to the attached image",
    "image_symlink": "the image is a symbolic link that leaves the pool folder (not uploaded)",
    "duplicate_item": (
        "an earlier line, or a run already in the dataset, has the same question on the "
        "same image (sha256) or a near-duplicate of it (perceptual hash)"
    ),
    "contaminated": "the image matches an image of a registered evaluation set (rsieve evalset)",
    "off_task": "the family measured off-task above the policy threshold and this item is "
    "not its benchmark task (cleaning.json has the measurement)",
    "model_error": "the model call failed after retries (infrastructure, never a verdict)",
    "pass_rate_window": "best-of-n with a pass-rate window: the item was accepted, but the "
    "share of its samples accepted lies outside the window (too easy or too hard to teach)",
    "max_deliveries": "the item was in flight each time its worker died, beyond the limit",
    "stage_error": (
        "a stage raised on the item itself, again after its retries"
        " (detail: the stage, the exception, the rsieve version)"
    ),
}

# What a model behind Triton is, declared by its config parameter `rsieve_kind`
# (deploy/triton/README.md). The card names every model by its kind, so a prompt-blind OCR
# engine or a stand-in judge is never presented as a VLM or a language model.
MODEL_KINDS: dict[str, str] = {
    "vlm": "a vision-language model",
    "llm": "a text-only language model",
    "ocr-engine": "an OCR engine: it ignores the prompt, and its 'reasoning' is a "
    "recognition trace",
    "stand-in": "a stand-in that is not a model (named for what it does)",
}

ModelKind = Literal["vlm", "llm", "ocr-engine", "stand-in"]

# What a checkpoint's chat template does for reasoning (rsieve.generate.chat, docs/models.md):
# "switch": it has a thinking switch (`enable_thinking`); "opens": it opens `<think>` for
# the assistant itself; "none": it has no thinking mode; "server": the model server
# rendered the prompt (the rsieve interface), so the client cannot tell.
THINKING_MODES = ("switch", "opens", "none", "server")

# Why an item is in the rejected split.
REJECT_REASONS: dict[str, str] = {
    "wrong_answer": "the verifier rejected the answer and the judge said WRONG",
    "judge_unsure": "the verifier rejected the answer and the judge said UNSURE",
    "judge_failed": "the verifier rejected the answer and the judge gave no verdict: the call "
    "failed, or its output was empty, unparsable or cut off at its token "
    "budget (the cause is recorded with the verdict)",
    "truncated_reasoning": "the output was cut off inside the reasoning: no answer",
    "empty_answer": "the model gave an empty answer after its reasoning",
    "repetition_loop": "the output fell into a repetition loop (one stretch of text "
    "repeated word for word): it was cancelled while streaming, before its budget was spent",
    "truncated_answer": "the output hit the token budget right after the reasoning",
    "refusal": "the model refused to answer (a refusal is never scored or judged)",
    "circular_inconsistent": "circular sampling: some rotations of the options were "
    "answered right and some not (a lucky guess is not training data)",
    "judge_untrusted": "the judge said CORRECT, but its measured false-promotion rate for "
    "the family exceeds the bound, so its promotions are held back",
    "judge_guarded": "the judge said CORRECT, but the candidate speaks to its grader (a "
    "verdict word, grading, the reference, an order, a role tag or a control token) or "
    "holds none of the references' word, number or option where those can be looked for, "
    "which a judge is never trusted on",
    "answerable_without_image": "the blind pass (blind_policy drop): asked again without "
    "its image, the model still gave an answer the item's protocol accepts, so the "
    "question does not need the image",
    "judge_skipped": "the verifier rejected the answer and the judge was not asked: its "
    "calibration on this family already showed it cannot clear the false-promotion bound",
    "near_miss": "the benchmark's scorer passes the answer but training acceptance refuses "
    "it (it equals no reference under the protocol's training rule: a name one letter off, "
    "a number 3% off), and the judge did not promote it; what the judge said, if it was "
    "asked, is its recorded verdict",
}

Stage = Literal["ingest", "clean", "generate", "verify", "judge", "compact"]
# The stages that store one output per shard, in pipeline order.
STAGES: tuple[str, ...] = ("clean", "generate", "verify", "judge")
# The task that does each of them for one shard: what a plan sends, what a guard counts.
STAGE_TASKS: dict[str, str] = {stage: f"rsieve.{stage}" for stage in STAGES}
# Every queued task and the queue it runs on, which is also the stage whose progress it is
# part of (rsieve.adapters.queues routes by it; status counts by it).
TASK_QUEUES: dict[str, str] = {
    "rsieve.ingest": "clean",
    "rsieve.ingest_part": "clean",
    "rsieve.clean": "clean",
    "rsieve.generate": "generate",
    "rsieve.verify": "verify",
    "rsieve.judge": "judge",
    "rsieve.compact": "compact",
    "rsieve.compact_route": "compact",
    "rsieve.compact_partition": "compact",
}
# A dataset's name: a path segment of datasets/<name>/ and of every run id.
DATASET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"


class ImageRef(BaseModel):
    """Where one image's bytes lie: `pack` is the object key, bytes [offset, offset+length)
    (rsieve.run.packs writes the packs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pack: str
    offset: int
    length: int
    sha256: str
    # The image's perceptual hash (rsieve.hashindex, 16 hex), for near-duplicates and
    # evaluation sets (rsieve.clean.decontam); None when the bytes are no image rsieve reads.
    phash: str | None = None
    # The hashes of its light crops (rsieve.hashindex.REFERENCE_CROPS, those informative and
    # unlike `phash`): a copy cut from it, or an image it was cut from, is a near-duplicate
    # (rsieve.clean.decontam). Empty in a pack index written before them: the image alone.
    crop_phashes: tuple[str, ...] = Field((), max_length=len(REFERENCE_CROPS))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolItem(BaseModel):
    """One line of a pool's items.jsonl, as the design's pool contract states it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = Field(min_length=1, max_length=512)
    family: str = Field(min_length=1, max_length=128)
    image: str = Field(min_length=1, max_length=1024)
    question: str
    answer: str | list[str]
    source: dict[str, Any] | str | None = None
    options: dict[str, str] | None = None
    protocol: str | None = None


class Item(_Model):
    """A cleaned item, ready for the model. `question` is exactly the prompt sent."""

    id: str
    line: int
    family: str
    protocol: str
    question: str
    pool_question: str
    references: list[str]
    options: dict[str, str] | None = None
    image_sha256: str
    clean_meta: dict[str, Any]
    # Where the image's bytes lie (the pool's packs, rsieve.run.packs); None: images/<sha256>.
    image_at: ImageRef | None = None


class Quarantined(_Model):
    """An item that reached no split, with where and why."""

    id: str | None
    line: int
    family: str | None
    stage: Stage
    reason: str
    detail: str = ""


BlindPolicy = Literal["keep", "nothink", "drop"]


class BlindPass(_Model):
    """An accepted item asked again without its image (rsieve.judge.blind): its question
    byte for byte, the same model and sampling; under circular sampling once per rotation
    the run asked. `answerable`: every blind answer passed the item's protocol and
    training rule (None: a blind request failed, `error` says how); `policy`: what the run
    does with an answerable item (settings.blind_policy)."""

    answerable: bool | None
    answers: list[str | None]
    raw_outputs: list[str]
    policy: BlindPolicy
    error: str | None = None
    # Each answered blind request's token counts, as the server returned them (None: not
    # returned): the run report counts them with the generator's calls.
    input_tokens: list[int | None] = []
    output_tokens: list[int | None] = []


class Generation(_Model):
    item: Item
    model: str
    raw_output: str
    finish_reason: str
    reasoning: str | None
    answer: str | None
    # Set when the output holds no scorable answer (truncated_reasoning, empty_answer).
    failure: str | None = None
    image_sent_sha256: str
    # What answered and how (issue 3): Triton model version and interface, the sampling
    # parameters sent, the chat template when the prompt was rendered client side, the
    # sha256 of the exact prompt string on the wire, token counts when the model returns
    # them, the request latency, and the shape of the image bytes sent.
    model_version: str | None = None
    interface: str | None = None
    # What the model is, as its Triton config declares it (MODEL_KINDS); None: undeclared.
    model_kind: str | None = None
    sampling: dict[str, Any] = {}
    # The checkpoint whose own chat template rendered the prompt client side (its name),
    # the template's sha256, and what the template does for reasoning (THINKING_MODES).
    # None: the model server rendered the prompt itself (the rsieve interface).
    chat_template: str | None = None
    chat_template_sha256: str | None = None
    thinking_mode: str | None = None
    prompt_sent_sha256: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_s: float | None = None
    image_sent: dict[str, Any] | None = None
    # Best-of-n (rsieve.generate.draws): which sample of the item this is and the seed it was
    # asked with; None with one sample per item.
    sample: int | None = None
    seed: int | None = None
    # The blind pass (settings.blind_pass), on every sample of an item one of whose samples
    # the verifier accepted; None when it did not run.
    blind: BlindPass | None = None


class TrainingDecision(_Model):
    """Training acceptance (rsieve.verify.TRAINING_RULES): whether an answer the benchmark
    passes is also a training target, by which rule and constants, at which variant."""

    rule: str
    constants: dict[str, Any]
    accepted: bool
    variant: str | None


class Decision(_Model):
    """The verifier's decision: enough to recompute it. `accepted`, `score`, `variant` and
    `threshold` are the benchmark's own (its scorer, exactly); `training` is the stricter
    acceptance for training data beside it (None: a record from before it existed, or a
    caller that asked for the benchmark's decision alone)."""

    protocol: str
    version: str
    constants: dict[str, Any]
    accepted: bool
    score: float
    variant: str | None
    threshold: float
    training: TrainingDecision | None = None

    @property
    def near_miss(self) -> bool:
        """The benchmark passes the answer; training acceptance refuses it."""
        return self.accepted and self.training is not None and not self.training.accepted


VerdictName = Literal["CORRECT", "WRONG", "UNSURE", "FAILED"]


class Verdict(_Model):
    """The judge's verdict on a verifier-rejected answer, with what produced it."""

    # FAILED: no verdict (the call failed, or the output was empty, unparsable or cut off);
    # `cause` says which (rsieve.judge.verdicts.FAILURE_CAUSES). Only CORRECT promotes.
    verdict: VerdictName
    cause: str | None = None
    model: str
    # What the judge model is, as its Triton config declares it (MODEL_KINDS).
    model_kind: str | None = None
    prompt_sha256: str
    template_sha256: str
    prompt: str
    raw_output: str
    # Token counts when the judge's server returned them (the run report's `tokens`); not
    # in the dataset rows (rsieve.compact.rows.FEATURES).
    input_tokens: int | None = None
    output_tokens: int | None = None
    # The reply came from the verdict cache (rsieve.judge.judgecache): an earlier call on the
    # byte-identical prompt by the same judge, applied as a fresh reply would be; no call
    # was made, so the run's token usage does not count it (its token counts are the
    # original call's). False for records stored before the cache existed.
    reused: bool = False
    # Why the candidate may not be promoted by a judge whatever it says
    # (rsieve.judge.verdicts.guard: it speaks to its grader); None when it may. A guarded
    # CORRECT is `judge_guarded`.
    guard: str | None = None


# The trace gate's checks (rsieve.compact.traces), in the order they run and are reported.
TraceCheck = Literal["repetition", "language_mixing", "inconsistent", "guessing", "length"]
TRACE_CHECKS: tuple[TraceCheck, ...] = get_args(TraceCheck)


class TraceReport(_Model):
    """The trace gate's checks on an accepted answer's reasoning (rsieve.compact.traces):
    {check: passed} for every check run, and why each failed one failed. An answer whose
    trace fails any check is kept out of `_RS_think` (it stays in `_RS_nothink`)."""

    checks: dict[str, bool]
    reasons: list[str]
    version: str

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


class Outcome(_Model):
    """Where an item that got an answer ends: accepted (think + nothink) or rejected.
    With best-of-n, one sample's outcome, or (settled, rsieve.compact.settle.settle) the item's:
    the sample it is, with `samples` recording every sample."""

    generation: Generation
    decision: Decision | None
    verdict: Verdict | None
    place: Literal["accepted", "rejected"]
    reason: str | None
    promoted_by: Literal["verifier", "judge"] | None
    samples: Samples | None = None
    # Set at compaction (rsieve.compact.traces) on an accepted answer with reasoning;
    # None before, and for rejected answers and answers without reasoning.
    trace: TraceReport | None = None


class Samples(_Model):
    """An item's samples (best-of-n), beside the outcome that settled it."""

    n: int  # samples answered
    passed: list[int]  # indexes of the samples accepted (verifier or judge)
    kept: list[int]  # indexes of the accepted samples kept (the outcome's own first)
    wrong: list[str]  # the rejected samples' answers, distinct, in sample order
    others: list[Outcome]  # every sample's outcome but the settled one's


class ShardOutput(_Model):
    """What one stage wrote for one shard (deterministic key: runs/<run>/<stage>/<shard>)."""

    run: str
    shard: str
    stage: Stage
    lines: int
    items: list[Item] = []
    generations: list[Generation] = []
    verified: list[Outcome] = []
    outcomes: list[Outcome] = []
    quarantined: list[Quarantined] = []

    @model_validator(mode="before")
    @classmethod
    def _unseal(cls, data: Any) -> Any:
        return unseal(data)  # stored sealed (rsieve.envelope): the seal is not a field


class ShardQuarantine(BaseModel):
    """Only the quarantine of a stored ShardOutput: the rest of the JSON is skipped, not
    validated (a reader that needs no items parses a fraction of the work)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    quarantined: list[Quarantined] = []


class ShardTask(_Model):
    """A claim check: the message a stage receives. Never images, never item bodies."""

    run: str
    shard: str
    lines: int


class RunRequest(_Model):
    pool_uri: str = Field(description="s3://bucket/prefix/ of an uploaded pool folder")
    dataset: str = Field(pattern=DATASET_PATTERN)


class RunSpec(_Model):
    run: str
    dataset: str
    pool_uri: str
    pool_sha256: str
    settings: dict[str, Any]
    protocols: dict[str, str]


Outcome.model_rebuild()
