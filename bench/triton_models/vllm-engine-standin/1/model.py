"""vllm-engine-standin (benchmarks only): a stand-in for a vLLM engine behind Triton's vLLM
backend, named for what it is. No model runs here.

Why: a benchmark of the pipeline against vLLM needs a generator that batches continuously
and saturates like vLLM does (sequences join and leave a running batch at step boundaries,
a KV budget holds requests back), so that what the pipeline fails to keep in flight shows
up as engine capacity left unused. fixed-latency-vlm, beside it, models static batching.

The interface is exactly the vLLM backend's, as its ``create_response`` answers a client
(decoupled; ``text_input`` = the rendered chat prompt, ``image`` = base64 of the encoded
image, ``sampling_parameters`` JSON, ``stream``, ``exclude_input_in_output`` and the
``return_*`` flags). A request of ``n`` outputs (sampling ``n``, default 1, at most
MAX_N) has one element per output in every response: ``text_output`` [n],
``finish_reason`` [n], ``num_output_tokens`` [n] (UINT32), and ``num_input_tokens`` [1].
Without ``exclude_input_in_output`` true each text is prompt + output, as vLLM prepends it.

- Not streaming: ONE final response, when the last of its outputs finished, carrying the
  whole outputs.
- Streaming (``stream`` true; ``exclude_input_in_output`` false is refused, as the real
  backend refuses it; absent means true there too): one response every
  ``stream_interval_ms`` while any output has new tokens, each carrying per output the text
  and tokens generated since the previous response ("" and 0 for one with nothing new) and
  its finish_reason ("None" until it finished); the last one, when every output finished,
  carries the final deltas and is flagged FINAL. An output's deltas add up to exactly its
  non-streamed text (engine.prefix_chars).
- Cancellation: a streaming request whose client cancelled (``sender.is_cancelled()``,
  looked at every tick and before each send) is aborted in the engine (its sequences leave
  the batch and free their KV) and its stream is closed with an empty FINAL response. A
  non-streaming request runs to its end; a cancelled one then gets that empty FINAL only.

Not simulated: logprobs, best_of, and the ``<|image_pad|>`` count check the mimic makes.

The timing is 1/engine.py's (pure, unit-tested); this shell feeds it and answers for it.
``execute`` only parses and queues (decoupled: it returns at once); ONE background thread
wakes on the next completion or preemption, a new arrival, the metrics period, or the
stream interval while a streaming request runs, calls ``advance(now)`` and sends what is
due. Nothing runs per decode step.

What an output gets (deterministic: a random.Random per output, seeded from sha256 of the
seed parameter, the prompt and the image bytes, and the request's own `seed` when it sends
one other than 0, the samples of best-of-n differing as vLLM's seeded samples do; output
i of a request with seed s is drawn with seed s + i, as vLLM's parallel sampling draws it,
so it is what an n = 1 request with seed s + i gets; an unseeded request's output i > 0
hashes the digest with its index):

- Prompt tokens: ceil(utf-8 bytes of text_input / 4) + image_tokens per image.
- Prefill: the request's prompt is prefilled once, by output 0; the other outputs share its
  KV blocks and prefill nothing (the KV budget still charges each its prompt). A prefix
  cache (``prefix_cache_prompts`` entries, LRU, 0: none) remembers sha256(prompt bytes +
  image bytes) of the requests queued: a request whose prompt is there is prefilled for 0
  tokens. Simplified against vLLM's automatic prefix caching: a whole identical prompt hits
  or nothing does (vLLM matches any shared prefix, block by block, and always computes at
  least the last token again), an entry counts from the moment its request is queued (vLLM's
  once its blocks are computed), and entries are evicted by count, not under KV pressure.
- Reasoning: a prompt ending in ``<think>\\n\\n</think>\\n\\n`` (a switch turned off) gets a
  plain answer of a plain_* length; one ending in ``<think>\\n`` (the template opened the
  reasoning) gets reasoning + ``</think>\\n\\n`` + answer; any other gets the same with its
  own ``<think>\\n`` in front. Lengths are think_* lognormal; the reasoning is words drawn
  by the output's rng (engine.Texts: never an exact repetition), about 4 characters a
  token, so responses have a realistic size.
- Length: a PNG tEXt chunk ``standin-tokens`` in the image forces it (tests make one item
  very long); past sampling ``max_tokens`` (vLLM's default 16) the text is cut where the
  budget ends, with no closing tag and no answer, and finish_reason is ``length``.
- Loops: with probability p_loop an output is a repetition loop: 20-200 tokens of reasoning
  (none with reasoning off), then one unit of 40-120 characters (engine.LOOP_UNITS)
  repeated exactly until max_tokens: finish_reason ``length``, no closing tag, no answer.
- Answer: the image's PNG tEXt chunk ``bench-answer`` (``unknown`` without one) with
  probability p_correct, else ``wrong``.

Metrics, on Triton's own /metrics endpoint (Python-backend custom metrics), labelled
``model="vllm-engine-standin"``, published from the loop thread at most every 100 ms while
anything runs and when the engine goes idle: the counters ``rsieve_standin_*_total``
(admitted, finished, generated_tokens, prefill_tokens: tokens actually prefilled,
prefix_cached_tokens, prefill_seconds, busy_seconds, running_seconds, steps, preemptions;
cancelled, cancelled_unused_tokens, loop_outputs, loop_tokens, loop_unused_tokens: see
COUNTERS) and the gauges ``rsieve_standin_running``, ``_waiting``, ``_kv_used_tokens``,
``_kv_budget_tokens``, ``_max_num_seqs`` and ``_peak_decode_tokens_per_s``. The mean
running sequences over a window is the window's running_seconds delta over its length,
exactly; the share of loop tokens a client's cancellation saved is loop_unused_tokens over
loop_tokens.
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
from collections import OrderedDict
from dataclasses import dataclass, field
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
    "p_loop": "0",
    "prefix_cache_prompts": "4096",
    "stream_interval_ms": "50",
    "seed": "0",
}
OPENED = "<think>\n"
CLOSED_EMPTY = "<think>\n\n</think>\n\n"
VLLM_DEFAULT_MAX_TOKENS = 16  # vLLM SamplingParams' default
MAX_N = 64
LOOP_STRETCH_TOKENS = (20, 200)  # the reasoning a loop starts with, drawn uniformly
PUBLISH_S = 0.1
FINAL = 1  # pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, checked in initialize

ENGINE_COUNTERS = {  # metric name -> (engine attribute, help)
    "admitted_total": ("admitted", "admissions to the running batch (re-admissions too)"),
    "finished_total": ("finished", "sequences finished"),
    "generated_tokens_total": ("generated_tokens", "decode tokens generated"),
    "prefill_tokens_total": (
        "prefill_tokens",
        "tokens actually prefilled (again after preemption)",
    ),
    "prefix_cached_tokens_total": (
        "prefix_cached_tokens",
        "prompt tokens not prefilled: prefix-cache hits and the shared prompt of n > 1",
    ),
    "prefill_seconds_total": ("prefill_seconds", "seconds of prefill folded into steps"),
    "busy_seconds_total": ("busy_seconds", "seconds with at least one running sequence"),
    "running_seconds_total": ("running_seconds", "integral of running sequences over time"),
    "steps_total": ("steps", "decode steps"),
    "preemptions_total": ("preemptions", "sequences preempted back to the queue"),
}
SHELL_COUNTERS = {  # metric name -> help; counted here, not by the engine
    "cancelled_total": "streaming requests aborted because their client cancelled",
    "cancelled_unused_tokens_total": "decode tokens the aborted sequences would have generated",
    "loop_outputs_total": "outputs drawn to loop until max_tokens",
    "loop_tokens_total": "tokens the looping outputs were drawn to generate (max_tokens each)",
    "loop_unused_tokens_total": "decode tokens aborted looping outputs did not generate",
    "responses_total": "responses sent (one per request answered whole, one per tick streamed)",
}
COUNTERS = {name: help_ for name, (_, help_) in ENGINE_COUNTERS.items()} | SHELL_COUNTERS
GAUGES = {
    "running": "sequences running now",
    "waiting": "sequences waiting for admission",
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


def _flag(request: Any, name: str) -> bool | None:
    """A BOOL input's value; None when the request does not send it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else None


def _strings(values: list[bytes]) -> Any:
    return np.array(values, dtype=np.object_)


class RequestError(Exception):
    pass


class _Output:
    """One of a request's n outputs: its whole text is fixed when it is queued."""

    __slots__ = ("done", "finish", "loop", "sent_chars", "sent_tokens", "text", "tokens")

    def __init__(self, text: str, tokens: int, finish: str, loop: bool) -> None:
        self.text, self.tokens, self.finish, self.loop = text, tokens, finish, loop
        self.done = False
        self.sent_chars = self.sent_tokens = 0  # streamed so far


@dataclass(slots=True)
class _Request:
    """A queued request; its outputs are the engine's sequences (rid, 0..n-1)."""

    flags: set[str]
    live: int  # outputs not finished yet
    mode: str  # "plain" (reasoning off), "opened" (by the template) or "think"
    prepend: bool  # the prompt goes in front of each text (vLLM's prepend_input)
    prompt: str
    prompt_tokens: int
    sender: Any
    stream: bool
    rid: int = -1
    outputs: list[_Output] = field(default_factory=list)


@dataclass(slots=True)
class _Draw:
    """What _parse drew for one output, before the engine says how long it may be."""

    answer: str
    loop: tuple[int, str] | None  # (reasoning tokens, unit) of a repetition loop
    rng: random.Random
    tokens: int
    truncated: bool


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{NAME} must be decoupled, as vLLM is")
        assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == FINAL
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
        self.p_loop = float(params["p_loop"])
        self.cache_size = int(params["prefix_cache_prompts"])
        self.stream_interval = float(params["stream_interval_ms"]) / 1e3
        if not (0 <= self.p_loop <= 1 and self.cache_size >= 0 and self.stream_interval > 0):
            raise pb_utils.TritonModelException(
                f"{NAME}: p_loop in [0, 1], prefix_cache_prompts >= 0, stream_interval_ms > 0"
            )
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
        self.texts = self.engine_mod.Texts()
        self._prefix_cache: OrderedDict[bytes, None] = OrderedDict()
        self._cond = threading.Condition()
        self._pending: dict[int, _Request] = {}
        self._streaming: set[int] = set()  # the pending requests that stream
        self._next_tick = 0.0
        self._next_id = 0
        self._kicked = self._stopping = False
        self.counts = dict.fromkeys(SHELL_COUNTERS, 0)
        self._init_metrics()
        self._thread = threading.Thread(target=self._loop, name=f"{NAME}-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def _parse(self, request: Any) -> tuple[_Request, list[_Draw], bytes]:
        """The request's record, its outputs' draws and its prompt's prefix-cache key."""
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
        n = params.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
            raise RequestError(f"n must be an integer from 1 to {MAX_N}, not {n!r}")
        stream = bool(_flag(request, "stream"))
        exclude = _flag(request, "exclude_input_in_output")
        if stream and exclude is False:  # the vLLM backend's own check and words
            raise RequestError("When streaming, `exclude_input_in_output` = False is not allowed.")

        base = hashlib.sha256(f"{self.p['seed']}\0".encode() + prompt_bytes)
        for data in images:
            base.update(data)
        seed0 = int(params.get("seed") or 0)

        def output_seed(index: int) -> bytes:
            """Output `index`'s draw: vLLM's parallel sampling draws child i of a seeded
            request with seed + i, so output i is what an n = 1 request with that seed
            gets; an unseeded request's outputs hash the index in."""
            digest = base.copy()
            if seed0:  # a seeded sample (best-of-n) draws its own, as vLLM's does
                digest.update(f"\0seed {seed0 + index}".encode())
            elif index:
                digest.update(b"\0output %d" % index)
            return digest.digest()

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
        chunk_answer = (
            next((png_text(d, b"bench-answer") for d in images if b"bench-answer\0" in d), None)
            or "unknown"
        )
        draws = []
        for index in range(n):
            rng = random.Random(output_seed(index))
            correct = rng.random() < self.p_correct
            if forced is not None and forced.strip().isdigit():
                drawn = max(1, int(forced.strip()))
            else:
                median, p99 = self.lengths["plain" if mode == "plain" else "think"]
                drawn = self.engine_mod.lognormal_tokens(rng, median, p99)
            # Drawn only when loops are on, so that the draws after it stay as they were.
            loop = None
            if self.p_loop > 0 and rng.random() < self.p_loop:
                stretch = 0 if mode == "plain" else rng.randint(*LOOP_STRETCH_TOKENS)
                loop, drawn = (stretch, rng.choice(self.engine_mod.LOOP_UNITS)), max_tokens
            draws.append(
                _Draw(
                    answer=chunk_answer if correct else "wrong",
                    loop=loop,
                    rng=rng,
                    tokens=min(drawn, max_tokens),
                    truncated=drawn > max_tokens or loop is not None,
                )
            )
        flags = {
            f
            for f in ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")
            if _flag(request, f)
        }
        record = _Request(
            flags=flags,
            live=n,
            mode=mode,
            # vLLM prepends the prompt unless excluded; a stream without the flag excludes it.
            prepend=not (exclude if exclude is not None else stream),
            prompt=prompt,
            prompt_tokens=math.ceil(len(prompt_bytes) / 4) + self.image_tokens * len(images),
            sender=request.get_response_sender(),
            stream=stream,
        )
        cache_key = hashlib.sha256(prompt_bytes + b"".join(images)).digest()
        return record, draws, cache_key

    def execute(self, requests: list[Any]) -> None:
        parsed = []
        for request in requests:
            try:
                parsed.append(self._parse(request))
            except Exception as exc:  # noqa: BLE001 - this request's error only
                self._refuse(request.get_response_sender(), exc)
        with self._cond:
            now = time.monotonic()  # one instant: requests handed over together start together
            for req, draws, cache_key in parsed:
                try:
                    self._queue(req, draws, cache_key, now)
                except ValueError as exc:  # a prompt longer than the KV budget
                    self._refuse(req.sender, exc)
            self._kicked = True
            self._cond.notify()
        return None

    @staticmethod
    def _refuse(sender: Any, exc: Exception) -> None:
        sender.send(
            pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(f"{NAME}: {exc}")
            ),
            flags=FINAL,
        )

    def _queue(self, req: _Request, draws: list[_Draw], cache_key: bytes, now: float) -> None:
        """Submit the request's outputs (under the lock); ValueError when it cannot fit."""
        cached = cache_key in self._prefix_cache
        rid, self._next_id = self._next_id, self._next_id + 1
        eng, prompt = self.engine, req.prompt_tokens
        for index, draw in enumerate(draws):
            # Output 0 prefills the prompt unless it is cached; the others share its blocks.
            prefill = 0 if cached or index else prompt
            try:
                accepted = eng.submit((rid, index), prompt, draw.tokens, now, prefill)
            except ValueError:
                for earlier in range(index):  # none in practice: the prompt is the same
                    eng.abort((rid, earlier), now)
                raise
            truncated = draw.truncated or accepted < draw.tokens
            text = self.texts.compose(
                draw.rng,
                # The model opens its reasoning itself unless the template did (or closed it).
                opening=OPENED if req.mode == "think" else "",
                plain=req.mode == "plain",
                answer=draw.answer,
                tokens=accepted,
                truncated=truncated,
                loop=draw.loop,
            )
            req.outputs.append(
                _Output(text, accepted, "length" if truncated else "stop", draw.loop is not None)
            )
            if draw.loop is not None:
                self.counts["loop_outputs_total"] += 1
                self.counts["loop_tokens_total"] += accepted
        if self.cache_size:
            self._prefix_cache[cache_key] = None
            self._prefix_cache.move_to_end(cache_key)
            while len(self._prefix_cache) > self.cache_size:
                self._prefix_cache.popitem(last=False)
        req.rid = rid
        self._pending[rid] = req
        if req.stream:
            if not self._streaming:  # the first tick one interval from now
                self._next_tick = now + self.stream_interval
            self._streaming.add(rid)

    # ------------------------------------------------------------------ responses
    def _whole(self, req: _Request) -> tuple[list[str], list[str], list[int]]:
        """A finished non-streaming request's answer: every output whole."""
        prefix = req.prompt if req.prepend else ""
        return (
            [prefix + o.text for o in req.outputs],
            [o.finish for o in req.outputs],
            [o.tokens for o in req.outputs],
        )

    def _deltas(self, req: _Request) -> tuple[list[str], list[str], list[int]] | None:
        """What a streaming request generated since its last response, marked as sent (under
        the lock); None when no output has a new token."""
        texts, finishes, counts, new = [], [], [], False
        for index, out in enumerate(req.outputs):
            tokens = out.tokens if out.done else self.engine.progress((req.rid, index))
            chars = self.engine_mod.prefix_chars(out.text, out.tokens, tokens)
            texts.append(out.text[out.sent_chars : chars])
            counts.append(tokens - out.sent_tokens)
            finishes.append(out.finish if out.done else "None")  # vLLM's str(None)
            new = new or tokens > out.sent_tokens
            out.sent_chars, out.sent_tokens = chars, tokens
        return (texts, finishes, counts) if new else None

    def _response(
        self, req: _Request, texts: list[str], finishes: list[str], counts: list[int]
    ) -> Any:
        tensors = [pb_utils.Tensor("text_output", _strings([t.encode("utf-8") for t in texts]))]
        if "return_finish_reason" in req.flags:
            tensors.append(
                pb_utils.Tensor("finish_reason", _strings([f.encode() for f in finishes]))
            )
        if "return_num_input_tokens" in req.flags:
            tensors.append(
                pb_utils.Tensor("num_input_tokens", np.array([req.prompt_tokens], np.uint32))
            )
        if "return_num_output_tokens" in req.flags:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array(counts, np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _send(
        self,
        req: _Request,
        answer: tuple[list[str], list[str], list[int]] | None,
        final: bool,
    ) -> bool:
        """Send one response; False (and the stream closed) when the client cancelled."""
        sender = req.sender
        if sender.is_cancelled():  # the client went away: drop the answer, close the stream
            sender.send(flags=FINAL)
            return False
        if answer is not None:
            sender.send(self._response(req, *answer), flags=FINAL if final else 0)
            self.counts["responses_total"] += 1
        elif final:
            sender.send(flags=FINAL)
        return True

    def _abort(self, req: _Request, now: float) -> None:
        """A cancelled streaming request leaves the engine (under the lock)."""
        self._streaming.discard(req.rid)
        unused = 0
        for index, out in enumerate(req.outputs):
            if out.done:
                continue
            left = self.engine.abort((req.rid, index), now)
            unused += left
            if out.loop:
                self.counts["loop_unused_tokens_total"] += left
        self.counts["cancelled_total"] += 1
        self.counts["cancelled_unused_tokens_total"] += unused

    # ------------------------------------------------------------------ the engine loop
    def _loop(self) -> None:
        """Wake on the next engine event, an arrival, the metrics period or (while a request
        streams) the stream interval; never per step."""
        published_at = -math.inf
        while True:
            finals, ticks = [], []
            with self._cond:
                if self._stopping:
                    return
                now = time.monotonic()
                for (rid, index), _ in self.engine.advance(now):
                    req = self._pending.get(rid)
                    if req is None:  # aborted: not reported (Engine.abort), but be safe
                        continue
                    req.outputs[index].done = True
                    req.live -= 1
                    if not req.live:
                        del self._pending[rid]
                        self._streaming.discard(rid)
                        finals.append((req, self._deltas(req) if req.stream else self._whole(req)))
                if self._streaming and now >= self._next_tick:
                    self._next_tick = now + self.stream_interval
                    ticks = [
                        (self._pending[r], self._deltas(self._pending[r])) for r in self._streaming
                    ]
                idle = not self.engine.running and not self.engine.waiting
                stats = None
                if (idle and (finals or self._kicked)) or now - published_at >= PUBLISH_S:
                    stats, published_at = self._stats(), now
                self._kicked = False
            for req, answer in finals:
                self._try_send(req, answer, final=True)
            # Streaming requests whose client cancelled: looked at on every tick, sent or not.
            cancelled = [req for req, answer in ticks if not self._try_send(req, answer, False)]
            if cancelled:
                with self._cond:
                    now = time.monotonic()
                    for req in cancelled:
                        if self._pending.pop(req.rid, None) is not None:
                            self._abort(req, now)
                    self._kicked = True  # publish the counters at once, even if now idle
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
                if self._streaming:
                    wake = self._next_tick if wake is None else min(wake, self._next_tick)
                self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _try_send(
        self, req: _Request, answer: tuple[list[str], list[str], list[int]] | None, final: bool
    ) -> bool:
        """_send, where one failed send must not stop the loop; False when cancelled."""
        try:
            return self._send(req, answer, final)
        except Exception as exc:  # noqa: BLE001
            pb_utils.Logger.log_warn(f"{NAME}: sending a response failed: {exc}")
            return True

    # ------------------------------------------------------------------ metrics
    def _init_metrics(self) -> None:
        labels = {"model": NAME}
        self._families, self._metrics = [], {}
        for kind, names in (
            (pb_utils.MetricFamily.COUNTER, COUNTERS),
            (pb_utils.MetricFamily.GAUGE, GAUGES),
        ):
            for name, description in names.items():
                family = pb_utils.MetricFamily(
                    name=f"rsieve_standin_{name}", description=f"{NAME}: {description}", kind=kind
                )
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels)
        self._published = dict.fromkeys(COUNTERS, 0.0)
        self._publish(self._stats())

    def _stats(self) -> dict[str, float]:
        eng = self.engine
        stats = {name: float(getattr(eng, attr)) for name, (attr, _) in ENGINE_COUNTERS.items()}
        stats.update({name: float(value) for name, value in self.counts.items()})
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
        for req in pending:  # unloaded mid-generation: vLLM's word for it is "abort"
            n = len(req.outputs)
            answer = ([req.prompt if req.prepend else ""] * n, ["abort"] * n, [0] * n)
            try:
                self._send(req, answer, final=True)
            except Exception:  # noqa: BLE001 - the client may be gone already
                pass
        self._metrics.clear()  # each Metric before its MetricFamily, as Triton requires
        self._families.clear()
