"""The checkpoint's own chat template, rendered by transformers, for engines that take a
rendered prompt (Triton's vLLM backend applies no chat template: `text_input` must already
be the model's chat prompt). docs/models.md.

A `ChatTemplate` wraps a loaded tokenizer (`rsieve.adapters.tokenizer.load_chat_template`
reads a checkpoint folder or a GGUF; no weights) and renders one user turn, the image first
(`{"type": "image"}`, which the template turns into its own placeholder, e.g. Qwen-VL's
`<|vision_start|><|image_pad|><|vision_end|>`) then the question, with
`add_generation_prompt=True`. Nothing here writes a chat format by hand.

What the template does for reasoning (`thinking`, one of `rsieve.schemas.THINKING_MODES`):

- `switch`: the template has a thinking switch (`enable_thinking`, Qwen3 style); reasoning
  on renders with `enable_thinking=True`, off with `False`.
- `opens`: the template opens `<think>` for the assistant itself (Qwen3-VL-Thinking, the
  tiny test VLM): the model always reasons; reasoning off is refused.
- `none`: no thinking mode (Qwen2.5-VL-Instruct, SmolLM2): the prompt is the template's
  own, with no instruction added; "reasoning on" is whatever the model writes unprompted,
  and an answer without think tags has no reasoning (it goes to `_RS_nothink` only).

Whatever the template put after the assistant header from `<think>` on (`<think>\\n`, or
Qwen3's closed empty block with reasoning off) is the `prefix`, which the caller puts back
in front of the model's output so the stored raw output is the whole assistant turn.

Special tokens cannot end the user turn: every special or added token of the tokenizer
(`<|im_end|>`, `<|im_start|>`, `<|endoftext|>`, a `<think>` the tokenizer adds, ...) found in
text from the pool or from a model is neutralised (`neutralise`) before rendering, so the
tokenizer encodes it as plain text. The question sent is then byte-identical to the
neutralised question, which is what the caller stores.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rsieve.generate.think import OPEN

__all__ = [
    "NEUTRALISER",
    "ChatTemplate",
    "RenderedChat",
    "TemplateError",
    "neutralise",
    "thinking_mode",
]

# U+2060 WORD JOINER, put after the first character of a special token found in text: the
# text reads the same, and no tokenizer matches the token any more.
NEUTRALISER = "\u2060"

Render = Callable[..., str]


class TemplateError(ValueError):
    """The checkpoint's template cannot carry the question as rsieve needs."""


@dataclass(frozen=True)
class RenderedChat:
    text: str  # the exact prompt string sent
    prefix: str  # what the template opened for the assistant, from `<think>` on
    user: str  # the user turn's text as sent (the question, neutralised)


def neutralise(text: str, specials: Iterable[str]) -> str:
    """`text` with every occurrence of a special token broken by `NEUTRALISER`.

    Longest tokens first, in one pass, and again until none is left (breaking one token can
    never create another, but a second pass proves it)."""
    tokens = sorted({t for t in specials if len(t) > 1}, key=len, reverse=True)
    if not tokens:
        return text
    pattern = re.compile("|".join(re.escape(t) for t in tokens))
    for _ in range(8):
        if not pattern.search(text):
            return text
        text = pattern.sub(lambda m: m.group(0)[0] + NEUTRALISER + m.group(0)[1:], text)
    raise TemplateError("special tokens remain after neutralising")  # pragma: no cover


def _generation_prompt(render: Render, **kwargs: Any) -> str:
    """What `add_generation_prompt=True` adds after a one-question conversation."""
    messages = [{"role": "user", "content": "q"}]
    without = render(messages, add_generation_prompt=False, **kwargs)
    with_ = render(messages, add_generation_prompt=True, **kwargs)
    return with_[len(without) :] if with_.startswith(without) else with_


def thinking_mode(source: str, render: Render) -> str:
    """`switch`, `opens` or `none` (module docstring)."""
    if "enable_thinking" in source:
        return "switch"
    return "opens" if OPEN in _generation_prompt(render) else "none"


@dataclass(frozen=True)
class ChatTemplate:
    """One checkpoint's chat template. `render` is the tokenizer's `apply_chat_template`
    (with `tokenize=False`); `specials` every special and added token it knows."""

    name: str
    source: str
    render_fn: Render
    specials: tuple[str, ...] = ()
    sha256: str = field(init=False)
    thinking: str = field(init=False)
    _shapes: dict[tuple[bool, bool], str] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha256", hashlib.sha256(self.source.encode()).hexdigest())
        object.__setattr__(self, "thinking", thinking_mode(self.source, self.render_fn))

    def neutralise(self, text: str) -> str:
        return neutralise(text, self.specials)

    def render(self, question: str, *, has_image: bool, reasoning: bool = True) -> RenderedChat:
        """One render by the template per question; what the template adds around any
        question (the image placeholder, the generation prompt) is learnt once per shape
        (`_shape`) from a probe question."""
        if not reasoning and self.thinking == "opens":
            raise TemplateError(
                f"{self.name}: the template always opens <think>; this "
                "checkpoint cannot answer with reasoning off"
            )
        kwargs = {"enable_thinking": reasoning} if self.thinking == "switch" else {}
        opened = self._shape(has_image, reasoning, kwargs)
        user = self.neutralise(question)
        text = self.render_fn(_turn(user, has_image), add_generation_prompt=True, **kwargs)
        if user not in text:
            raise TemplateError(
                f"{self.name}: the rendered prompt does not hold the question byte for byte"
            )
        if not text.endswith(opened):  # a template whose ending depends on the question
            bare = self.render_fn(_turn(user, has_image), add_generation_prompt=False, **kwargs)
            opened = text[len(bare) :] if text.startswith(bare) else ""
        at = opened.rfind(OPEN)
        return RenderedChat(text=text, prefix=opened[at:] if at >= 0 else "", user=user)

    def _shape(self, has_image: bool, reasoning: bool, kwargs: dict[str, Any]) -> str:
        """What the generation prompt adds for this shape of turn; refuses a template that
        ignores the image."""
        key = (has_image, reasoning)
        if key not in self._shapes:
            turn = _turn(_PROBE, has_image)
            text = self.render_fn(turn, add_generation_prompt=True, **kwargs)
            if (
                has_image
                and self.render_fn(_turn(_PROBE, False), add_generation_prompt=True, **kwargs)
                == text
            ):
                raise TemplateError(
                    f"{self.name}: the template puts no image placeholder in "
                    "the user turn (not a VLM template?)"
                )
            bare = self.render_fn(turn, add_generation_prompt=False, **kwargs)
            self._shapes[key] = text[len(bare) :] if text.startswith(bare) else ""
        return self._shapes[key]


_PROBE = "What does the image show?"


def _turn(user: str, has_image: bool) -> list[dict[str, Any]]:
    content: str | list[dict[str, str]] = user
    if has_image:
        content = [{"type": "image"}, {"type": "text", "text": user}]
    return [{"role": "user", "content": content}]
