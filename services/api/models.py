"""The API's request and response models (XCreate / XPublic / XsPublic(data, count))."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rsieve.schemas import DATASET_PATTERN


class Sampling(BaseModel):
    """A run's own sampling (best-of-n, docs/sampling.md); what is left out is the
    services' setting. Validated as the settings are (several samples need a temperature
    above 0)."""

    model_config = ConfigDict(extra="forbid")

    samples: int | None = Field(None, ge=1, le=64)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**31)
    keep: Literal["first", "distinct"] | None = None
    max_kept: int | None = Field(None, ge=1)
    judge_samples: int | None = Field(None, ge=1)
    # Also judge the refused samples of items that passed (one call per distinct answer).
    judge_pair_rejections: bool | None = None
    pass_rate_window: list[float] | None = Field(None, min_length=2, max_length=2)
    # Adaptive best-of-n (docs/sampling.md): an item stops once `enough` samples passed
    # (0: every sample drawn); samples go out `sample_round` per item at a time.
    enough: int | None = Field(None, ge=0, le=64)
    sample_round: int | None = Field(None, ge=0, le=64)
    circular: bool | None = None
    # The blind pass (docs/traces.md): accepted items asked again without their image.
    blind_pass: bool | None = None
    blind_policy: Literal["keep", "nothink", "drop"] | None = None

    def chosen(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class RunCreate(BaseModel):
    """A pool already uploaded to the bucket (`pool_uri`) or a folder under one of the
    configured pool roots (`pool_path`): exactly one of them."""

    dataset: str = Field(pattern=DATASET_PATTERN)
    pool_uri: str | None = Field(None, description="s3://bucket/prefix/ of an uploaded pool")
    pool_path: str | None = Field(None, description="a pool folder under RSIEVE_API_POOL_ROOTS")
    sampling: Sampling | None = None


class RunCreated(BaseModel):
    run: str
    status_url: str


class StageProgress(BaseModel):
    shards_done: int
    shards_total: int | None
    items: int | None = Field(None, description="items that finished the stage (when known)")
    families: dict[str, int] = {}
    rate_items_s: float | None = None
    rate_shards_s: float | None = None
    eta_s: float | None = Field(
        None,
        description="seconds until the stage is done, orphaned shards not yet requeued "
        "counted; null when unknown or when the run cannot finish",
    )
    in_flight: int = Field(0, description="shards a worker holds now (orphaned included)")
    orphaned: int = Field(0, description="held shards whose worker is dead, not yet requeued")


class InFlight(BaseModel):
    shard: str | None
    task: str
    holder: str = Field(description="the worker process (hostname:pid) that holds it")
    age_s: float
    orphaned: bool = Field(description="its holder's heartbeat lapsed; requeued shortly")


class RunPublic(BaseModel):
    run: str
    dataset: str
    pool_uri: str
    submitted_at: float | None = None
    shards: int | None
    lines: int | None
    stages: dict[str, int] = Field(description="shards each stage has stored")
    counted_from: Literal["redis", "s3"] = Field(
        "s3",
        description="where `stages` was counted: the workers' progress records in "
        "Redis, or S3 (the truth) with ?exact=true and whenever Redis "
        "cannot answer for them",
    )
    progress: dict[str, StageProgress] = {}
    in_flight: dict[str, list[InFlight]] = Field(
        {}, description="per stage, the shards workers hold now: holder, age, orphaned"
    )
    orphaned: list[dict[str, Any]] = Field(
        [],
        description="shards whose worker died, each as put back on its queue: task, "
        "stage, shard, holder, held_s, requeued_at, requeued (false: it was already back)",
    )
    failed: list[dict[str, str]] = Field([], description="failed shards: shard, reason")
    cannot_finish: str | None = Field(
        None, description="why the run cannot finish without an operator (null: it can)"
    )
    done: bool
    manifest: dict[str, Any] | None


class RunSummary(BaseModel):
    run: str
    dataset: str
    pool_uri: str
    submitted_at: float | None = None


class RunsPublic(BaseModel):
    data: list[RunSummary]
    count: int


class QuarantinedPublic(BaseModel):
    id: str | None
    line: int
    family: str | None
    stage: str
    reason: str
    detail: str = ""


class QuarantinePublic(BaseModel):
    data: list[QuarantinedPublic]
    count: int
    reasons: dict[str, int]


class DatasetPublic(BaseModel):
    dataset: str
    run: str = Field(description="the run committed last")
    runs: list[str] = Field(description="every run committed to the dataset")
    adds_up: bool | None = None
    splits: dict[str, int]
    files: list[str]


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int


class ReviewItem(BaseModel):
    id: str
    line: int
    family: str
    kind: Literal["promoted", "rejected"]
    reason: str | None
    image_sha256: str
    question: str
    reference: list[str]
    answer: str | None
    reasoning: str | None
    raw_output: str
    decision: dict[str, Any] | None
    verdict: dict[str, Any] | None
    review: dict[str, Any] | None = None


class ReviewItemsPublic(BaseModel):
    data: list[ReviewItem]
    count: int
    families: dict[str, int]
    reasons: dict[str, int]


class ReviewCreate(BaseModel):
    verdict: Literal["confirmed", "wrong"] = Field(
        description="a person's call on a judge promotion"
    )
    reviewer: str | None = Field(None, max_length=128)
    note: str | None = Field(None, max_length=2000)


class ReviewPublic(ReviewCreate):
    run: str
    item_id: str
    at: float
