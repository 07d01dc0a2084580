"""The one settings class. Every tunable of rsieve is one field here (env prefix RSIEVE_).

Built lazily by `get_settings()`, never at import, so tests and services construct their
own with explicit values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, get_origin

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rsieve.images import MAX_PIXELS
from rsieve.schemas import DATASET_PATTERN, TRACE_CHECKS, BlindPolicy, ModelKind, TraceCheck
from rsieve.verify import DEFAULT_TRAINING_RULES, TrainingPolicy, check_training_rules

__all__ = [
    "API_TOKEN_MIN_CHARS",
    "DECIDING",
    "OPERATIONAL",
    "SAMPLING",
    "SINCE_FIRST_IDS",
    "TRAINING",
    "Settings",
    "api_token_problem",
    "get_settings",
    "identity",
]

_DEV_ACCESS_KEY = "rsieve-local"
_DEV_SECRET_KEY = "rsieve-local-secret"


@dataclass(frozen=True)
class Role:
    """What a settings field is to a run, declared beside the field (Annotated) so the
    field and its role are one line: `deciding` when a different value can put an item
    in another place, give a row other content or change what the card reports (the run
    id is derived from these, so changing one makes a new run); `operational` when it only
    changes how, where or how fast the run is executed. Secrets are never deciding.
    `since_first_ids`: a deciding field added after run ids were first given out, which
    enters a run's id only when set to something other than its default (SINCE_FIRST_IDS)."""

    kind: Literal["deciding", "operational"]
    since_first_ids: bool = False


DECIDES = Role("deciding")
SINCE_FIRST_ID = Role("deciding", since_first_ids=True)
OPERATES = Role("operational")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RSIEVE_", extra="ignore")

    environment: Annotated[Literal["local", "test", "production"], OPERATES] = "local"

    # Queues (Celery on Redis).
    redis_url: Annotated[str, OPERATES] = "redis://127.0.0.1:16379/0"
    # Seconds before a message delivered to a worker that died is redelivered. Must exceed
    # the longest shard; it comes back after this plus one restore sweep (measured: 20 s + 2 s
    # sweep gave 21.7 s).
    visibility_timeout_s: Annotated[int, OPERATES] = 900
    unacked_restore_interval_s: Annotated[int, OPERATES] = Field(5, ge=1)
    # Every process that runs stage tasks beats every heartbeat_s and records the shards it
    # holds; once its heartbeat is holder_lapse_s old, any worker's heartbeat thread puts
    # those shards back on their queues (rsieve.run.holdings). The visibility timeout is
    # only the last resort (a holding lost with Redis, a message prefetched but not started).
    heartbeat_s: Annotated[float, OPERATES] = Field(5.0, gt=0)
    holder_lapse_s: Annotated[float, OPERATES] = Field(20.0, gt=0)
    # A shard delivered more often than this is processed item by item, and the item that
    # was in flight when a worker died during such a delivery is quarantined (max_deliveries).
    max_deliveries: Annotated[int, OPERATES] = Field(3, ge=1)
    # A shard task that raises an unexpected exception (or a transient one past its own
    # retries) is tried again this many times with backoff (stage_error_backoff_s doubling,
    # at most 60 s); then its items are isolated (bisected) and those that still raise are
    # quarantined `stage_error`. A failure that hits every item stops the run (`failed`,
    # with the reason) until `rsieve reconcile` resumes it (docs/operations.md).
    stage_error_retries: Annotated[int, OPERATES] = Field(3, ge=0)
    stage_error_backoff_s: Annotated[float, OPERATES] = Field(2.0, ge=0)
    # Hard limit on one shard task: a hung task is killed and redelivered (then isolated).
    # The generate and judge shards get their own when sent (rsieve.run.limits): their
    # model's observed seconds per item (an EWMA in Redis, recorded per batch, weight
    # shard_latency_alpha) x the shard's items x shard_time_limit_factor, never under this
    # and never over shard_time_limit_max_s nor the visibility timeout less one restore
    # sweep (a message held longer is restored while its task still runs).
    task_time_limit_s: Annotated[int, OPERATES] = 600
    shard_time_limit_factor: Annotated[float, OPERATES] = Field(3.0, gt=0)
    shard_time_limit_max_s: Annotated[int, OPERATES] = Field(890, ge=1)
    shard_latency_alpha: Annotated[float, OPERATES] = Field(0.3, gt=0, le=1)
    # A generate or judge shard stores its replies every this many items answered (one
    # batch), so that a redelivery (a worker killed, a time limit) asks only the rest
    # (rsieve.generate.progress; the judge through its verdict cache). 0: one batch.
    progress_batch_items: Annotated[int, OPERATES] = Field(32, ge=0)
    # On SIGTERM (warm shutdown) a worker stops taking work and finishes its running shard;
    # on a second signal or SIGQUIT, Celery's soft shutdown gives it this long before the
    # shard is handed back to the queue.
    soft_shutdown_s: Annotated[float, OPERATES] = 60.0

    # Object storage (any S3 endpoint; SeaweedFS locally).
    s3_endpoint: Annotated[str, OPERATES] = "http://127.0.0.1:18333"
    s3_bucket: Annotated[str, OPERATES] = "rsieve"
    s3_region: Annotated[str, OPERATES] = "us-east-1"
    s3_access_key: Annotated[SecretStr, OPERATES] = SecretStr(_DEV_ACCESS_KEY)
    s3_secret_key: Annotated[SecretStr, OPERATES] = SecretStr(_DEV_SECRET_KEY)

    # Models behind Triton (the rsieve text-generation interface; deploy/triton/README.md).
    # One engine per role: the generator's VLM engine here; the judge's engine at
    # judge_triton_grpc_url (empty: the same server, as on the CPU stack).
    triton_grpc_url: Annotated[str, OPERATES] = "127.0.0.1:18001"
    judge_triton_grpc_url: Annotated[str, OPERATES] = ""
    generator_model: Annotated[str, DECIDES] = "rapidocr"
    # The CPU stack's judge is SmolLM2-135M-Instruct (deploy/triton/cpu/judge-smollm2);
    # `judge-abstain` (a stand-in that answers UNSURE to everything) is for tests that need
    # a judge that never promotes.
    judge_model: Annotated[str, DECIDES] = "judge-smollm2"
    # The judge weights' identity: the sha256 of its checkpoint (empty: undeclared, the
    # model is known by its name alone). With the name, the prompt template and the budget
    # it addresses the verdict cache (rsieve.judge.judgecache, docs/judge.md): set it whenever
    # the weights served under a name can change, or a reply of the old weights is reused.
    judge_weights_sha256: Annotated[str, SINCE_FIRST_ID] = Field("", pattern=r"^([0-9a-f]{64})?$")
    # Items in flight at Triton per call (the judge) or per generator worker when its engine
    # declares no capacity (engine_capacity, below).
    max_inflight: Annotated[int, OPERATES] = Field(
        32, ge=1, description="items in flight at Triton per worker"
    )
    # Items per Triton request for rsieve-interface models (client-side batching); 0: the
    # model's max_batch_size. Always at most the in-flight limit.
    request_items: Annotated[int, OPERATES] = Field(
        0, ge=0, description="items per Triton request (0: a batch)"
    )
    model_timeout_s: Annotated[float, OPERATES] = 120.0
    model_retries: Annotated[int, OPERATES] = Field(3, ge=0)
    max_new_tokens: Annotated[int, DECIDES] = 1024
    # The judge's budget: a thinking judge needs room to reason; a verdict-only judge (the
    # CPU stack's SmolLM2) needs a few tokens, and every token is CPU time there.
    judge_max_new_tokens: Annotated[int, DECIDES] = Field(1024, ge=1)
    temperature: Annotated[float, DECIDES] = 0.0
    # Nucleus sampling (1.0: off); sent to the vLLM and OpenAI-compatible interfaces.
    top_p: Annotated[float, DECIDES] = Field(1.0, gt=0, le=1)
    # Best-of-n (docs/sampling.md): answers asked per question. 1, at temperature 0, is the
    # card's process; more need a temperature above 0. Sample k of an item is asked with
    # seed sample_seed(seed, item id, k), so a rerun asks exactly the same.
    samples: Annotated[int, DECIDES] = Field(1, ge=1, le=64)
    seed: Annotated[int, DECIDES] = Field(0, ge=0, lt=2**31)
    # Accepted answers kept per item: `first` keeps the first; `distinct` every one whose
    # answer the protocol does not match to a kept one's and whose reasoning differs.
    keep: Annotated[Literal["first", "distinct"], SINCE_FIRST_ID] = "first"
    max_kept: Annotated[int, DECIDES] = Field(1, ge=1)
    # When no sample of an item passed the verifier: judge calls for it, at most (its
    # first rejected samples).
    judge_samples: Annotated[int, DECIDES] = Field(1, ge=1)
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
    # "rsieve" (prompt/image -> text/finish_reason), "vllm" (Triton's vLLM backend, chat
    # template rendered client side), "auto" (read from the model's metadata), or "openai":
    # an OpenAI-compatible server's /chat/completions (vLLM's `vllm serve`, SGLang, TGI,
    # llama.cpp's server, `transformers serve`, a hosted API; docs/models.md), which renders
    # the chat template itself. The generator's interface, and the judge's unless
    # judge_interface names its own.
    model_interface: Annotated[Literal["auto", "rsieve", "vllm", "openai"], DECIDES] = "auto"
    judge_interface: Annotated[Literal["", "auto", "rsieve", "vllm", "openai"], SINCE_FIRST_ID] = ""
    # The OpenAI-compatible endpoints (interface "openai"): each role's base URL, ending in
    # /v1 (the judge's empty: the generator's), and the API key sent as a bearer token
    # (never logged; the judge's empty: the generator's).
    generator_openai_url: Annotated[str, OPERATES] = ""
    judge_openai_url: Annotated[str, OPERATES] = ""
    generator_openai_key: Annotated[SecretStr, OPERATES] = SecretStr("")
    judge_openai_key: Annotated[SecretStr, OPERATES] = SecretStr("")
    # Fields merged into every OpenAI-compatible request, for what a server takes beyond
    # the standard ones, e.g. {"chat_template_kwargs": {"enable_thinking": true}} for a
    # Qwen3 checkpoint on vLLM or SGLang (rsieve's own fields win on a clash).
    openai_extra_body: Annotated[dict[str, Any], SINCE_FIRST_ID] = {}
    # What each endpoint's model is (rsieve.schemas.MODEL_KINDS) for the card: an
    # OpenAI-compatible server cannot declare it as a Triton config does.
    generator_kind: Annotated[ModelKind, SINCE_FIRST_ID] = "vlm"
    judge_kind: Annotated[ModelKind, SINCE_FIRST_ID] = "llm"
    # Each model's tokenizer files: its checkpoint folder (or .gguf), read without weights
    # (docs/models.md). The client renders the checkpoint's own chat template from them for
    # the vLLM interface (required there), and on every interface neutralises the
    # tokenizer's special tokens in text sent to the model. Empty: none (rsieve interface).
    generator_tokenizer: Annotated[str, DECIDES] = ""
    judge_tokenizer: Annotated[str, DECIDES] = ""
    # Reasoning on: what it means depends on the template's thinking mode (rsieve.generate.chat).
    reasoning: Annotated[bool, DECIDES] = True
    # Images are sent at most this long on their longest side (resized, re-encoded PNG).
    image_max_side: Annotated[int, DECIDES] = Field(1536, ge=16)
    # First backoff (doubling) between retries of a model call or of the readiness wait.
    model_backoff_s: Annotated[float, OPERATES] = Field(1.0, gt=0)

    # Workers.
    worker_concurrency: Annotated[int, OPERATES] = Field(
        1, ge=1, description="Celery prefork children per worker"
    )
    # Shards a generator worker holds open at once (Celery threads). A reasoning model's
    # shard waits minutes on its slowest item while the rest of its slots serve other
    # shards, so keep enough open that the waiting ones cover the engine's share:
    # roughly share / shard_size x (1 + slowest / mean item time) (docs/performance.md).
    generator_concurrency: Annotated[int, OPERATES] = Field(
        32, ge=1, description="shards a generator worker holds open at once (threads)"
    )
    # Sequences the generator's engine runs at once (vLLM's max_num_seqs); 0: learned from
    # the model's Triton config (parameter `max_num_seqs`), else max_inflight. The generator
    # workers feeding one engine share it (docs/performance.md, "Concurrency sized from the
    # engine").
    engine_capacity: Annotated[int, OPERATES] = Field(
        0, ge=0, description="engine sequences at once (0: learn)"
    )

    # Dataset shards: a Parquet file of a split is closed once its data passes this size.
    parquet_shard_bytes: Annotated[int, OPERATES] = Field(256 * 1024 * 1024, ge=1024)
    # Rows buffered before they are written as one row group (bounds compaction memory).
    parquet_row_group_rows: Annotated[int, OPERATES] = Field(256, ge=1)
    # Keys per read of the dataset's key index (rsieve.compact.keyindex, 16 bytes each): with the
    # run's own keys, what one compaction holds of it, whatever the dataset's size.
    key_index_chunk_keys: Annotated[int, OPERATES] = Field(65_536, ge=1)
    # Compaction partitions (rsieve.run.partitions): a run of more pool lines than this is
    # compacted one task per partition of about this many, after routing its outcomes in
    # groups of compact_route_shards shards; memory per task is one partition's.
    compact_partition_items: Annotated[int, OPERATES] = Field(20_000, ge=1)
    compact_route_shards: Annotated[int, OPERATES] = Field(64, ge=1)

    # Ingest in rounds (rsieve.clean.ingestion): a pool of more lines than this is ingested by
    # tasks of one range of about this many lines (whole shards) or one key partition.
    ingest_range_items: Annotated[int, OPERATES] = Field(20_000, ge=1)

    # Work units and limits.
    shard_size: Annotated[int, OPERATES] = Field(
        128, ge=1, description="pool lines per shard message"
    )
    image_max_pixels: Annotated[int, DECIDES] = MAX_PIXELS
    image_max_bytes: Annotated[int, DECIDES] = 32 * 1024 * 1024
    text_max_chars: Annotated[int, DECIDES] = 16_384
    provenance_policy: Annotated[Literal["strict", "lenient"], DECIDES] = "strict"
    # Folders a local-path `source` may be read from to check it holds the attached image
    # (docs/cleaning.md); none by default, so local paths are unresolvable.
    provenance_roots: Annotated[list[str], DECIDES] = []
    # Buckets an s3:// `source` may be read from besides the services' own (s3_bucket);
    # any other bucket is unresolvable, whatever the credentials reach.
    provenance_buckets: Annotated[list[str], DECIDES] = []
    # Continuous ingestion: pool folders under this S3 prefix are taken once each by the
    # `rsieve.watch` task (Celery beat, every watch_interval_s); empty = off.
    watch_prefix: Annotated[str, OPERATES] = ""
    watch_interval_s: Annotated[float, OPERATES] = Field(30.0, gt=0)
    # The sweeper (on the beat): every sweep_interval_s (0 = off) it reconciles each run not
    # yet compacted that nothing has happened to for sweep_after_s (twice the visibility
    # timeout by default: a shard in flight comes back within one).
    sweep_interval_s: Annotated[float, OPERATES] = Field(300.0, ge=0)
    sweep_after_s: Annotated[float, OPERATES] = Field(1800.0, gt=0)
    watch_dataset: Annotated[str, OPERATES] = Field("watched", pattern=DATASET_PATTERN)
    # Task purity (docs/cleaning.md): a family whose measured off-task share exceeds the
    # threshold keeps only its on-task items; families under min_items are measured only.
    purity_threshold: Annotated[float, DECIDES] = Field(0.05, ge=0, le=1)
    purity_min_items: Annotated[int, DECIDES] = Field(20, ge=1)
    purity_embedding: Annotated[bool, DECIDES] = Field(
        True, description="settle open questions by embedding"
    )
    # Origin first (docs/cleaning.md): family -> the source dataset names accepted as its
    # benchmark origin (JSON, e.g. {"TextVQA": ["textvqa"]}); an item of another origin is
    # off-task. A family not named here takes its dominant origin, if it has one.
    purity_origins: Annotated[dict[str, list[str]], DECIDES] = {}
    # Near-duplicate images and evaluation sets (docs/cleaning.md, "Decontamination"): two
    # images match when their perceptual hashes differ in at most this many of 64 bits
    # (bench/bench_phash.py on 352 real images: no false match below 12).
    near_duplicate_distance: Annotated[int, DECIDES] = Field(8, ge=0, le=16)
    # What makes an item `contaminated`: its image alone matching an image of a registered
    # evaluation set ("image"), or the image and the question ("image_and_question").
    evalset_match: Annotated[Literal["image", "image_and_question"], DECIDES] = "image"

    # Judge calibration (docs/judge.md): accepted items probed per family (a deterministic
    # hash-ranked sample), the fraction of accepted items eligible for it, and the bound on
    # the Wilson 95% upper bound of a family's false-promotion rate above which its judge
    # promotions are held back (reason judge_untrusted).
    judge_calibration_size: Annotated[int, DECIDES] = Field(
        60, ge=0, description="calibration sample per family"
    )
    judge_calibration_rate: Annotated[float, DECIDES] = Field(1.0, ge=0.0, le=1.0)
    judge_false_promotion_bound: Annotated[float, DECIDES] = Field(0.05, ge=0.0, le=1.0)
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

    # API.
    api_url: Annotated[str, OPERATES] = "http://127.0.0.1:18080"
    # The bearer token every route but /healthz and the review page's HTML needs. The API
    # refuses to start without one of at least API_TOKEN_MIN_CHARS that is no placeholder
    # (`api_token_problem`), unless `api_dev_open` says, explicitly, that this is a laptop.
    api_token: Annotated[SecretStr | None, OPERATES] = None
    # Local development only: the API answers without a token when none is set. Never in a
    # deployment (docs/security.md); the local stack does not need it (it makes a token).
    api_dev_open: Annotated[bool, OPERATES] = False
    # Folders the API may read a pool from when a submission names a path (none by default).
    api_pool_roots: Annotated[list[str], OPERATES] = []
    # Largest body of an upload (POST /runs/upload, a pool archive), and of every other
    # request (JSON). Both are refused with 413 before they are read past the limit.
    api_max_request_bytes: Annotated[int, OPERATES] = Field(2 * 1024**3, ge=1024)
    api_max_json_bytes: Annotated[int, OPERATES] = Field(1024**2, ge=1024)
    # Files an uploaded archive may hold, and their total size once extracted.
    api_max_upload_files: Annotated[int, OPERATES] = Field(200_000, ge=1)
    api_max_extracted_bytes: Annotated[int, OPERATES] = Field(4 * 1024**3, ge=1024)
    # Uploads the API takes at once; one more gets 429 before its body is read. An upload
    # holds at most api_max_request_bytes + api_max_extracted_bytes of temporary space, so
    # the API's temporary folder needs `upload_slots` times that (docs/security.md).
    api_upload_slots: Annotated[int, OPERATES] = Field(2, ge=1)
    # An archive may expand to at most this many times its own size (a pool of images
    # barely compresses; a few KB that inflate to gigabytes are a bomb).
    api_max_expansion_ratio: Annotated[float, OPERATES] = Field(50.0, ge=1.0)
    # Triton's Prometheus endpoint, read by the API's /metrics for in-flight requests.
    triton_metrics_url: Annotated[str | None, OPERATES] = None

    @model_validator(mode="after")
    def _no_dev_secrets_in_production(self) -> Settings:
        if self.environment == "production" and (
            self.s3_access_key.get_secret_value() == _DEV_ACCESS_KEY
            or self.s3_secret_key.get_secret_value() == _DEV_SECRET_KEY
        ):
            raise ValueError("production needs real S3 credentials (RSIEVE_S3_ACCESS_KEY/..)")
        return self

    @model_validator(mode="after")
    def _heartbeat_beats_before_it_lapses(self) -> Settings:
        if self.holder_lapse_s < 2 * self.heartbeat_s:
            raise ValueError("holder_lapse_s must be at least twice heartbeat_s")
        return self

    @model_validator(mode="after")
    def _training_rules_exist(self) -> Settings:
        check_training_rules(self.training_rules, self.family_training_rules)
        return self

    def training_policy(self) -> TrainingPolicy:
        return TrainingPolicy(self.training_rules, self.family_training_rules)

    @model_validator(mode="after")
    def _pass_rate_window_is_a_range(self) -> Settings:
        w = self.pass_rate_window
        if w and not (len(w) == 2 and 0 <= w[0] <= w[1] <= 1):
            raise ValueError(f"pass_rate_window {w} is not [low, high] with 0 <= low <= high <= 1")
        if w and self.samples == 1:
            raise ValueError("a pass-rate window needs several samples (samples > 1)")
        return self

    @model_validator(mode="after")
    def _samples_need_a_temperature(self) -> Settings:
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
    def _blind_policy_needs_the_blind_pass(self) -> Settings:
        if self.blind_policy != "keep" and not self.blind_pass:
            raise ValueError(
                f"blind_policy={self.blind_policy} does nothing without the blind pass: "
                "set RSIEVE_BLIND_PASS=true (rsieve run|submit --blind-pass)"
            )
        return self

    @model_validator(mode="after")
    def _openai_needs_an_endpoint(self) -> Settings:
        for role in ("generator", "judge"):
            if self.interface_of(role) == "openai" and not self.openai_url_of(role):
                raise ValueError(
                    f"the {role}'s interface is openai but no endpoint is set "
                    f"(RSIEVE_{role.upper()}_OPENAI_URL, the base URL ending in /v1)"
                )
        return self

    def for_run(self, sampling: Mapping[str, Any] | None) -> Settings:
        """These settings with a run's own sampling (SAMPLING fields only: what a
        submission may choose), validated as any settings are."""
        if not sampling:
            return self
        unknown = sorted(set(sampling) - set(SAMPLING))
        if unknown:
            raise ValueError(f"a run may choose only {list(SAMPLING)}, not {unknown}")
        return type(self)(**{**self.model_dump(), **sampling})

    def interface_of(self, role: Literal["generator", "judge"]) -> str:
        """The role's model interface: the judge's own, else the generator's."""
        return (
            (self.judge_interface or self.model_interface)
            if role == "judge"
            else (self.model_interface)
        )

    def openai_url_of(self, role: Literal["generator", "judge"]) -> str:
        if role == "judge":
            return self.judge_openai_url or self.generator_openai_url
        return self.generator_openai_url

    def openai_key_of(self, role: Literal["generator", "judge"]) -> SecretStr:
        if role == "judge" and self.judge_openai_key.get_secret_value():
            return self.judge_openai_key
        return self.generator_openai_key

    @classmethod
    def from_env_map(cls, env: dict[str, str]) -> Settings:
        """Settings from RSIEVE_* variables given as a mapping (a stack's environment),
        decoded as pydantic-settings decodes the process environment."""
        values: dict[str, object] = {}
        for key, raw in env.items():
            name = key.removeprefix("RSIEVE_").lower()
            field = cls.model_fields.get(name)
            if field is None:
                continue
            complex_ = get_origin(field.annotation) in (list, dict) or field.annotation in (
                list,
                dict,
            )
            values[name] = json.loads(raw) if complex_ else raw
        return cls(**values)  # type: ignore[arg-type]

    def fingerprint(self) -> dict[str, object]:
        """The settings that change what a run decides (DECIDING): part of the run's id,
        and exported whole in the dataset's run_spec.json. A field in neither DECIDING nor
        OPERATIONAL fails tests/unit/test_run_identity.py."""
        return {name: _plain(getattr(self, name)) for name in sorted(DECIDING)}


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _fields_with(*roles: Role) -> frozenset[str]:
    """The fields whose declared role (their Annotated metadata) is one of `roles`."""
    return frozenset(
        name
        for name, info in Settings.model_fields.items()
        if any(m in roles for m in info.metadata if isinstance(m, Role))
    )


# Derived from the fields' own declarations (Role): never listed twice.
DECIDING = _fields_with(DECIDES, SINCE_FIRST_ID)
# What a submission may choose for its own run (POST /runs `sampling`, `rsieve run
# --samples`): the generator's sampling and what best-of-n keeps. The run's spec records
# them and every stage reads them from there (services.common.Context.run_settings).
SAMPLING = (
    "samples",
    "temperature",
    "top_p",
    "seed",
    "keep",
    "max_kept",
    "judge_samples",
    "pass_rate_window",
    "circular",
    "blind_pass",
    "blind_policy",
)

# How a run decides what becomes a training target. Like SAMPLING, every stage reads
# these from the run's spec, not from its own environment (Context.run_settings), so a
# worker started with other settings still decides the run as its id says.
TRAINING = (
    "training_rules",
    "family_training_rules",
    "trace_checks",
    "trace_repetition_span",
    "trace_repetition_max_share",
    "trace_mixing_min_chars",
    "trace_length_mads",
    "trace_length_floor_chars",
    "trace_length_min_traces",
)

# DECIDING fields added after run ids were first given out. Each enters a run's id only
# when set to something other than its default, so a pool submitted with the defaults keeps
# the id it had before the field existed (run_spec.json records every field).
SINCE_FIRST_IDS = _fields_with(SINCE_FIRST_ID)


def identity(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What of a fingerprint names the run: every field but those of SINCE_FIRST_IDS left
    at their default."""
    return {
        name: value
        for name, value in fingerprint.items()
        if name not in SINCE_FIRST_IDS
        or value != _plain(Settings.model_fields[name].get_default(call_default_factory=True))
    }


OPERATIONAL = _fields_with(OPERATES)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


API_TOKEN_MIN_CHARS = 32
_PLACEHOLDERS = ("change", "example", "placeholder", "secret", "token", "password", "xxxx")


def api_token_problem(token: str | None) -> str | None:
    """Why `token` cannot guard the API (None when it can): missing, shorter than
    API_TOKEN_MIN_CHARS, or a placeholder: a few characters repeated, or a word such as
    "changeme" or "example" in a token with fewer distinct characters than a random one
    (32 random characters of base64 hold about 25 distinct ones)."""
    if not token:
        return "no token is set (RSIEVE_API_TOKEN)"
    if len(token) < API_TOKEN_MIN_CHARS:
        return f"the token is shorter than {API_TOKEN_MIN_CHARS} characters"
    lowered = token.lower()
    distinct = len(set(token))
    if distinct <= 4 or (distinct < 20 and any(word in lowered for word in _PLACEHOLDERS)):
        return "the token looks like a placeholder"
    return None
