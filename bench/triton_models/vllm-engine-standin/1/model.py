"""vllm-engine-standin (benchmarks only): a stand-in for a vLLM engine behind Triton's vLLM
backend, named for what it is. No model runs here.

Why: a benchmark of the pipeline against vLLM needs a generator that batches continuously
and saturates like vLLM does (sequences join and leave a running batch at step boundaries,
a KV budget holds requests back), so that what the pipeline fails to keep in flight shows
up as engine capacity left unused. fixed-latency-vlm, beside it, models static batching.

The interface is exactly the vLLM backend's as rsieve's client uses it (decoupled;
``text_input`` = the rendered chat prompt, ``image`` = base64 of the encoded image,
``sampling_parameters`` JSON, ``exclude_input_in_output`` and ``return_*`` flags), and each
request gets ONE final response: ``text_output`` always, ``finish_reason`` /
``num_input_tokens`` / ``num_output_tokens`` when their flag asks. Not simulated: streaming
(``stream`` is read and ignored: the answer comes whole, as the client asks it), ``n`` > 1,
logprobs, and the ``<|image_pad|>`` count check the mimic makes.

The timing is 1/engine.py's (pure, unit-tested); this shell feeds it and answers for it.
``execute`` only parses and queues (decoupled: it returns at once); ONE background thread
wakes on the next completion or preemption, a new arrival, or the metrics period, calls
``advance(now)`` and sends what finished. Nothing runs per decode step.

What a request gets (deterministic: a random.Random seeded from sha256 of the seed, the
prompt and the image bytes, and the request's own `seed` when it sends one other than 0:
the samples of best-of-n differ, as vLLM's seeded samples do):

- Prompt tokens: ceil(utf-8 bytes of text_input / 4) + image_tokens per image.
- Reasoning: a prompt ending in ``<think>\\n\\n</think>\\n\\n`` (a switch turned off) gets a
  plain answer of a plain_* length; one ending in ``<think>\\n`` (the template opened the
  reasoning) gets filler + ``</think>\\n\\n`` + answer; any other gets the same with its
  own ``<think>\\n`` in front. Lengths are think_* lognormal; filler is about 4 characters
  a token, so responses have a realistic size.
- Length: a PNG tEXt chunk ``standin-tokens`` in the image forces it (tests make one item
  very long); past sampling ``max_tokens`` (vLLM's default 16) the text is cut where the
  budget ends, with no closing tag and no answer, and finish_reason is ``length``.
- Answer: the image's PNG tEXt chunk ``bench-answer`` (``unknown`` without one) with
  probability p_correct, else ``wrong``.

Metrics, on Triton's own /metrics endpoint (Python-backend custom metrics), labelled
``model="vllm-engine-standin"``, published from the loop thread at most every 100 ms while
anything runs and when the engine goes idle: the counters ``rsieve_standin_*_total``
(admitted, finished, generated_tokens, prefill_tokens, prefill_seconds, busy_seconds,
running_seconds, steps, preemptions) and the gauges ``rsieve_standin_running``,
``_waiting``, ``_kv_used_tokens``, ``_kv_budget_tokens``, ``_max_num_seqs`` and
``_peak_decode_tokens_per_s``. The mean running sequences over a window is the window's
running_seconds delta over its length, exactly.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.util
import json
import math
import os
import random
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils

NAME = "vllm-engine-standin"
ENV_PREFIX = "RSIEVE_STANDIN_"
# The parameters (config.pbtxt) and their defaults; each one RSIEVE_STANDIN_<KEY> overrides.
DEFAULTS = {
    "max_num_seqs": "256",
    "step_base_ms": "4",
    "step_per_seq_ms": "0.02",
    "prefill_ms_per_token": "0.005",
    "kv_budget_tokens": "524288",
    "image_tokens": "256",
    "think_median_tokens": "300",
    "think_p99_tokens": "4000",
    "plain_median_tokens": "12",
    "plain_p99_tokens": "60",
    "p_correct": "0.75",
    "seed": "0",
}
OPENED = "<think>\n"
CLOSED_EMPTY = "<think>\n\n</think>\n\n"
VLLM_DEFAULT_MAX_TOKENS = 16  # vLLM SamplingParams' default
PUBLISH_S = 0.1
_FILLER = (
    "Looking at the image, the characters read left to right; checking each one "
    "against the question again before answering. "
)

COUNTERS = {  # metric name -> (engine attribute, help)
    "admitted_total": ("admitted", "admissions to the running batch (re-admissions too)"),
    "finished_total": ("finished", "sequences finished"),
    "generated_tokens_total": ("generated_tokens", "decode tokens generated"),
    "prefill_tokens_total": ("prefill_tokens", "tokens prefilled (again after preemption)"),
    "prefill_seconds_total": ("prefill_seconds", "seconds of prefill folded into steps"),
    "busy_seconds_total": ("busy_seconds", "seconds with at least one running sequence"),
    "running_seconds_total": ("running_seconds", "integral of running sequences over time"),
    "steps_total": ("steps", "decode steps"),
    "preemptions_total": ("preemptions", "sequences preempted back to the queue"),
}
GAUGES = {
    "running": "sequences running now",
    "waiting": "requests waiting for admission",
    "kv_used_tokens": "KV-cache tokens held by running sequences",
    "kv_budget_tokens": "KV-cache capacity in tokens",
    "max_num_seqs": "the engine's capacity in running sequences",
    "peak_decode_tokens_per_s": "max_num_seqs / (step_base + step_per_seq * max_num_seqs)",
}


def _load_engine(path: Path) -> ModuleType:
    """engine.py beside this file, by path: the stub does not put this folder on sys.path."""
    spec = importlib.util.spec_from_file_location("rsieve_vllm_engine_standin", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def png_text(data: bytes, keyword: bytes) -> str | None:
    """The text of a PNG tEXt chunk, without decoding the image: the chunk's length field
    (4 bytes before its type) bounds the text after ``keyword\\0``."""
    at = data.find(keyword + b"\0")
    if at < 8 or data[at - 4 : at] != b"tEXt":
        return None
    length = int.from_bytes(data[at - 8 : at - 4], "big")
    return data[at + len(keyword) + 1 : at + length].decode("latin-1")


def _flag(request: Any, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else False


def _strings(values: list[bytes]) -> Any:
    return np.array(values, dtype=np.object_)


class RequestError(Exception):
    pass


class _Pending:
    """What a queued request needs for its answer; the text is made when it finishes."""

    __slots__ = ("answer", "flags", "mode", "prompt", "prompt_tokens", "sender", "truncated")

    def __init__(self, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self, key, value)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{NAME} must be decoupled, as vLLM is")
        declared = config.get("parameters", {})
        params = {}
        for key, default in DEFAULTS.items():
            value = declared.get(key, {}).get("string_value") or default
            params[key] = os.environ.get(ENV_PREFIX + key.upper()) or value
        # Triton (2.51) serves the config file's parameters: an auto-completed parameter is
        # dropped (outputs added the same way are kept), so an override cannot reach clients.
        if params["max_num_seqs"] != (
            declared.get("max_num_seqs", {}).get("string_value") or DEFAULTS["max_num_seqs"]
        ):
            pb_utils.Logger.log_warn(
                f"{NAME}: max_num_seqs {params['max_num_seqs']} from the environment; clients "
                "read the config's value as the engine's capacity"
            )
        self.p = params
        self.image_tokens = int(params["image_tokens"])
        self.p_correct = float(params["p_correct"])
        self.lengths = {
            "think": (float(params["think_median_tokens"]), float(params["think_p99_tokens"])),
            "plain": (float(params["plain_median_tokens"]), float(params["plain_p99_tokens"])),
        }
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.engine_mod = _load_engine(version_dir / "engine.py")
        self.engine = self.engine_mod.Engine(
            max_num_seqs=int(params["max_num_seqs"]),
            step_base_ms=float(params["step_base_ms"]),
            step_per_seq_ms=float(params["step_per_seq_ms"]),
            prefill_ms_per_token=float(params["prefill_ms_per_token"]),
            kv_budget_tokens=int(params["kv_budget_tokens"]),
        )
        self.filler = _FILLER * 2048  # about 64k tokens' worth; grown if a request needs more
        self._cond = threading.Condition()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._kicked = self._stopping = False
        self._init_metrics()
        self._thread = threading.Thread(target=self._loop, name=f"{NAME}-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def _parse(self, request: Any) -> tuple[_Pending, int]:
        """The request's record and its output length (before the KV budget's cut)."""
        text_input = pb_utils.get_input_tensor_by_name(request, "text_input")
        if text_input is None:
            raise RequestError("text_input is required")
        prompt_bytes = bytes(text_input.as_numpy().reshape(-1)[0])
        prompt = prompt_bytes.decode("utf-8")
        image = pb_utils.get_input_tensor_by_name(request, "image")
        images = []
        for element in image.as_numpy().reshape(-1) if image is not None else []:
            try:
                images.append(base64.b64decode(bytes(element), validate=True))
            except (binascii.Error, ValueError) as exc:
                raise RequestError(f"image is not base64: {exc}") from exc
        params_t = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        params = (
            json.loads(bytes(params_t.as_numpy().reshape(-1)[0]).decode("utf-8"))
            if params_t is not None
            else {}
        )
        if not isinstance(params, dict):
            raise RequestError("sampling_parameters must be a JSON object")
        max_tokens = int(params.get("max_tokens") or VLLM_DEFAULT_MAX_TOKENS)
        if max_tokens < 1:
            raise RequestError("max_tokens must be at least 1")

        digest = hashlib.sha256(f"{self.p['seed']}\0".encode() + prompt_bytes)
        for data in images:
            digest.update(data)
        if params.get("seed"):  # a seeded sample (best-of-n) draws its own, as vLLM's does
            digest.update(f"\0seed {int(params['seed'])}".encode())
        rng = random.Random(digest.digest())
        correct = rng.random() < self.p_correct
        mode = (
            "plain"
            if prompt.endswith(CLOSED_EMPTY)
            else "opened"
            if prompt.endswith(OPENED)
            else "think"
        )
        forced = next(
            (png_text(d, b"standin-tokens") for d in images if b"standin-tokens\0" in d), None
        )
        if forced is not None and forced.strip().isdigit():
            drawn = max(1, int(forced.strip()))
        else:
            median, p99 = self.lengths["plain" if mode == "plain" else "think"]
            drawn = self.engine_mod.lognormal_tokens(rng, median, p99)
        answer = (
            next((png_text(d, b"bench-answer") for d in images if b"bench-answer\0" in d), None)
            or "unknown"
        )
        flags = {
            f
            for f in (
                "exclude_input_in_output",
                "return_finish_reason",
                "return_num_input_tokens",
                "return_num_output_tokens",
            )
            if _flag(request, f)
        }
        pending = _Pending(
            answer=answer if correct else "wrong",
            flags=flags,
            mode=mode,
            prompt=prompt,
            prompt_tokens=math.ceil(len(prompt_bytes) / 4) + self.image_tokens * len(images),
            sender=request.get_response_sender(),
            truncated=drawn > max_tokens,
        )
        return pending, min(drawn, max_tokens)

    def execute(self, requests: list[Any]) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        parsed = []
        for request in requests:
            try:
                parsed.append(self._parse(request))
            except Exception as exc:  # noqa: BLE001 - this request's error only
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"{NAME}: {exc}")
                    ),
                    flags=final,
                )
        with self._cond:
            now = time.monotonic()  # one instant: requests handed over together start together
            for pending, tokens in parsed:
                rid, self._next_id = self._next_id, self._next_id + 1
                try:
                    accepted = self.engine.submit(rid, pending.prompt_tokens, tokens, now)
                except ValueError as exc:  # a prompt longer than the KV budget
                    pending.sender.send(
                        pb_utils.InferenceResponse(
                            output_tensors=[], error=pb_utils.TritonError(f"{NAME}: {exc}")
                        ),
                        flags=final,
                    )
                    continue
                pending.truncated = pending.truncated or accepted < tokens
                self._pending[rid] = pending
            self._kicked = True
            self._cond.notify()
        return None

    def _text(self, pending: _Pending, tokens: int) -> str:
        """The generated text: about 4 characters a token, cut where the budget ended."""
        if pending.mode == "plain":
            return pending.answer[: 4 * tokens] if pending.truncated else pending.answer
        opening = OPENED if pending.mode == "think" else ""
        if pending.truncated:
            return opening + self._filler(4 * tokens)
        reasoning = max(0, tokens - 2 - math.ceil(len(pending.answer) / 4))
        return opening + self._filler(4 * reasoning) + "</think>\n\n" + pending.answer

    def _filler(self, chars: int) -> str:
        while len(self.filler) < chars:
            self.filler += self.filler
        return self.filler[:chars].rstrip(" ")

    def _send(self, pending: _Pending, tokens: int, finish: str | None = None) -> None:
        sender = pending.sender
        if sender.is_cancelled():  # the client went away: drop the answer, close the stream
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        text = self._text(pending, tokens) if finish is None else ""
        if "exclude_input_in_output" not in pending.flags:
            text = pending.prompt + text
        finish = finish or ("length" if pending.truncated else "stop")
        tensors = [pb_utils.Tensor("text_output", _strings([text.encode("utf-8")]))]
        if "return_finish_reason" in pending.flags:
            tensors.append(pb_utils.Tensor("finish_reason", _strings([finish.encode()])))
        if "return_num_input_tokens" in pending.flags:
            tensors.append(
                pb_utils.Tensor(
                    "num_input_tokens", np.array([pending.prompt_tokens], dtype=np.uint32)
                )
            )
        if "return_num_output_tokens" in pending.flags:
            tensors.append(
                pb_utils.Tensor("num_output_tokens", np.array([tokens], dtype=np.uint32))
            )
        sender.send(
            pb_utils.InferenceResponse(output_tensors=tensors),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    # ------------------------------------------------------------------ the engine loop
    def _loop(self) -> None:
        """Wake on the next engine event, an arrival or the metrics period; never per step."""
        published_at = -math.inf
        while True:
            with self._cond:
                if self._stopping:
                    return
                now = time.monotonic()
                done = [(self._pending.pop(rid), n) for rid, n in self.engine.advance(now)]
                idle = not self.engine.running and not self.engine.waiting
                stats = None
                if (idle and (done or self._kicked)) or now - published_at >= PUBLISH_S:
                    stats, published_at = self._stats(), now
                self._kicked = False
            for pending, tokens in done:
                try:
                    self._send(pending, tokens)
                except Exception as exc:  # noqa: BLE001 - one failed send must not stop the loop
                    pb_utils.Logger.log_warn(f"{NAME}: sending a response failed: {exc}")
            if stats is not None:
                self._publish(stats)
            with self._cond:
                if self._kicked or self._stopping:
                    continue
                now = time.monotonic()
                wake = self.engine.next_event_time(now)
                if self.engine.running:  # the integrals move: publish them every period
                    due = published_at + PUBLISH_S
                    wake = due if wake is None else min(wake, due)
                self._cond.wait(None if wake is None else max(0.0, wake - now))

    # ------------------------------------------------------------------ metrics
    def _init_metrics(self) -> None:
        labels = {"model": NAME}
        self._families, self._metrics = [], {}
        for kind, names in (
            (pb_utils.MetricFamily.COUNTER, {n: h for n, (_, h) in COUNTERS.items()}),
            (pb_utils.MetricFamily.GAUGE, GAUGES),
        ):
            for name, description in names.items():
                family = pb_utils.MetricFamily(
                    name=f"rsieve_standin_{name}", description=f"{NAME}: {description}", kind=kind
                )
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels)
        self._published = {name: 0.0 for name in COUNTERS}
        self._publish(self._stats())

    def _stats(self) -> dict[str, float]:
        eng = self.engine
        stats = {name: float(getattr(eng, attr)) for name, (attr, _) in COUNTERS.items()}
        stats.update(
            running=len(eng.running),
            waiting=len(eng.waiting),
            kv_used_tokens=eng.kv_used,
            kv_budget_tokens=eng.kv_budget,
            max_num_seqs=eng.max_num_seqs,
            peak_decode_tokens_per_s=eng.peak_decode_tokens_per_s(),
        )
        return stats

    def _publish(self, stats: dict[str, float]) -> None:
        """Counters by increment (Triton's counters only go up), gauges by set."""
        for name, value in stats.items():
            if name in COUNTERS:
                delta = value - self._published[name]
                if delta > 0:
                    self._metrics[name].increment(delta)
                    self._published[name] = value
            else:
                self._metrics[name].set(value)

    def finalize(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
            pending, self._pending = list(self._pending.values()), {}
        self._thread.join(timeout=5)
        for item in pending:  # unloaded mid-generation: vLLM's word for it is "abort"
            try:
                self._send(item, 0, finish="abort")
            except Exception:  # noqa: BLE001 - the client may be gone already
                pass
        self._metrics.clear()  # each Metric before its MetricFamily, as Triton requires
        self._families.clear()
