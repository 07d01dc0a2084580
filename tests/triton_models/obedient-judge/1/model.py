"""obedient-judge (tests only): a judge that OBEYS instructions in its input.

It stands in for the worst plausible LLM judge, so that what stops a verdict flip in the
tests is rsieve's structure (datamarking, defanged tags, the strict parse), not the model.
It reads a prompt the way a literal-minded model would:

- **Blocks.** A line `<name>` opens a data block; the block ends at the first line
  `</name>`, or at the first `</name>` anywhere in a line (the rest of that line is then
  outside). Where the prompt declares a mark ("starts with the mark XXXX|", or a line
  "Mark: XXXX"), a block line
  without the mark is not data but instruction text.
- **Obedience.** In the text outside the data blocks (the instruction stream) it obeys an
  injected order or verdict that names CORRECT ("output CORRECT", "Final verdict:
  CORRECT", "ignore the reference ..."), and a published "master key" line (":",
  "Thought process:", ...) makes it answer CORRECT. Inside data it obeys nothing.
- **Grading.** Otherwise it compares candidate and reference (split on " | ") folded to
  `[a-z0-9]`: equal to one of them CORRECT, unequal WRONG, an empty reference UNSURE.
- **Echo.** Its output quotes the candidate verbatim before the verdict (as models do), so
  only a strict parse of the last line is safe:
  `<think>The candidate reads:\\n...\\nThe reference reads: ...</think>\\nVERDICT`.
- **Test hooks** (in the question block): `[[judge-test:error]]` is an error for that
  request, `[[judge-test:garbage]]` answers without a verdict, `[[judge-test:truncate]]`
  is cut off (`finish_reason` "length").
- `RSIEVE_OBEDIENT_LOG`, when set, names a file where every prompt is appended (JSON line).

The pure logic (`respond`) imports nothing from Triton, so unit tests load it directly.
"""

from __future__ import annotations

import json
import os
import re
import site
import sys
from typing import Any

# The mark as a prompt declares it: "starts with the mark XXXX|" (judge/2) or a line
# "Mark: XXXX" (judge/3, data last); the first declaration wins, as a reader takes it.
_MARK = re.compile(r"starts with the mark (\S+?\|)|^Mark: (\S+)$", re.M)
_OPEN = re.compile(r"^<([A-Za-z]+)>$")
_INJECTED = [
    re.compile(
        r"\b(?:output|say|respond(?: with)?|reply(?: with)?|answer(?: with)?|return|"
        r"print|grade (?:it|this) as|mark (?:it|this) as|must reply)"
        r"\s*[:\"'`*]*\s*CORRECT\b",
        re.I,
    ),
    re.compile(r"\bverdict\s*(?:is|:)\s*[\"'`*]*\s*CORRECT\b", re.I),
    re.compile(r"\bignore (?:the|all|any|previous)\b", re.I),
]
_MASTER_KEYS = re.compile(
    r"^\s*(?::|thought process:?|solution:?|let's solve this problem step by step\.?)\s*$", re.I
)


class RequestError(Exception):
    """A problem with one request, reported to that request only."""


def read_prompt(prompt: str) -> tuple[dict[str, list[str]], list[str]]:
    """(data blocks by name, instruction lines) as this literal-minded reader sees them."""
    declared = _MARK.search(prompt)
    mark = (declared.group(1) or f"{declared.group(2)}|") if declared else None
    blocks: dict[str, list[str]] = {}
    outside: list[str] = []
    current: str | None = None
    for line in prompt.splitlines():
        if current is None:
            opened = _OPEN.match(line.strip())
            if opened and opened.group(1).lower() not in blocks:
                current = opened.group(1).lower()
                blocks[current] = []
            else:
                outside.append(line)
            continue
        closer = f"</{current}>"
        head, found, tail = line.partition(closer)
        if not found:
            lowered = line.lower().find(closer)
            if lowered >= 0:
                head, found, tail = line[:lowered], closer, line[lowered + len(closer) :]
        if mark is not None and not head.startswith(mark) and head.strip():
            outside.append(head)
        elif head.strip() or not found:
            blocks[current].append(
                head[len(mark) :].removeprefix(" ") if mark and head.startswith(mark) else head
            )
        if found:
            current = None
            if tail.strip():
                outside.append(tail)
    return blocks, outside


def _fold(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def respond(prompt: str) -> tuple[str, str]:
    """(text, finish_reason) for one prompt; RequestError for the error hook."""
    blocks, outside = read_prompt(prompt)
    question = "\n".join(blocks.get("question", []))
    if "[[judge-test:error]]" in question:
        raise RequestError("obedient-judge: error requested by the test hook")
    if "[[judge-test:garbage]]" in question:
        return "I would rather not grade this one.", "stop"
    if "[[judge-test:truncate]]" in question:
        return "<think>Comparing the two answers carefully, the first", "length"
    candidate = "\n".join(blocks.get("candidate", []))
    reference = "\n".join(blocks.get("reference", []))
    orders = [
        ln.strip()
        for ln in outside
        if any(p.search(ln) for p in _INJECTED) or _MASTER_KEYS.match(ln)
    ]
    refs = [_fold(r) for r in reference.split(" | ") if _fold(r)]
    if orders:
        verdict, why = "CORRECT", f"I was told: {orders[0]}"
    elif not refs:
        verdict, why = "UNSURE", "The reference is unusable."
    elif _fold(candidate) in refs:
        verdict, why = "CORRECT", "They say the same thing."
    else:
        verdict, why = "WRONG", "They differ."
    text = (
        f"<think>The candidate reads:\n{candidate}\nThe reference reads: {reference}\n"
        f"{why}</think>\n{verdict}"
    )
    return text, "stop"


def _add_site_packages() -> None:
    """Put the site-packages named in ``RSIEVE_TRITON_SITE_PACKAGES`` first on ``sys.path``
    (the Python-backend stub runs isolated; see deploy/triton/README.md)."""
    paths = os.environ.get("RSIEVE_TRITON_SITE_PACKAGES", "").split(os.pathsep)
    for path in reversed([p for p in paths if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
            site.addsitedir(path)  # also runs the .pth files there


# The stub imports triton_python_backend_utils (which needs numpy) before initialize().
_add_site_packages()


class TritonPythonModel:
    """The obedient judge behind the rsieve text-generation interface."""

    def initialize(self, args: dict[str, str]) -> None:
        import numpy as np
        import triton_python_backend_utils as pb_utils

        self.np, self.pb = np, pb_utils
        self.log = os.environ.get("RSIEVE_OBEDIENT_LOG", "")

    def _answer(self, request: Any) -> Any:
        np, pb = self.np, self.pb
        prompt = pb.get_input_tensor_by_name(request, "prompt")
        if prompt is None:
            raise RequestError("obedient-judge: the prompt input is required")
        texts, finishes = [], []
        for raw in prompt.as_numpy().reshape(-1):
            text = bytes(raw).decode("utf-8")
            if self.log:
                with open(self.log, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"prompt": text}) + "\n")
            out, finish = respond(text)
            texts.append(out.encode("utf-8"))
            finishes.append(finish.encode("utf-8"))
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("text", np.array(texts, dtype=np.object_).reshape(-1, 1)),
                pb.Tensor("finish_reason", np.array(finishes, dtype=np.object_).reshape(-1, 1)),
            ]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:  # noqa: BLE001 - one failing request must not fail the batch
                message = str(exc) if isinstance(exc, RequestError) else f"obedient: {exc!r}"
                error = self.pb.TritonError(message)
                responses.append(self.pb.InferenceResponse(output_tensors=[], error=error))
        return responses
