"""Build a tiny LLaVA checkpoint with random weights and a locally trained tokenizer.

No hub access exists or is needed: the checkpoint is built from transformers configs (a
2-layer CLIP vision tower, a 2-layer Llama), a byte-level BPE tokenizer trained in memory
with `tokenizers`, a ChatML chat template that opens `<think>` for the assistant, and a
`LlavaProcessor` with a CLIP image processor. It loads as any user's checkpoint does
(`AutoProcessor` / `AutoModelForImageTextToText.from_pretrained(dir)`), so the portable
Triton model (deploy/triton/hf/vlm) runs its real loading, chat template, preprocessing
and generate path on it. Random weights answer nonsense: never assert on its answers.

    .venv/bin/python scripts/build_tiny_vlm.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = [
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "<image>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
]

# ChatML; the image placeholder precedes the user's text; reasoning on: the assistant turn
# opens <think>, so generation starts inside the reasoning.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>{% endif %}"
)

_CORPUS = [
    "What word is shown in the image? Answer with the text only.",
    "Read the text in the image. Answer with the text only.",
    "Answer with the option's letter from the given choices directly.",
    "Answer the question using a single word or phrase.",
    "The amount written on the cheque is 11850. HELLO WORLD ESPLANADE",
    "I read the letters one by one, then I answer. A B C D 0 1 2 3 4 5 6 7 8 9",
]


def build_tiny_vlm(out: Path, *, image_size: int = 32, seed: int = 0) -> Path:
    """Write the tiny LLaVA checkpoint into ``out`` and return ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.clip import CLIPImageProcessorPil

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="<pad>",
        padding_side="left",
        extra_special_tokens={"image_token": "<image>"},
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    patch = 8
    vision = CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch,
        projection_dim=16,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    assert isinstance(image_token, int)  # one token asked, one id back
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out)

    # A square resize (no crop): every image becomes (image_size / patch)^2 image tokens.
    images = CLIPImageProcessorPil(
        size={"height": image_size, "width": image_size}, do_center_crop=False
    )
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        patch_size=patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build_tiny_vlm(Path(sys.argv[1])))
