"""SmolLM2-135M-Instruct, a real language model, outside Triton: its own chat template (from
its GGUF and from the dequantised checkpoint), the think parser on its real outputs (it has
no thinking mode), and the judge prompts of the whole canary set checked token by token
with its real tokenizer: no special-token id that the template did not put there."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rsieve.adapters.tokenizer import load_chat_template
from rsieve.generate.chat import ChatTemplate
from rsieve.generate.think import parse_output
from rsieve.judge.canaries import canaries
from rsieve.judge.verdicts import build_judge_prompt
from rsieve_cli.local.checkpoints import smollm2_checkpoint, smollm2_gguf

pytestmark = pytest.mark.integration

CASES = Path(__file__).resolve().parents[1] / "unit" / "cases"


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return smollm2_checkpoint()


@pytest.fixture(scope="module")
def template(checkpoint: Path) -> ChatTemplate:
    return load_chat_template(str(checkpoint))


@pytest.fixture(scope="module")
def lm(checkpoint: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    return tokenizer, model


def generate(lm: Any, prompt: str, budget: int) -> tuple[str, str]:
    """(text, finish reason) of a greedy generation after `prompt` (already rendered)."""
    import torch

    tokenizer, model = lm
    enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(
            **enc, max_new_tokens=budget, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    ids = out[0, enc["input_ids"].shape[1] :].tolist()
    stop = tokenizer.eos_token_id
    finish = "stop" if stop in ids else "length"
    ids = ids[: ids.index(stop)] if stop in ids else ids
    return tokenizer.decode(ids, skip_special_tokens=False), finish


def test_the_gguf_and_the_checkpoint_carry_one_template(
    checkpoint: Path, template: ChatTemplate
) -> None:
    from_gguf = load_chat_template(str(smollm2_gguf()))
    assert from_gguf.sha256 == template.sha256
    assert template.thinking == "none"  # SmolLM2 has no thinking mode
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(template.specials)
    chat = template.render("What is 2 + 2?\nAnswer with a number.", has_image=False)
    assert "<|im_start|>user\nWhat is 2 + 2?\nAnswer with a number.<|im_end|>" in chat.text
    assert chat.text.endswith("<|im_start|>assistant\n") and chat.prefix == ""


# ------------------------------------------------------------ the think parser, real outputs


def test_an_answer_without_think_tags_has_no_reasoning(lm: Any, template: ChatTemplate) -> None:
    chat = template.render("What is the capital of France? Answer in one word.", has_image=False)
    text, finish = generate(lm, chat.text, 24)
    assert "<think>" not in text and "</think>" not in text and text.strip()
    parsed = parse_output(chat.prefix + text, finish)
    assert parsed.reasoning is None
    if finish == "stop":
        assert (parsed.answer, parsed.failure) == (text.strip(), None)
    else:  # cut off with no tags at all: nothing is scored
        assert parsed.failure == "truncated_reasoning"


def test_a_think_block_that_never_closes_is_truncated_reasoning(
    lm: Any, template: ChatTemplate
) -> None:
    chat = template.render("Spell the word 'tree' letter by letter.", has_image=False)
    opened = chat.text + "<think>\n"
    text, finish = generate(lm, opened, 6)
    assert finish == "length" and "</think>" not in text
    parsed = parse_output("<think>\n" + text, finish)
    assert (parsed.answer, parsed.failure) == (None, "truncated_reasoning")
    assert parsed.reasoning == text.strip()


def test_a_closed_think_block_splits_reasoning_from_the_answer(
    lm: Any, template: ChatTemplate
) -> None:
    chat = template.render("What colour is the sky on a clear day? One word.", has_image=False)
    thought = "<think>\nThe sky on a clear day is blue.\n</think>\n"
    text, finish = generate(lm, chat.text + thought, 16)
    parsed = parse_output(thought + text, finish)
    assert parsed.reasoning == "The sky on a clear day is blue."
    if text.strip() and finish == "stop":
        assert parsed.answer == text.strip()
    elif not text.strip():
        assert parsed.failure in {"empty_answer", "truncated_answer"}


def test_a_budget_hit_without_tags_is_never_scored(lm: Any, template: ChatTemplate) -> None:
    chat = template.render("Write a long story about a cat.", has_image=False)
    text, finish = generate(lm, chat.text, 3)
    assert finish == "length"
    assert parse_output(text, finish).failure == "truncated_reasoning"


# ---------------------------------------------------------------- special-token canaries


def test_canary_judge_prompts_hold_no_special_token_the_template_did_not_put(
    checkpoint: Path, template: ChatTemplate
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    special = {tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens}
    special |= set(tokenizer.added_tokens_decoder)
    read = [json.loads(x) for x in (CASES / "judge_canaries.jsonl").read_text().splitlines() if x]
    inj = [json.loads(x) for x in (CASES / "judge_injections.jsonl").read_text().splitlines() if x]
    cases = canaries(read, inj)
    assert any("<|im_end|>" in c.candidate for c in cases)  # the set has such cases

    def special_ids(text: str) -> Counter[int]:
        return Counter(i for i in tokenizer.encode(text, add_special_tokens=False) if i in special)

    baseline = special_ids(template.render("plain", has_image=False).text)
    unneutralised = 0
    raw_hits = 0
    for case in cases:
        prompt = build_judge_prompt(case.question, case.references, case.candidate)
        raw_hits += sum(special_ids(prompt).values())
        rendered = template.render(prompt, has_image=False)
        unneutralised += sum((special_ids(rendered.text) - baseline).values())
    print(
        f"special-token ids in {len(cases)} canary judge prompts: {raw_hits} before "
        f"neutralising, {unneutralised} after"
    )
    assert raw_hits > 0  # the control: without neutralising, the tokens are there
    assert unneutralised == 0
