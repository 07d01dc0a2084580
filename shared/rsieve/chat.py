"""Client-side chat templates, for servers that take a rendered prompt (Triton's vLLM
backend applies no chat template: text_input must already be the model's chat prompt).

`render_chat(question, has_image=..., template=..., reasoning=...)` returns the exact text
sent and the `prefix` the template opened for the assistant (`"<think>\\n"` with reasoning
on), which the caller puts back in front of the model's output so the stored raw output is
the whole assistant turn. The user's text is the stored question, byte for byte.

Templates (ChatML, as the checkpoints' own `chat_template` renders one user turn with one
image and `add_generation_prompt=True`):

- `qwen2_5_vl`: Qwen2.5-VL-*-Instruct. Its default system prompt; the image as
  `<|vision_start|><|image_pad|><|vision_end|>` before the text (vLLM expands the single
  `<|image_pad|>` to the image's patch count). The model has no native thinking mode, so
  reasoning on adds a system instruction to reason inside `<think>...</think>` and opens
  `<think>` for the assistant.
- `qwen3_vl`: Qwen3-VL-*-Thinking. No default system prompt; the thinking template opens
  `<think>\\n` for the assistant itself; reasoning off closes an empty think block, as the
  Qwen3 templates do with `enable_thinking=False`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TEMPLATES", "VISION_PLACEHOLDER", "RenderedChat", "render_chat"]

VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN25_SYSTEM = "You are a helpful assistant."
REASONING_INSTRUCTION = (
    "You are a helpful assistant. First think about the question step by step inside "
    "<think> </think> tags, then give the final answer after </think>."
)


@dataclass(frozen=True)
class RenderedChat:
    text: str
    prefix: str


def _chatml(system: str | None, user: str, opening: str) -> str:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""
    return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{opening}"


def _qwen2_5_vl(question: str, has_image: bool, reasoning: bool) -> RenderedChat:
    user = (VISION_PLACEHOLDER if has_image else "") + question
    if reasoning:
        return RenderedChat(_chatml(REASONING_INSTRUCTION, user, "<think>\n"), "<think>\n")
    return RenderedChat(_chatml(_QWEN25_SYSTEM, user, ""), "")


def _qwen3_vl(question: str, has_image: bool, reasoning: bool) -> RenderedChat:
    user = (VISION_PLACEHOLDER if has_image else "") + question
    opening = "<think>\n" if reasoning else "<think>\n\n</think>\n\n"
    return RenderedChat(_chatml(None, user, opening), opening)


TEMPLATES = {"qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl}


def render_chat(question: str, *, has_image: bool, template: str = "qwen2_5_vl",
                reasoning: bool = True) -> RenderedChat:
    try:
        render = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown chat template {template!r}; known: {sorted(TEMPLATES)}"
                         ) from None
    return render(question, has_image, reasoning)
