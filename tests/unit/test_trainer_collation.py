"""The trainer export through TRL: `SFTTrainer` on `load_dataset(folder)[split]` with
`assistant_only_loss=True`, as README.md's example, on the tiny LLaVA checkpoint the tests
build (scripts/build_tiny_vlm.py, random weights, no download). One batch of each split
from the trainer's own dataloader: the tokens whose label is not -100, decoded, are exactly
each row's assistant text and the end of its turn (think: the `<think>` block and the
answer; nothink: the answer; rejected: the reference), never the question or the image."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest

from rsieve.adapters.exports import export_messages
from tests.checkpoints import build_tiny_vlm
from tests.fakes import MemoryStore
from tests.unit.test_trainer_export import DATASET, REASONING, commit, outcomes

ROOT = Path(__file__).resolve().parents[2]

# The tiny checkpoint's ChatML (scripts/build_tiny_vlm.py) with `{% generation %}` around
# the assistant's content and its end of turn: the markers `assistant_only_loss` reads.
# (TRL swaps in such a template itself for the checkpoints it knows: Qwen2.5-VL, Qwen3-VL,
# Gemma 3, SmolVLM, Idefics3, LLaVA-NeXT, ...)
TRAINING_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}<|im_end|>"
    "{% endgeneration %}\n"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Path]]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    root = tmp_path_factory.mktemp("trl")
    checkpoint = build_tiny_vlm(root / "tiny-llava")
    processor = AutoProcessor.from_pretrained(checkpoint)
    processor.chat_template = processor.tokenizer.chat_template = TRAINING_TEMPLATE
    model = AutoModelForImageTextToText.from_pretrained(checkpoint)
    store = MemoryStore()
    commit(store, [("run-1", outcomes())])
    folder = export_messages(store, DATASET, root, include_rejected=True)
    yield model, processor, folder


def _expected(row: dict[str, Any]) -> str:
    return str(row["messages"][1]["content"][0]["text"]) + "<|im_end|>"


@pytest.mark.parametrize("split", ["think", "nothink", "rejected"])
def test_one_batch_trains_on_the_assistant_text_alone(
    setup: tuple[Any, Any, Path], split: str, tmp_path: Path
) -> None:
    from trl import SFTConfig, SFTTrainer

    model, processor, folder = setup
    ds = datasets.load_dataset(str(folder), split=split)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(
            output_dir=str(tmp_path),
            assistant_only_loss=True,
            per_device_train_batch_size=len(ds),
            activation_checkpointing=False,
            use_cpu=True,
            report_to=[],
        ),
        train_dataset=ds,
        processing_class=processor,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["pixel_values"].shape[0] == len(ds)  # one image per row
    tokenizer = processor.tokenizer
    trained = [
        tokenizer.decode(ids[labels != -100])
        for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True)
    ]
    expected = [_expected(row) for row in ds.remove_columns("images")]
    assert sorted(trained) == sorted(expected)  # the sampler shuffles
    # The prompt (question, image tokens) is in the input, never in the labels.
    whole = [tokenizer.decode(ids) for ids in batch["input_ids"]]
    for row in ds.remove_columns("images"):
        question = row["messages"][0]["content"][1]["text"]
        assert any(question in text and "<image>" in text for text in whole)
        assert not any(question in text for text in trained)
    if split == "think":
        assert all(t.startswith(f"<think>\n{REASONING}\n</think>\n\n") for t in trained)
        assert "<think>\nI read the letters one by one.\n</think>\n\nCOFFEE<|im_end|>" in trained
    else:
        assert not any("<think>" in t for t in trained)
    if split == "rejected":
        assert trained == ["JUICE<|im_end|>"]
