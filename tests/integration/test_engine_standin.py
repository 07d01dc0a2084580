"""bench/triton_models/vllm-engine-standin on a real tritonserver, asked exactly as rsieve's
client asks Triton's vLLM backend (TritonModel, vLLM interface, a Qwen-style template):
answers, finish reasons and token counts, the PNG chunks that choose the answer and force a
length, and the stand-in's custom metrics on Triton's metrics port, with running sequences
never above max_num_seqs. And as a streaming vLLM client asks it (tritonclient's gRPC
stream): n outputs sharing one prefill, the prefix cache, streamed deltas that add up to
the whole text, a cancelled stream aborted in the engine, and (a second server, p_loop 1)
outputs that loop to max_tokens."""

from __future__ import annotations

import base64
import io
import itertools
import json
import math
import queue
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from rsieve.adapters.model import ModelReply, ModelRequest, TritonModel
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.generate.loops import LoopRule
from rsieve.generate.think import parse_output
from rsieve_cli.local.triton_server import triton_on_free_ports
from tests.templates import build_tokenizer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "bench" / "triton_models" / "vllm-engine-standin"
NAME = "vllm-engine-standin"
SEQS = 4
OPENED = "<think>\n"
STEP_S = 0.020  # step_base_ms 20, step_per_seq_ms 0: a sequence of L tokens takes L steps
ENV = {
    "RSIEVE_STANDIN_MAX_NUM_SEQS": str(SEQS),
    "RSIEVE_STANDIN_STEP_BASE_MS": "20",
    "RSIEVE_STANDIN_STEP_PER_SEQ_MS": "0",
    "RSIEVE_STANDIN_PREFILL_MS_PER_TOKEN": "0",
    "RSIEVE_STANDIN_IMAGE_TOKENS": "16",
    "RSIEVE_STANDIN_THINK_MEDIAN_TOKENS": "6",
    "RSIEVE_STANDIN_THINK_P99_TOKENS": "20",
    "RSIEVE_STANDIN_PLAIN_MEDIAN_TOKENS": "2",
    "RSIEVE_STANDIN_PLAIN_P99_TOKENS": "4",
    "RSIEVE_STANDIN_P_CORRECT": "0.5",
}


@dataclass(frozen=True)
class Server:
    grpc: str
    metrics: str


@contextmanager
def serve(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("triton-standin")
    repo = root / "models"
    shutil.copytree(STANDIN, repo / NAME)
    # The client reads the served config's max_num_seqs as the engine's capacity, and Triton
    # serves the file's parameters whatever the environment says: the copy says 4 as well.
    config = repo / NAME / "config.pbtxt"
    text = config.read_text()
    pattern = r'(key: "max_num_seqs"\s*value: \{ string_value: ")256(")'
    assert re.search(pattern, text)
    config.write_text(re.sub(pattern, rf"\g<1>{SEQS}\g<2>", text))
    with triton_on_free_ports(
        repo, log=root / "triton.log", ready=[NAME], env_extra=env, timeout_s=60
    ) as triton:
        yield Server(triton.grpc_url, triton.metrics_url)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory, ENV) as running:
        yield running


@pytest.fixture(scope="module")
def loop_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Every output a loop: its own server, started only for the test that needs it, with
    2 ms steps (a loop shows its 4 repeats after up to 200 tokens of reasoning)."""
    env = {**ENV, "RSIEVE_STANDIN_P_LOOP": "1", "RSIEVE_STANDIN_STEP_BASE_MS": "2"}
    with serve(tmp_path_factory, env) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("tok")
    return {
        name: str(build_tokenizer(out / name, name))
        for name in ("qwen3_vl_thinking", "qwen3_switch", "qwen2_5_vl")
    }


def png(answer: str | None = None, tokens: int | None = None) -> bytes:
    info = PngInfo()
    if answer is not None:
        info.add_text("bench-answer", answer)
    if tokens is not None:
        info.add_text("standin-tokens", str(tokens))
    buf = io.BytesIO()
    Image.new("RGB", (24, 24), "white").save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def ask(model: TritonModel, requests: list[ModelRequest]) -> list[ModelReply]:
    out = model.generate_many(requests)
    assert all(isinstance(r, ModelReply) for r in out), out
    return out  # type: ignore[return-value]


def scrape(url: str) -> dict[str, float]:
    """The rsieve_standin_* samples on Triton's metrics page, by metric name."""
    with urllib.request.urlopen(url, timeout=5) as response:
        page = response.read().decode()
    samples = {}
    for line in page.splitlines():
        match = re.match(r'(rsieve_standin_\w+)\{model="vllm-engine-standin"\} (\S+)$', line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def test_answers_follow_the_png_chunk_with_counts(
    server: Server, tokenizers: dict[str, str]
) -> None:
    tok = tokenizers["qwen3_vl_thinking"]
    model = TritonModel(server.grpc, NAME, interface="vllm", max_new_tokens=64, tokenizer=tok)
    words = [f"WORD{i}" for i in range(16)]
    got = ask(model, [ModelRequest("Read the word.", png(w)) for w in words])
    assert model.info is not None and model.info.kind == "stand-in"
    chat = load_chat_template(tok).render("Read the word.", has_image=True)
    prompt_tokens = math.ceil(len(chat.text.encode()) / 4) + 16
    answers = []
    for word, reply in zip(words, got, strict=True):
        parsed = parse_output(reply.text, reply.finish_reason)
        # The template opened the reasoning; the stand-in does not open it again.
        assert reply.text.startswith("<think>\n") and "</think>" in reply.text
        assert not reply.text.startswith("<think>\n<think>")
        assert (reply.finish_reason, parsed.failure) == ("stop", None)
        assert parsed.answer in {word, "wrong"}
        assert reply.input_tokens == prompt_tokens
        assert reply.output_tokens is not None and 1 <= reply.output_tokens <= 64
        answers.append(parsed.answer == word)
    assert 0 < sum(answers) < len(answers)  # p_correct 0.5: both kinds
    again = ask(model, [ModelRequest("Read the word.", png(w)) for w in words])
    assert [r.text for r in again] == [r.text for r in got]  # deterministic per request
    # No chunk: the right answer is "unknown".
    plain = ask(model, [ModelRequest(f"Read {i}.", png()) for i in range(8)])
    assert {parse_output(r.text).answer for r in plain} <= {"unknown", "wrong"}
    assert "unknown" in {parse_output(r.text).answer for r in plain}


def test_forced_length_and_the_budget(server: Server, tokenizers: dict[str, str]) -> None:
    model = TritonModel(
        server.grpc,
        NAME,
        interface="vllm",
        max_new_tokens=64,
        tokenizer=tokenizers["qwen3_vl_thinking"],
    )
    fits, cut = ask(
        model,
        [ModelRequest("Read.", png("OK", tokens=40)), ModelRequest("Read.", png("OK", tokens=500))],
    )
    assert (fits.finish_reason, fits.output_tokens) == ("stop", 40)
    assert (cut.finish_reason, cut.output_tokens) == ("length", 64)
    assert "</think>" not in cut.text  # cut inside the reasoning: no answer
    assert parse_output(cut.text, cut.finish_reason).failure == "truncated_reasoning"
    assert abs(len(cut.text) - 4 * 64) < 16  # about 4 characters a token


def test_reasoning_follows_the_rendered_prompt(server: Server, tokenizers: dict[str, str]) -> None:
    off = TritonModel(
        server.grpc,
        NAME,
        interface="vllm",
        max_new_tokens=64,
        tokenizer=tokenizers["qwen3_switch"],
        reasoning=False,
    )
    reply = ask(off, [ModelRequest("Read.", png("OFF"))])[0]
    # The template closed an empty think block: a plain answer of a plain length.
    assert reply.text.startswith("<think>\n\n</think>\n\n")
    assert reply.text.removeprefix("<think>\n\n</think>\n\n") in {"OFF", "wrong"}
    assert reply.output_tokens is not None and reply.output_tokens <= 12
    bare = TritonModel(
        server.grpc, NAME, interface="vllm", max_new_tokens=64, tokenizer=tokenizers["qwen2_5_vl"]
    )
    reply = ask(bare, [ModelRequest("Read.", png("BARE", tokens=30))])[0]
    assert reply.text.startswith("<think>\n")  # the stand-in opens it itself
    assert parse_output(reply.text).answer in {"BARE", "wrong"}


def test_served_config_carries_the_capacity(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        config = client.get_model_config(NAME, as_json=True)["config"]
    finally:
        client.close()
    served = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert (served["max_num_seqs"], served["rsieve_kind"]) == (str(SEQS), "stand-in")
    assert config["model_transaction_policy"]["decoupled"] is True


def test_continuous_batching_is_capped_and_measured(
    server: Server, tokenizers: dict[str, str]
) -> None:
    model = TritonModel(
        server.grpc,
        NAME,
        interface="vllm",
        max_new_tokens=64,
        max_inflight=16,
        tokenizer=tokenizers["qwen3_vl_thinking"],
    )
    before = scrape(server.metrics)
    assert before["rsieve_standin_max_num_seqs"] == SEQS
    assert before["rsieve_standin_peak_decode_tokens_per_s"] == pytest.approx(SEQS / STEP_S)
    seen: list[dict[str, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(scrape(server.metrics))
            time.sleep(0.03)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.monotonic()
    try:
        # 12 sequences of 15 tokens, 4 at a time: 3 waves of 15 steps of 20 ms.
        got = ask(model, [ModelRequest(f"Item {i}.", png("X", tokens=15)) for i in range(12)])
    finally:
        elapsed = time.monotonic() - start
        # The loop publishes on going idle: the sampler runs until it has.
        after = settled(
            server,
            lambda m: (
                m["rsieve_standin_running"] == 0
                and m["rsieve_standin_finished_total"] - before["rsieve_standin_finished_total"]
                >= 12
            ),
        )
        stop.set()
        sampler.join()
    assert all(r.output_tokens == 15 for r in got)
    assert elapsed >= 3 * 15 * STEP_S * 0.95
    running = [s["rsieve_standin_running"] for s in seen]
    assert max(running) == SEQS and all(r <= SEQS for r in running)
    assert max(s["rsieve_standin_waiting"] for s in seen) > 0
    delta = {k: after[k] - before[k] for k in after}
    assert delta["rsieve_standin_finished_total"] == 12
    assert delta["rsieve_standin_generated_tokens_total"] == 12 * 15
    # 3 waves of 15 steps, give or take the steps a late arrival ran short of company.
    assert 45 <= delta["rsieve_standin_steps_total"] <= 50
    # Every step lasts 20 ms and gives each running sequence a token: the integral of
    # running over time is the tokens times 20 ms, and busy time is the steps times 20 ms.
    assert delta["rsieve_standin_running_seconds_total"] == pytest.approx(
        delta["rsieve_standin_generated_tokens_total"] * STEP_S, rel=1e-6
    )
    assert delta["rsieve_standin_busy_seconds_total"] == pytest.approx(
        delta["rsieve_standin_steps_total"] * STEP_S, rel=1e-6
    )
    assert after["rsieve_standin_running"] == after["rsieve_standin_waiting"] == 0


# ---------------------------------------------------------------------- a vLLM client's view
def _bool(name: str, value: bool) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def _bytes(name: str, value: bytes) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value], dtype=np.object_))
    return tensor


def vllm_inputs(
    prompt: str, image: bytes, *, stream: bool = False, **sampling: Any
) -> list[grpcclient.InferInput]:
    """A request as Triton's vLLM backend takes it, every return_* flag on."""
    return [
        _bytes("text_input", prompt.encode()),
        _bytes("image", base64.b64encode(image)),
        _bool("stream", stream),
        _bytes("sampling_parameters", json.dumps({"max_tokens": 64, **sampling}).encode()),
        _bool("exclude_input_in_output", True),
        *(
            _bool(f"return_{name}", True)
            for name in ("finish_reason", "num_input_tokens", "num_output_tokens")
        ),
    ]


@dataclass
class Response:
    texts: list[str]
    finish: list[str]
    tokens: list[int]
    input_tokens: int
    final: bool
    at: float


class Stream:
    """One gRPC bidirectional stream to the model; responses in arrival order."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc)
        self.queue: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.queue.put((result, error, time.monotonic()))
        )

    def send(self, inputs: list[grpcclient.InferInput], request_id: str) -> None:
        self.client.async_stream_infer(
            NAME, inputs, request_id=request_id, enable_empty_final_response=True
        )

    def next(self, timeout: float = 10.0) -> Response:
        result, error, at = self.queue.get(timeout=timeout)
        if error is not None:
            raise error
        final = result.get_response().parameters["triton_final_response"].bool_param
        if result.as_numpy("text_output") is None:  # an empty final response
            return Response([], [], [], 0, final, at)
        return Response(
            texts=[t.decode() for t in result.as_numpy("text_output")],
            finish=[f.decode() for f in result.as_numpy("finish_reason")],
            tokens=[int(n) for n in result.as_numpy("num_output_tokens")],
            input_tokens=int(result.as_numpy("num_input_tokens").reshape(-1)[0]),
            final=final,
            at=at,
        )

    def until_final(self) -> list[Response]:
        out = [self.next()]
        while not out[-1].final:
            out.append(self.next())
        return out

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@contextmanager
def stream_to(server: Server) -> Iterator[Stream]:
    stream = Stream(server)
    try:
        yield stream
    finally:
        stream.close()


def ask_one(server: Server, inputs: list[grpcclient.InferInput]) -> list[Response]:
    with stream_to(server) as stream:
        stream.send(inputs, "one")
        return stream.until_final()


def settled(
    server: Server, check: Callable[[dict[str, float]], bool], timeout: float = 5.0
) -> dict[str, float]:
    """The metrics once `check` holds of them (they are published from the engine's loop,
    just after the responses it sends)."""
    deadline = time.monotonic() + timeout
    while True:
        now = scrape(server.metrics)
        if check(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def prompt_tokens_of(prompt: str) -> int:
    return math.ceil(len(prompt.encode()) / 4) + 16  # ENV: 16 image tokens


def test_n_outputs_come_in_one_response_after_one_prefill(server: Server) -> None:
    prompt = "<|im_start|>user\nRead it, four times.<|im_end|>\n<think>\n"
    before = scrape(server.metrics)
    (reply,) = ask_one(server, vllm_inputs(prompt, png("N4"), n=4))
    after = settled(
        server,
        lambda m: m["rsieve_standin_finished_total"] - before["rsieve_standin_finished_total"] >= 4,
    )
    assert reply.final and len(reply.texts) == len(reply.finish) == len(reply.tokens) == 4
    assert reply.input_tokens == prompt_tokens_of(prompt)
    assert len(set(reply.texts)) == 4  # each output draws its own text
    assert all(f == "stop" for f in reply.finish) and all(1 <= n <= 64 for n in reply.tokens)
    assert {parse_output(OPENED + t).answer for t in reply.texts} <= {"N4", "wrong"}
    delta = {k: after[k] - before[k] for k in after}
    assert delta["rsieve_standin_finished_total"] == 4
    assert delta["rsieve_standin_generated_tokens_total"] == sum(reply.tokens)
    # Prefilled once; the other three outputs share its blocks.
    assert delta["rsieve_standin_prefill_tokens_total"] == prompt_tokens_of(prompt)
    assert delta["rsieve_standin_prefix_cached_tokens_total"] == 3 * prompt_tokens_of(prompt)
    # Output 0 is what the same request with n = 1 gets.
    (single,) = ask_one(server, vllm_inputs(prompt, png("N4")))
    assert single.texts == reply.texts[:1] and single.tokens == reply.tokens[:1]
    with pytest.raises(Exception, match="n must be an integer from 1 to 64"):
        ask_one(server, vllm_inputs(prompt, png("N4"), n=65))


def test_the_same_prompt_again_is_served_by_the_prefix_cache(server: Server) -> None:
    prompt = "<|im_start|>user\nRead it twice.<|im_end|>\n<think>\n"
    image = png("TWICE")
    before = scrape(server.metrics)
    first = ask_one(server, vllm_inputs(prompt, image))
    middle = settled(
        server,
        lambda m: m["rsieve_standin_finished_total"] > before["rsieve_standin_finished_total"],
    )
    again = ask_one(server, vllm_inputs(prompt, image))
    after = settled(
        server,
        lambda m: m["rsieve_standin_finished_total"] > middle["rsieve_standin_finished_total"],
    )
    assert first[0].texts == again[0].texts
    tokens = prompt_tokens_of(prompt)
    key = "rsieve_standin_prefill_tokens_total"
    cached = "rsieve_standin_prefix_cached_tokens_total"
    assert (middle[key] - before[key], middle[cached] - before[cached]) == (tokens, 0)
    assert (after[key] - middle[key], after[cached] - middle[cached]) == (0, tokens)
    # Another image is another prompt: prefilled again.
    ask_one(server, vllm_inputs(prompt, png("OTHER")))
    last = settled(
        server,
        lambda m: m["rsieve_standin_finished_total"] > after["rsieve_standin_finished_total"],
    )
    assert (last[key] - after[key], last[cached] - after[cached]) == (tokens, 0)


def test_streamed_deltas_add_up_to_the_whole_text_and_end_final(server: Server) -> None:
    prompt = "<|im_start|>user\nStream it.<|im_end|>\n<think>\n"
    image = png("STREAM", tokens=40)  # 40 steps of 20 ms: about 16 intervals of 50 ms
    (whole,) = ask_one(server, vllm_inputs(prompt, image, n=2))
    start = time.monotonic()
    streamed = ask_one(server, vllm_inputs(prompt, image, n=2, stream=True))
    assert whole.tokens == [40, 40] and whole.finish == ["stop", "stop"]
    assert 8 <= len(streamed) <= 25
    assert [r.final for r in streamed] == [False] * (len(streamed) - 1) + [True]
    for index in range(2):
        assert "".join(r.texts[index] for r in streamed) == whole.texts[index]
        assert sum(r.tokens[index] for r in streamed) == 40
        assert [r.finish[index] for r in streamed] == ["None"] * (len(streamed) - 1) + ["stop"]
    # A response carries news, and one comes every 50 ms or so (the last: at the finish).
    assert all(sum(r.tokens) > 0 for r in streamed)
    gaps = [b.at - a.at for a, b in itertools.pairwise(streamed)]
    assert streamed[0].at - start < 0.3 and max(gaps) < 0.3
    # The prompt may not be prepended to a stream, as vLLM's backend says.
    inputs = vllm_inputs(prompt, image, stream=True)
    inputs[4] = _bool("exclude_input_in_output", False)
    with pytest.raises(Exception, match="When streaming"):
        ask_one(server, inputs)


def test_a_cancelled_stream_is_aborted_in_the_engine(server: Server) -> None:
    prompt = "<|im_start|>user\nStream it long.<|im_end|>\n<think>\n"
    before = scrape(server.metrics)
    stream = Stream(server)
    try:
        # 500 tokens: 10 s at 20 ms a step, if it ran to its end.
        stream.send(vllm_inputs(prompt, png("LONG", tokens=500), stream=True, max_tokens=1000), "x")
        got = [stream.next(), stream.next(), stream.next()]
    finally:
        cancelled_at = time.monotonic()
        stream.close(cancel=True)
    assert not any(r.final for r in got)
    generated = sum(r.tokens[0] for r in got)
    assert 0 < generated < 100
    after = settled(
        server,
        lambda m: (
            m["rsieve_standin_cancelled_total"] > before["rsieve_standin_cancelled_total"]
            and m["rsieve_standin_running"] == 0
        ),
    )
    assert time.monotonic() - cancelled_at < 2.0  # not the 9 s left
    delta = {k: after[k] - before[k] for k in after}
    assert delta["rsieve_standin_cancelled_total"] == 1
    assert after["rsieve_standin_running"] == after["rsieve_standin_waiting"] == 0
    assert after["rsieve_standin_kv_used_tokens"] == 0
    # What it did not generate is counted: most of its 500 tokens.
    unused = delta["rsieve_standin_cancelled_unused_tokens_total"]
    assert 400 <= unused <= 500 - generated
    assert delta["rsieve_standin_generated_tokens_total"] == 500 - unused
    assert delta["rsieve_standin_finished_total"] == 0
    assert delta["rsieve_standin_loop_unused_tokens_total"] == 0  # p_loop 0 here


def ends_in_loop(text: str) -> bool:
    """One unit of at most 512 characters repeated 4 times or more, exactly, at the end."""
    return any(text.endswith(text[-u:] * 4) for u in range(1, min(512, len(text) // 4) + 1))


def test_with_p_loop_1_an_output_repeats_one_unit_until_max_tokens(loop_server: Server) -> None:
    prompt = "<|im_start|>user\nLoop.<|im_end|>\n<think>\n"
    before = scrape(loop_server.metrics)
    # 400 tokens: up to 200 of reasoning first, then at least 4 repeats of a unit.
    (reply,) = ask_one(loop_server, vllm_inputs(prompt, png("LOOP"), n=2, max_tokens=400))
    assert reply.finish == ["length", "length"] and reply.tokens == [400, 400]
    for text in reply.texts:
        assert "</think>" not in text and "LOOP" not in text
        assert ends_in_loop(text) and len(text) == 4 * 400
        assert not ends_in_loop(text[:80])  # it reasoned before it looped
    after = settled(
        loop_server,
        lambda m: m["rsieve_standin_finished_total"] - before["rsieve_standin_finished_total"] >= 2,
    )
    delta = {k: after[k] - before[k] for k in after}
    assert delta["rsieve_standin_loop_outputs_total"] == 2
    assert delta["rsieve_standin_loop_tokens_total"] == 800
    # A loop cancelled while it streams: its unused tokens are the loop's saving too.
    stream = Stream(loop_server)
    try:
        stream.send(vllm_inputs(prompt, png("LOOP2"), stream=True, max_tokens=2000), "loop")
        got = [stream.next(), stream.next()]
    finally:
        stream.close(cancel=True)
    done = settled(
        loop_server,
        lambda m: (
            m["rsieve_standin_cancelled_total"] > after["rsieve_standin_cancelled_total"]
            and m["rsieve_standin_running"] == 0
        ),
    )
    unused = (
        done["rsieve_standin_loop_unused_tokens_total"]
        - after["rsieve_standin_loop_unused_tokens_total"]
    )
    assert unused == (
        done["rsieve_standin_cancelled_unused_tokens_total"]
        - after["rsieve_standin_cancelled_unused_tokens_total"]
    )
    assert 1500 <= unused <= 2000 - sum(r.tokens[0] for r in got)  # 2 ms steps
    assert (
        done["rsieve_standin_loop_tokens_total"] - after["rsieve_standin_loop_tokens_total"] == 2000
    )


# --------------------------------------------------------------------------- rsieve's client


def test_rsieve_sends_an_items_round_as_one_request_with_n(
    server: Server, tokenizers: dict[str, str]
) -> None:
    """An item's samples of one round through rsieve's client, loop watching off: one
    request with n = 4 (one prefill), four replies, output j recorded with seed s + j, each
    what a single request with that seed gets."""
    tok = tokenizers["qwen3_vl_thinking"]
    model = TritonModel(server.grpc, NAME, interface="vllm", max_new_tokens=64, tokenizer=tok)
    image = png("ROUND")
    before = scrape(server.metrics)
    got = ask(model, [ModelRequest("Read the word.", image, seed=500, seeds=(9, 10, 11))])
    after = settled(
        server,
        lambda m: m["rsieve_standin_finished_total"] - before["rsieve_standin_finished_total"] >= 4,
    )
    assert [r.seed for r in got] == [500, 501, 502, 503]
    delta = {k: after[k] - before[k] for k in after}
    prompt = load_chat_template(tok).render("Read the word.", has_image=True).text
    assert delta["rsieve_standin_prefill_tokens_total"] == prompt_tokens_of(prompt)
    assert delta["rsieve_standin_prefix_cached_tokens_total"] == 3 * prompt_tokens_of(prompt)
    singles = ask(model, [ModelRequest("Read the word.", image, seed=500 + j) for j in range(4)])
    assert [r.text for r in singles] == [r.text for r in got]
    assert [r.output_tokens for r in singles] == [r.output_tokens for r in got]


def test_rsieve_cuts_a_looping_stream_and_records_it(
    loop_server: Server, tokenizers: dict[str, str]
) -> None:
    """Loop watching on: each sample streams; a loop is cancelled once its tail repeats
    (rsieve.generate.loops), the engine aborts it, and the reply says repetition_loop with
    the tokens generated so far, far short of the budget."""
    model = TritonModel(
        loop_server.grpc,
        NAME,
        interface="vllm",
        max_new_tokens=4000,
        tokenizer=tokenizers["qwen3_vl_thinking"],
        loops=LoopRule(),
    )
    before = scrape(loop_server.metrics)
    got = ask(model, [ModelRequest("Read.", png("CUT"), seed=s) for s in (1, 2)])
    for reply in got:
        assert reply.finish_reason == "repetition_loop"
        assert parse_output(reply.text, reply.finish_reason).failure == "repetition_loop"
        assert reply.output_tokens is not None and reply.output_tokens < 1000
        assert ends_in_loop(reply.text.rstrip()) or ends_in_loop(reply.text)
    done = settled(
        loop_server,
        lambda m: (
            m["rsieve_standin_cancelled_total"] - before["rsieve_standin_cancelled_total"] >= 2
            and m["rsieve_standin_running"] == 0
        ),
    )
    saved = (
        done["rsieve_standin_loop_unused_tokens_total"]
        - before["rsieve_standin_loop_unused_tokens_total"]
    )
    assert saved >= 2 * 4000 - sum(r.output_tokens or 0 for r in got) - 2 * 50


def test_a_cut_sample_on_a_pooled_stream_aborts_only_itself(server: Server) -> None:
    """The generator's stream pool (rsieve.adapters.streams.StreamPool) on real Triton: A is
    answered whole on a stream, B reuses that stream and is cut after two responses (as a
    loop is) while E streams on a stream of its own, then C and D come on: the engine aborts
    B alone, A, E, C and D arrive whole (their deltas add up to what a whole answer gives),
    and the cut stream is never used again: C and D reuse E's."""
    import asyncio

    import tritonclient.grpc.aio as aioclient

    from rsieve.adapters.streams import StreamPool

    prompt = "<|im_start|>user\nStream it.<|im_end|>\n<think>\n"
    names = ["text_output", "finish_reason", "num_output_tokens"]

    def inputs(word: str, stream: bool = True, tokens: int = 30) -> list[Any]:
        return vllm_inputs(prompt, png(word, tokens=tokens), stream=stream, max_tokens=600)

    lengths = {"A": 30, "E": 60, "C": 30, "D": 30}
    whole = {
        w: "".join(r.texts[0] for r in ask_one(server, inputs(w, stream=False, tokens=n)))
        for w, n in lengths.items()
    }
    before = scrape(server.metrics)

    async def scenario() -> tuple[dict[str, str], dict[str, int], list[str]]:
        client = aioclient.InferenceServerClient(server.grpc)
        pool = StreamPool(client, NAME)
        outputs = [aioclient.InferRequestedOutput(n) for n in names]

        async def whole_of(word: str) -> str:
            async with pool.streamed(inputs(word, tokens=lengths[word]), outputs) as responses:
                return "".join([str(r.get("text_output", "")) async for r in responses])

        async def cut() -> list[str]:
            async with pool.streamed(inputs("B", tokens=500), outputs) as responses:
                return [str((await anext(responses)).get("finish_reason")) for _ in range(2)]

        try:
            got = {"A": await whole_of("A")}
            b, got["E"] = await asyncio.gather(cut(), whole_of("E"))
            got["C"] = await whole_of("C")
            got["D"] = await whole_of("D")
            return got, {"opened": pool.opened, "reused": pool.reused}, b
        finally:
            await pool.close()
            await client.close()

    got, figures, b = asyncio.run(scenario())
    assert got == whole
    assert b == ["None", "None"]  # B was cut while it ran
    # A's stream carried B and went with it; E opened one, which C and D reused.
    assert figures == {"opened": 2, "reused": 3}
    after = settled(
        server,
        lambda m: (
            m["rsieve_standin_cancelled_total"] > before["rsieve_standin_cancelled_total"]
            and m["rsieve_standin_running"] == 0
        ),
    )
    delta = {k: after[k] - before[k] for k in after}
    assert delta["rsieve_standin_cancelled_total"] == 1
    assert delta["rsieve_standin_finished_total"] == 4
