"""The RL export in verl's own layout, read by verl itself (verl 0.9.1, installed by the
Makefile with --no-deps: its declared numpy>=2 and transformers<5.11 would break this
project's pins, and the two modules used here import with ray, tensordict and omegaconf).

- `verl.utils.dataset.rl_dataset.RLHFDataset` loads the parquet with the tiny VLM's
  tokenizer and processor and a data config from verl's own defaults
  (verl/trainer/config/data/legacy_data.yaml): item 0's messages hold the image where the
  prompt's `<image>` was (RLHFDataset asserts one `<image>` per image), the processor
  renders them into token ids with the image's tokens, and the ground truth, data source
  and extra info pass through untouched.
- verl's custom reward loader (`verl.trainer.ppo.reward.get_custom_reward_fn`, from
  `reward.custom_reward_function: {path, name}`) imports shared/rsieve/rewards/verl.py by
  its path, and its `compute_score` scores the dataset's own row as verl's reward manager
  calls it (data_source, solution_str, ground_truth, extra_info).

`_verl_parquet` is the real export's verl layout (`rsieve export RUN --format rl --layout
verl`, the command's own code) of a best-of-n FakeStack run."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rsieve.rewards import decode
from tests.checkpoints import build_tiny_vlm
from tests.unit.test_trainer_collation import TRAINING_TEMPLATE
from tests.unit.test_training_exports import best_of_n_run, export

ROOT = Path(__file__).resolve().parents[2]
REWARD_FILE = ROOT / "shared" / "rsieve" / "rewards" / "verl.py"

# Looked up, not imported: importing verl (ray, tensordict) takes about 10 s, and collecting
# this module must stay cheap for `make test-fast`, which deselects it (tier `model`).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None,
    reason="verl is installed by the Makefile's install step (pip --no-deps)",
)


def _verl_parquet(root: Path, *, content: str | None = None) -> Path:
    """The verl layout of `rsieve export RUN --format rl` (the command's own code) of a
    best-of-n FakeStack run; `content`: every prompt's content replaced (verl's refusals)."""
    import pyarrow.parquet as pq

    ctx, run = best_of_n_run(root, items=6)
    path = export(ctx, run, root / "out", "rl", layout="verl") / "train.parquet"
    if content is not None:
        table = pq.read_table(path).to_pylist()
        for row in table:
            row["prompt"][0]["content"] = content
        pq.write_table(pa_table(table, pq.read_schema(path)), path)
    return path


def pa_table(rows: list[dict[str, Any]], schema: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=schema)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The tiny checkpoint's processor (its tokenizer inside) and a temporary root."""
    from transformers import AutoProcessor

    root = tmp_path_factory.mktemp("verl")
    checkpoint = build_tiny_vlm(root / "tiny-llava")
    processor = AutoProcessor.from_pretrained(checkpoint)
    processor.chat_template = processor.tokenizer.chat_template = TRAINING_TEMPLATE
    yield processor, root


def _data_config(root: Path, **overrides: Any) -> Any:
    """verl's own data defaults (the trainer's `data:` group), with the export's keys."""
    import verl
    from omegaconf import OmegaConf

    defaults = Path(verl.__file__).parent / "trainer" / "config" / "data" / "legacy_data.yaml"
    config = OmegaConf.load(defaults)
    settings = {
        "prompt_key": "prompt",
        "image_key": "images",
        "max_prompt_length": 4096,
        # verl's length filter (and its agent loop) read a prompt's images through
        # qwen_vl_utils, which needs torchvision: neither is a test dependency here.
        "filter_overlong_prompts": False,
        "cache_dir": str(root / "verl-cache"),
        **overrides,
    }
    return OmegaConf.merge(config, settings)


def test_rlhf_dataset_reads_the_export(tiny: tuple[Any, Path]) -> None:
    from PIL import Image
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import build_multimodal_processor_inputs

    processor, root = tiny
    parquet = _verl_parquet(root / "export")
    dataset = RLHFDataset(
        data_files=str(parquet),
        tokenizer=processor.tokenizer,
        config=_data_config(root),
        processor=processor,
    )
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet).to_pylist()
    assert len(dataset) == len(rows) > 0
    item = dataset[0]
    # What passes through to the reward: the data source, the ground truth, extra info.
    assert item["data_source"] == "rsieve/SynthWords"
    assert item["reward_model"] == rows[0]["reward_model"]
    assert decode(item["reward_model"]["ground_truth"]).protocol == "alnum"
    assert item["extra_info"]["id"] == rows[0]["extra_info"]["id"] and item["index"] == 0
    question = rows[0]["prompt"][0]["content"].removeprefix("<image>")
    # The prompt's one `<image>` became the row's one image, decoded by PIL.
    (message,) = item["raw_prompt"]
    parts = message["content"]
    assert [p["type"] for p in parts] == ["image", "text"]
    assert isinstance(parts[0]["image"], Image.Image) and parts[1]["text"] == question
    # Rendered as verl renders a multimodal prompt (its length filter, its agent loop):
    # the chat template's text and the images through the processor.
    text = processor.apply_chat_template(
        item["raw_prompt"], add_generation_prompt=True, tokenize=False
    )
    inputs = build_multimodal_processor_inputs(processor, text=[text], images=[parts[0]["image"]])
    ids = inputs["input_ids"][0].tolist()
    assert inputs["pixel_values"].shape[0] == 1
    # One image token per patch of the tiny CLIP (its class token dropped: "default").
    height, width = inputs["pixel_values"].shape[-2:]
    patches = (height // processor.patch_size) * (width // processor.patch_size)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert ids.count(image_token) == patches > 0
    assert question in processor.tokenizer.decode(ids)


@pytest.mark.parametrize("content", ["Say it", "<image><image>Say it"], ids=["none", "two"])
def test_rlhf_dataset_refuses_a_prompt_without_one_image_tag_per_image(
    tiny: tuple[Any, Path], content: str
) -> None:
    """Why the export writes exactly one `<image>` per image: verl asserts it."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    processor, root = tiny
    parquet = _verl_parquet(root / f"export-{content.count('<image>')}", content=content)
    dataset = RLHFDataset(str(parquet), processor.tokenizer, _data_config(root), processor)
    with pytest.raises(AssertionError, match="image_offset"):
        dataset[0]


def test_verl_loads_the_reward_by_path_and_scores_the_row(tiny: tuple[Any, Path]) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset

    processor, root = tiny
    parquet = _verl_parquet(root / "export-reward")
    dataset = RLHFDataset(str(parquet), processor.tokenizer, _data_config(root), processor)
    item = dataset[0]
    # verl 0.9's key; the legacy top-level `custom_reward_function.*` (docs/training.md's
    # command line) is moved here by verl's reward loop (migrate_legacy_reward_impl).
    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": str(REWARD_FILE), "name": "compute_score"}}}
    )
    compute_score = get_custom_reward_fn(config)
    assert compute_score is not None

    def scored(solution: str) -> dict[str, float]:
        result = compute_score(
            data_source=item["data_source"],
            solution_str=solution,
            ground_truth=item["reward_model"]["ground_truth"],
            extra_info=item["extra_info"],
        )
        assert isinstance(result, dict)
        return result

    word = decode(item["reward_model"]["ground_truth"]).references[0]
    right = scored(f"<think>\nI read it.\n</think>\n\n{word}")
    assert right["score"] == 1.0 and right["valid"] == 1.0
    wrong = scored(f"<think>\nI read it.\n</think>\n\n{word}Q")
    assert wrong["score"] == 0.0 and wrong["valid"] == 1.0
