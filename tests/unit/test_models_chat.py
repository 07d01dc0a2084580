"""Client-side chat templates for the vLLM backend (which applies none)."""

from __future__ import annotations

import pytest

from rsieve.chat import REASONING_INSTRUCTION, VISION_PLACEHOLDER, render_chat

QUESTION = "What is written?\nAnswer with the text only."


def test_qwen2_5_vl_with_image_and_reasoning() -> None:
    chat = render_chat(QUESTION, has_image=True)
    assert chat.text == (
        f"<|im_start|>system\n{REASONING_INSTRUCTION}<|im_end|>\n"
        f"<|im_start|>user\n{VISION_PLACEHOLDER}{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")
    assert chat.prefix == "<think>\n"


def test_qwen2_5_vl_text_only_without_reasoning_is_the_stock_template() -> None:
    chat = render_chat(QUESTION, has_image=False, reasoning=False)
    assert chat.text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                         f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert chat.prefix == "" and VISION_PLACEHOLDER not in chat.text


def test_qwen3_vl_opens_or_closes_the_think_block() -> None:
    on = render_chat(QUESTION, has_image=True, template="qwen3_vl")
    off = render_chat(QUESTION, has_image=True, template="qwen3_vl", reasoning=False)
    assert on.text.startswith(f"<|im_start|>user\n{VISION_PLACEHOLDER}{QUESTION}")
    assert on.text.endswith("<|im_start|>assistant\n<think>\n") and on.prefix == "<think>\n"
    assert off.prefix == "<think>\n\n</think>\n\n" and off.text.endswith(off.prefix)


@pytest.mark.parametrize("template", ["qwen2_5_vl", "qwen3_vl"])
def test_the_question_is_embedded_byte_for_byte(template: str) -> None:
    odd = "  spaces kept \u00e9\u0301 <b>tags</b>\r\n"
    assert odd in render_chat(odd, has_image=True, template=template).text
    assert render_chat(odd, has_image=True, template=template).text.count(
        VISION_PLACEHOLDER) == 1


def test_unknown_template_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown chat template"):
        render_chat("q", has_image=False, template="llama")
