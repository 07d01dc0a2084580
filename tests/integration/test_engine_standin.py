"""bench/triton_models/vllm-engine-standin on a real tritonserver, asked exactly as rsieve's
client asks Triton's vLLM backend (TritonModel, vLLM interface, a Qwen-style template):
answers, finish reasons and token counts, the PNG chunks that choose the answer and force a
length, and the stand-in's custom metrics on Triton's metrics port, with running sequences
never above max_num_seqs."""

from __future__ import annotations

import io
import math
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from rsieve.adapters.model import ModelReply, ModelRequest, TritonModel
from rsieve.adapters.tokenizer import load_chat_template
from rsieve.generate.think import parse_output
from rsieve_cli.local import processes, triton_server
from rsieve_cli.local.ports import free_port
from tests.templates import build_tokenizer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "bench" / "triton_models" / "vllm-engine-standin"
NAME = "vllm-engine-standin"
SEQS = 4
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
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
    http, grpc_port, metrics = (free_port() for _ in range(3))
    log = root / "triton.log"
    proc = triton_server.start_triton(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc_port,
        metrics_port=metrics,
        log=log,
        env_extra=ENV,
    )
    try:
        triton_server.wait_triton(http, [NAME], 60, proc=proc, log=log)
        yield Server(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics}/metrics")
    finally:
        processes.stop(proc)


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
        time.sleep(0.15)  # the loop publishes on going idle
        stop.set()
        sampler.join()
    after = scrape(server.metrics)
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
