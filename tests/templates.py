"""Tokenizer folders in the shape of real VLM checkpoints, for the chat-template tests.

No hub is reachable, so the Qwen checkpoints' tokenizers cannot be had here. Each fixture is
an ordinary Hugging Face tokenizer folder (a byte-level BPE trained in memory, with the
checkpoint family's special tokens as added tokens) carrying a chat template in the form
the Qwen checkpoints publish:

- `qwen2_5_vl`: Qwen2.5-VL-Instruct's template (default system prompt, vision placeholder
  `<|vision_start|><|image_pad|><|vision_end|>`, no thinking mode);
- `qwen3_vl_thinking`: a Qwen3-VL-Thinking-style template (no default system prompt; the
  generation prompt opens `<think>\\n`, so the model always reasons);
- `qwen3_switch`: a Qwen3-style template with the `enable_thinking` switch (off: an empty,
  closed think block is put in the assistant turn).

Loaded with `AutoTokenizer.from_pretrained(folder)` exactly as a user's checkpoint is.
"""

from __future__ import annotations

from pathlib import Path

QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN3_SPECIALS = [*QWEN_SPECIALS, "<think>", "</think>"]

_CONTENT = (
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
)

TEMPLATES = {
    "qwen2_5_vl": (
        "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        "<|im_start|>{{ message['role'] }}\n" + _CONTENT + "<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "qwen3_vl_thinking": (
        "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
        "{% for message in messages %}"
        "<|im_start|>{{ message['role'] }}\n" + _CONTENT + "<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    ),
    "qwen3_switch": (
        "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
        "{% for message in messages %}"
        "<|im_start|>{{ message['role'] }}\n" + _CONTENT + "<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}"
        "<think>\n\n</think>\n\n{% endif %}{% endif %}"
    ),
}

_CORPUS = [
    "What is written in the image? Answer with the text only.",
    "Which option is right? A B C D 0 1 2 3 4 5 6 7 8 9 amount cheque",
]


def build_tokenizer(out: Path, template: str) -> Path:
    """A tokenizer folder with TEMPLATES[template] as its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = QWEN3_SPECIALS if template.startswith("qwen3") else QWEN_SPECIALS
    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = TEMPLATES[template]
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    return out
