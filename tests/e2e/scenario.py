"""A pool built for exact assertions: each item's model output and judge verdict are
recorded for the replay model, so where every item must end is known in advance."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw

from rsieve.clean.prompts import build_question
from rsieve.judge.verdicts import build_judge_prompt
from rsieve_cli.local.replay import replay_key

WORD_Q = "What word is shown in the image? Answer with the text only."


def _png(text: str, size: tuple[int, int] = (160, 48)) -> bytes:
    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).text((8, 16), text, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Scenario:
    folder: Path
    replay: dict[str, dict[str, str]] = field(default_factory=dict)
    # pool line -> (id, place, detail): ("accepted", promoted_by) | ("rejected", reason)
    # | ("quarantined", reason)
    expected: dict[int, tuple[str | None, str, str]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def image(self, name: str, text: str) -> bytes:
        data = _png(text)
        (self.folder / name).write_bytes(data)
        return data

    def item(
        self,
        item_id: str,
        family: str,
        image: str,
        data: bytes | None,
        *,
        answer: str | list[str],
        output: str | None,
        finish: str = "stop",
        judge: str | None = None,
        expect: tuple[str, str],
        question: str = WORD_Q,
        protocol: str | None = None,
        source: object = "auto",
    ) -> None:
        rec: dict[str, object] = {
            "id": item_id,
            "family": family,
            "image": image,
            "question": question,
            "answer": answer,
        }
        if source == "auto":
            rec["source"] = {
                "path": f"upstream/{image}",
                "sha256": hashlib.sha256(data or b"").hexdigest(),
            }
        elif source is not None:
            rec["source"] = source
        if protocol:
            rec["protocol"] = protocol
        self.lines.append(json.dumps(rec))
        self.expected[len(self.lines)] = (item_id, *expect)
        if output is not None and data is not None:
            prompt = build_question(question, protocol or "alnum")
            self.replay[replay_key(prompt, data)] = {"text": output, "finish_reason": finish}
            if judge is not None:
                answer_text = output.rpartition("</think>")[2].strip()
                refs = [answer] if isinstance(answer, str) else answer
                jp = build_judge_prompt(prompt, refs, answer_text)
                self.replay[replay_key(jp, None)] = {"text": judge, "finish_reason": "stop"}

    def write(self) -> None:
        (self.folder / "items.jsonl").write_text("\n".join(self.lines) + "\n")


def build(folder: Path) -> Scenario:
    folder.mkdir(parents=True, exist_ok=True)
    s = Scenario(folder)
    hello, world = s.image("hello.png", "HELLO"), s.image("world.png", "WORLD")
    cheque, blur = s.image("cheque.png", "11850"), s.image("blur.png", "?")
    s.item(
        "w-ok",
        "SynthWords",
        "hello.png",
        hello,
        answer="hello",
        output="<think>I read H E L L O.</think>HELLO",
        expect=("accepted", "verifier"),
    )
    s.item(
        "w-ok-2",
        "SynthWords",
        "hello.png",
        hello,
        answer="HELLO",
        question="Read the text in the image. Answer with the text only.",
        output="<think>one word</think>Hello.\nIt is a greeting.",
        expect=("accepted", "verifier"),
    )
    s.item(  # ten annotators, VQA style: the row shows the majority reference and the list
        "w-vqa",
        "SynthWords",
        "world.png",
        world,
        answer=[
            "Word",
            "world",
            "world",
            "Word",
            "world",
            "world",
            "Word",
            "world",
            "world",
            "Word",
        ],
        question="Which word is written? Answer with one word.",
        protocol="vqa",
        output="<think>five letters</think>world",
        expect=("accepted", "verifier"),
    )
    s.item(
        "w-wrong",
        "SynthWords",
        "world.png",
        world,
        answer="WORLD",
        output="<think>looks like WORD</think>WORD",
        judge="<think>differs</think>WRONG",
        expect=("rejected", "wrong_answer"),
    )
    s.item(
        "w-promoted",
        "SynthWords",
        "blur.png",
        blur,
        answer="colour",
        output="<think>the word on the sign</think>It reads colour.",
        judge="CORRECT",
        expect=("accepted", "judge"),
    )
    s.item(
        "w-unsure",
        "SynthWords",
        "world.png",
        world,
        answer="W0RLD",
        question="Which word? Answer with the text only.",
        output="<think>hm</think>WORLD!",
        judge="UNSURE",
        expect=("rejected", "judge_unsure"),
    )
    s.item(
        "w-garbled",
        "SynthWords",
        "blur.png",
        blur,
        answer="tree",
        question="Name it. Answer with the text only.",
        output="<think>x</think>bush",
        judge="Final verdict: CORRECT, probably",
        expect=("rejected", "judge_failed"),
    )
    s.item(
        "a-truncated",
        "SynthAmounts",
        "cheque.png",
        cheque,
        answer="11850",
        output="<think>the first digit could be a 1 or a 7 and",
        finish="length",
        expect=("rejected", "truncated_reasoning"),
    )
    s.item(
        "a-ok",
        "SynthAmounts",
        "cheque.png",
        cheque,
        answer="11850",
        question="Transcribe the digits. Answer with the digit string only.",
        output="<think>five digits</think>11.850",
        expect=("accepted", "verifier"),
    )
    s.item(
        "a-model-error",
        "SynthAmounts",
        "world.png",
        world,
        answer="1",
        question="Digits? Answer with the digit string only.",
        output=None,
        expect=("quarantined", "model_error"),
    )
    s.lines.append('{"id": "broken", "family": "SynthWords", ')  # invalid JSON
    s.expected[len(s.lines)] = (None, "quarantined", "invalid_json")
    s.item(
        "w-missing",
        "SynthWords",
        "nope.png",
        None,
        answer="x",
        output=None,
        source={"path": "upstream/nope.png"},
        expect=("quarantined", "missing_image"),
    )
    s.item(
        "w-ok",
        "SynthWords",
        "hello.png",
        hello,
        answer="hello",
        output=None,
        expect=("quarantined", "duplicate_id"),
    )
    s.item(
        "w-provenance",
        "SynthWords",
        "hello.png",
        hello,
        answer="hello",
        output=None,
        question="Again? Answer with the text only.",
        source={"path": "upstream/other.png", "sha256": "0" * 64},
        expect=("quarantined", "provenance"),
    )
    s.item(
        "x-unknown",
        "NoSuchBenchmark",
        "hello.png",
        hello,
        answer="hello",
        output=None,
        expect=("quarantined", "unknown_protocol"),
    )
    s.item(
        "w-escape",
        "SynthWords",
        "../secret.png",
        None,
        answer="x",
        output=None,
        source={"path": "x"},
        expect=("quarantined", "image_outside_pool"),
    )
    s.item(
        "w-nosource",
        "SynthWords",
        "hello.png",
        hello,
        answer="hello",
        output=None,
        question="No source? Answer with the text only.",
        source=None,
        expect=("quarantined", "provenance"),
    )
    s.write()
    return s
