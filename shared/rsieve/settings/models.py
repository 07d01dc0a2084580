"""The models a run asks: which generator and judge, through which interface and endpoint,
with which tokenizer, budget and image size, how their calls are batched and retried, and
how the judge is calibrated (docs/models.md, docs/judge.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, model_validator

from rsieve.schemas import ModelKind
from rsieve.settings.roles import DECIDES, OPERATES, SINCE_FIRST_ID

ModelRole = Literal["generator", "judge"]


class ModelSettings(BaseModel):
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
    # Repetition loops cut short (rsieve.generate.loops, docs/sampling.md): the generator
    # streams each answer and cancels one whose last characters are one unit of at most
    # 512 repeated loop_min_repeats times or more, covering loop_min_chars, within the last
    # loop_window_chars; the output is recorded `repetition_loop`. 0: no watching (and no
    # streaming): a loop runs to max_new_tokens.
    loop_window_chars: Annotated[int, SINCE_FIRST_ID] = Field(2048, ge=0, le=65536)
    loop_min_repeats: Annotated[int, SINCE_FIRST_ID] = Field(4, ge=2, le=1000)
    loop_min_chars: Annotated[int, SINCE_FIRST_ID] = Field(160, ge=16)
    # Reasoning on: what it means depends on the template's thinking mode (rsieve.generate.chat).
    reasoning: Annotated[bool, DECIDES] = True
    # Images are sent at most this long on their longest side (resized, re-encoded PNG).
    image_max_side: Annotated[int, DECIDES] = Field(1536, ge=16)
    # First backoff (doubling) between retries of a model call or of the readiness wait.
    model_backoff_s: Annotated[float, OPERATES] = Field(1.0, gt=0)

    # Judge calibration (docs/judge.md): accepted items probed per family (a deterministic
    # hash-ranked sample), the fraction of accepted items eligible for it, and the bound on
    # the Wilson 95% upper bound of a family's false-promotion rate above which its judge
    # promotions are held back (reason judge_untrusted).
    judge_calibration_size: Annotated[int, DECIDES] = Field(
        60, ge=0, description="calibration sample per family"
    )
    judge_calibration_rate: Annotated[float, DECIDES] = Field(1.0, ge=0.0, le=1.0)
    judge_false_promotion_bound: Annotated[float, DECIDES] = Field(0.05, ge=0.0, le=1.0)
    # When a family's probes stop (rsieve.judge.sequential): `decided`, as soon as its bound
    # is decided (a family too small to clear it is not probed); `sample`, only when every
    # probe of its sample was asked (a fixed-size measurement, e.g. to compare judges).
    judge_calibration_stop: Annotated[Literal["decided", "sample"], SINCE_FIRST_ID] = "decided"

    @model_validator(mode="after")
    def _openai_needs_an_endpoint(self) -> ModelSettings:
        for role in ("generator", "judge"):
            if self.interface_of(role) == "openai" and not self.openai_url_of(role):
                raise ValueError(
                    f"the {role}'s interface is openai but no endpoint is set "
                    f"(RSIEVE_{role.upper()}_OPENAI_URL, the base URL ending in /v1)"
                )
        return self

    def interface_of(self, role: ModelRole) -> str:
        """The role's model interface: the judge's own, else the generator's."""
        return (
            (self.judge_interface or self.model_interface)
            if role == "judge"
            else (self.model_interface)
        )

    def openai_url_of(self, role: ModelRole) -> str:
        if role == "judge":
            return self.judge_openai_url or self.generator_openai_url
        return self.generator_openai_url

    def openai_key_of(self, role: ModelRole) -> SecretStr:
        if role == "judge" and self.judge_openai_key.get_secret_value():
            return self.judge_openai_key
        return self.generator_openai_key
