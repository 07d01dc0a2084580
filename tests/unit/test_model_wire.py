"""The wires of the model adapters without a server: Triton's metadata read, the rsieve and
vLLM interfaces' tensors and how their answers are read (rsieve.adapters.triton_wire,
vllm_wire), the chat completions body and stream (openai_wire), and what each role asks
(rsieve.adapters.roles). The adapters against servers: test_openai_model (an in-process
endpoint), tests/integration/test_generator_models and test_engine_standin (Triton)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rsieve.adapters.openai_wire import (
    EndpointError,
    EventReader,
    Refusal,
    chat_body,
    listing_problem,
    refuses_stream_options,
    stream_body,
    streamed_reply,
)
from rsieve.adapters.retry import Transient
from rsieve.adapters.roles import role_choice
from rsieve.adapters.triton_wire import (
    MalformedReply,
    Served,
    in_order,
    items_per_request,
    read_served,
    rsieve_replies,
    rsieve_request,
)
from rsieve.adapters.vllm_wire import (
    StreamedReply,
    fixed_inputs,
    vllm_request,
    vllm_sampling,
    whole_replies,
)
from rsieve.generate.chat import RenderedChat
from rsieve.generate.generation import ModelReply, ModelRequest
from rsieve.generate.loops import LoopRule, LoopWatch
from rsieve.generate.think import LOOP_FINISH
from rsieve.settings import Settings

VLLM_META = {
    "versions": ["1", "3"],
    "inputs": [
        {"name": n}
        for n in ("text_input", "image", "stream", "sampling_parameters", "return_finish_reason")
    ],
    "outputs": [{"name": "text_output"}, {"name": "finish_reason"}],
}


class Result:
    """A result read as tritonclient's InferResult is: by output name."""

    def __init__(self, **outputs: list[Any]) -> None:
        self.outputs = {k: np.array(v, dtype=np.object_) for k, v in outputs.items()}

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self.outputs.get(name)


def rsieve_served(*inputs: str, batch: int = 8) -> Served:
    meta = {
        "inputs": [{"name": n} for n in ("prompt", "image", *inputs)],
        "outputs": [{"name": n} for n in ("text", "finish_reason", "num_output_tokens")],
    }
    return read_served(meta, {"max_batch_size": batch}, "auto")


def sent(tensors: list[Any]) -> dict[str, Any]:
    return {t.name(): (t.datatype(), t.shape()) for t in tensors}


# --------------------------------------------------------------------------- Triton
def test_the_interface_capacity_and_kind_are_read_from_metadata_and_config() -> None:
    config = {
        "parameters": {
            "rsieve_kind": {"string_value": "vlm"},
            "max_num_seqs": {"string_value": "64"},
        }
    }
    served = read_served(VLLM_META, config, "auto")
    assert (served.interface, served.version, served.kind, served.capacity) == (
        "vllm",
        "3",
        "vlm",
        64,
    )
    assert read_served(VLLM_META, {}, "rsieve").interface == "rsieve"  # as configured
    assert read_served({}, {"parameters": {"max_num_seqs": {"string_value": "x"}}}, "auto") == (
        Served(frozenset(), frozenset(), "rsieve", "", None, None, 0)
    )


def test_an_rsieve_request_sends_only_what_the_model_declares() -> None:
    reqs = [ModelRequest("a", b"i", seed=5), ModelRequest("b", b"j")]
    bare, names = rsieve_request(
        rsieve_served(), ["a", "b"], reqs, max_new_tokens=9, temperature=0.7, seed=3
    )
    assert sent(bare) == {"prompt": ("BYTES", [2, 1]), "image": ("BYTES", [2, 1])}
    assert names == ["text", "finish_reason", "num_output_tokens"]
    full, _ = rsieve_request(
        rsieve_served("max_new_tokens", "temperature", "seed"),
        ["a", "b"],
        reqs,
        max_new_tokens=9,
        temperature=0.7,
        seed=3,
    )
    assert sent(full)["seed"] == ("INT64", [2, 1])
    assert set(sent(full)) == {"prompt", "image", "max_new_tokens", "temperature", "seed"}


def test_rsieve_rows_are_one_per_item_or_the_reply_is_malformed() -> None:
    names = ["text", "finish_reason", "num_output_tokens"]
    result = Result(text=[[b"x"], [b"y"]], finish_reason=[[b""], [b"length"]])
    replies = rsieve_replies(result, names, ["a", "b"])
    assert [(r.text, r.finish_reason, r.output_tokens) for r in replies] == [
        ("x", "stop", None),
        ("y", "length", None),
    ]
    with pytest.raises(MalformedReply, match="1 rows for 2 items"):
        rsieve_replies(Result(text=[[b"x"]], finish_reason=[[b"stop"]]), names, ["a", "b"])


def test_a_request_carries_up_to_a_batch_on_the_rsieve_interface_only() -> None:
    assert items_per_request(rsieve_served(batch=8), request_items=0, limit=16) == 8
    assert items_per_request(rsieve_served(batch=8), request_items=3, limit=16) == 3
    assert items_per_request(rsieve_served(batch=8), request_items=0, limit=2) == 2
    assert items_per_request(rsieve_served(batch=0), request_items=0, limit=16) == 1
    assert items_per_request(read_served(VLLM_META, {}, "auto"), 0, 16) == 1


def test_replies_come_back_in_request_order_n_each() -> None:
    reqs = [ModelRequest("a", b"i"), ModelRequest("b", seeds=(1,)), ModelRequest("c", b"i")]
    cut = [[0, 2], [1]]

    def reply(text: str) -> ModelReply:
        return ModelReply(text, "stop")

    answers: list[list[ModelReply | Exception]] = [
        [reply("a"), reply("c")],
        [reply("b0"), reply("b1")],
    ]
    assert [r.text for r in in_order(reqs, cut, answers) if isinstance(r, ModelReply)] == [
        "a",
        "b0",
        "b1",
        "c",
    ]


# --------------------------------------------------------------------------- vLLM
def test_a_vllm_request_replaces_only_what_it_changes() -> None:
    served = read_served(VLLM_META, {}, "auto")
    sampling = vllm_sampling(0.0, 1.0, 64, 0)
    assert sampling == {"temperature": 0.0, "n": 1, "max_tokens": 64, "seed": 0}
    fixed = fixed_inputs(sampling, served)
    assert fixed[1] == ["text_output", "finish_reason"]
    plain = vllm_request("<p>", ModelRequest("q"), sampling, fixed, stream=False)
    assert plain[1:] == fixed[0]  # the same tensors, not copies
    best = vllm_request(
        "<p>", ModelRequest("q", b"png", seed=7, seeds=(8,)), sampling, fixed, stream=True
    )
    by_name = {t.name(): t for t in best}
    assert by_name["sampling_parameters"] is not fixed[0][2]
    assert by_name["stream"] is not fixed[0][0] and "image" in by_name


def test_vllm_outputs_are_n_replies_with_their_seeds() -> None:
    chat = RenderedChat(text="<p>", prefix="<think>", user="q")
    req = ModelRequest("q", seed=10, seeds=(11,))
    result = Result(text_output=[b"a", b"b"], finish_reason=[b"stop", b"length"])
    replies = whole_replies(result, ["text_output", "finish_reason"], req, chat)
    assert [(r.text, r.finish_reason, r.seed) for r in replies] == [
        ("<think>a", "stop", 10),
        ("<think>b", "length", 11),
    ]
    with pytest.raises(MalformedReply):
        whole_replies(Result(text_output=[b"a"]), ["text_output"], req, chat)
    with pytest.raises(Transient, match="aborted"):
        whole_replies(
            Result(text_output=[b"a"], finish_reason=[b"abort"]),
            ["text_output", "finish_reason"],
            ModelRequest("q"),
            chat,
        )


def test_a_streamed_sample_adds_its_deltas_and_counts() -> None:
    got = StreamedReply()
    responses: list[dict[str, str | int]] = [
        {
            "text_output": "ab",
            "finish_reason": "None",
            "num_input_tokens": 5,
            "num_output_tokens": 1,
        },
        {
            "text_output": "c",
            "finish_reason": "stop",
            "num_input_tokens": 9,
            "num_output_tokens": 2,
        },
    ]
    for response in responses:
        got.feed(response)
    reply = got.reply(RenderedChat(text="<p>", prefix="", user="q"))
    assert (reply.text, reply.finish_reason, reply.input_tokens, reply.output_tokens) == (
        "abc",
        "stop",
        5,
        3,
    )
    with pytest.raises(Transient, match="without text"):
        StreamedReply().reply(RenderedChat(text="<p>", prefix="", user="q"))


# --------------------------------------------------------------------------- OpenAI
def test_the_body_puts_sampling_over_extra_body_and_the_samples_seed_last() -> None:
    body = chat_body("m", "q", None, {"temperature": 0.0, "seed": 0}, {"seed": 9, "x": 1}, 4)
    assert list(body) == ["seed", "x", "model", "messages", "stream", "temperature"]
    assert (body["seed"], body["stream"], body["messages"][0]["content"]) == (4, False, "q")
    streamed = stream_body(body | {"stream_options": {"a": 1}}, with_options=True)
    assert streamed["stream_options"] == {"a": 1, "include_usage": True}
    assert "stream_options" not in stream_body(streamed, with_options=False)
    assert refuses_stream_options(Refusal(422, "unknown stream_options", None), streamed)
    assert not refuses_stream_options(Refusal(400, "context length", None), streamed)


@pytest.mark.parametrize(
    ("status", "content", "problem"),
    [
        (200, b'{"data": [{"id": "m"}]}', None),
        (200, b'{"data": [{"id": "x"}]}', "the endpoint serves ['x'], not 'm'"),
        (200, b"not json", None),
        (404, b"", None),
        (403, b"", "the endpoint refused the key (HTTP 403)"),
        (502, b"", "HTTP 502"),
    ],
)
def test_the_model_listing(status: int, content: bytes, problem: str | None) -> None:
    assert listing_problem("m", status, content) == problem


def events(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks
    )


def test_a_stream_is_read_across_any_split_of_its_bytes() -> None:
    raw = events(
        {"model": "org/m-1", "choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        "[DONE]",
    )
    for size in (1, 7, len(raw)):
        served: list[object] = []
        reader = EventReader(LoopWatch(LoopRule()), max_chars=1000, served=served.append)
        over = any(reader.feed(raw[at : at + size]) for at in range(0, len(raw), size))
        reply = streamed_reply(reader.got if over else reader.end(), "q", 0.0)
        assert (reply.text, reply.finish_reason, reply.input_tokens, reply.output_tokens) == (
            "<think>r</think>ok",
            "stop",
            3,
            2,
        )
        assert served[0] == "org/m-1"


def test_a_stream_cut_in_a_loop_or_past_its_bounds() -> None:
    rule = LoopRule(window_chars=400, min_chars=40, every_chars=1)
    reader = EventReader(LoopWatch(rule), max_chars=10_000, served=lambda _: None)
    delta = {"choices": [{"index": 0, "delta": {"content": "spam "}}]}
    assert any(reader.feed(events(delta)) for _ in range(100))
    reply = streamed_reply(reader.got, "q", 0.0)
    assert reply.finish_reason == LOOP_FINISH and reply.output_tokens == -(-reader.got.chars // 4)
    small = EventReader(LoopWatch(LoopRule(window_chars=0)), max_chars=3, served=lambda _: None)
    with pytest.raises(EndpointError, match="over 3 characters"):
        small.feed(events(delta))
    with pytest.raises(Transient, match="before its finish"):
        streamed_reply(
            EventReader(LoopWatch(rule), max_chars=9, served=lambda _: None).end(), "q", 0.0
        )


# --------------------------------------------------------------------------- roles
def test_the_judge_is_greedy_with_its_own_budget_and_never_cut() -> None:
    s = Settings(temperature=0.8, top_p=0.9, max_new_tokens=100, judge_max_new_tokens=7)
    judge, generator = role_choice(s, "judge"), role_choice(s, "generator")
    assert (judge.temperature, judge.top_p, judge.max_new_tokens, judge.loops) == (
        0.0,
        1.0,
        7,
        None,
    )
    assert (generator.temperature, generator.top_p, generator.max_new_tokens) == (0.8, 0.9, 100)
    assert generator.loops == LoopRule.of(s)
