"""The training-loop exports in real trainers: TRL's `DPOTrainer` (plain DPO and the MPO mix of
sigmoid, BCO-pair and SFT losses) on the preference split, TRL's `KTOTrainer` on the KTO
rows and TRL's `GRPOTrainer` on the RL split, each for ONE optimisation step on the CPU, on
the tiny random-weight LLaVA the tests build (scripts/build_tiny_vlm.py, no download). Each
split is read as a user reads it, `datasets.load_dataset(folder)[split]`. What is proved:
the rows' format is what the trainers take (the collators turn them into pixel values and
token ids, the step runs, the loss is finite, the weights move), and GRPO's reward function
receives the dataset's own columns (`ground_truth`, ...) beside the completions and answers
with floats.

The folders are the real exports (`rsieve export RUN --format dpo`, `kto` and `rl`, the
command's own code) of a best-of-n FakeStack run whose samples differ (a stochastic
stand-in, not a model: tests/unit/test_training_exports.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest

from tests.checkpoints import build_tiny_vlm
from tests.unit.test_trainer_collation import TRAINING_TEMPLATE
from tests.unit.test_training_exports import best_of_n_run, export

PAIRS_SPLIT = "SynthWords_pairs"
RL_SPLIT = "train"

# TRL 1.16 (trl/models/utils.py, disable_gradient_checkpointing) still reads transformers'
# deprecated `is_gradient_checkpointing`; the suite turns warnings into errors.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any, Path]]:
    """The tiny checkpoint's folder, its processor (the training template: TRL renders the
    conversational rows with it), and a folder holding both exports."""
    from transformers import AutoProcessor

    root = tmp_path_factory.mktemp("trl-loop")
    checkpoint = build_tiny_vlm(root / "tiny-llava")
    processor = AutoProcessor.from_pretrained(checkpoint)
    processor.chat_template = processor.tokenizer.chat_template = TRAINING_TEMPLATE
    ctx, run = best_of_n_run(root, items=12)
    export(ctx, run, root / "dpo", "dpo")
    export(ctx, run, root / "rl", "rl")
    export(ctx, run, root / "kto", "kto")
    yield checkpoint, processor, root


def _model(checkpoint: Path) -> Any:
    """A fresh copy of the weights per test: a step changes them."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(checkpoint)


def _snapshot(model: Any) -> dict[str, Any]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def _moved(model: Any, before: dict[str, Any]) -> list[str]:
    import torch

    return [
        name
        for name, p in model.named_parameters()
        if name in before and not torch.equal(p.detach(), before[name])
    ]


def _losses(trainer: Any) -> list[float]:
    return [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize(
    ("loss_type", "loss_weights"),
    [
        (["sigmoid"], None),
        # MPO (Mixed Preference Optimization, InternVL's recipe): preference, quality, generation.
        (["sigmoid", "bco_pair", "sft"], [0.8, 0.2, 1.0]),
    ],
    ids=["dpo", "mpo"],
)
def test_dpo_takes_one_step_on_the_pairs_export(
    tiny: tuple[Path, Any, Path],
    tmp_path: Path,
    loss_type: list[str],
    loss_weights: list[float] | None,
) -> None:
    from trl import DPOConfig, DPOTrainer

    checkpoint, processor, root = tiny
    (folder,) = (root / "dpo").iterdir()
    ds = datasets.load_dataset(str(folder), split=PAIRS_SPLIT)
    assert {"images", "prompt", "chosen", "rejected"} <= set(ds.column_names)
    model = _model(checkpoint)
    before = _snapshot(model)
    trainer = DPOTrainer(
        model=model,
        args=DPOConfig(
            output_dir=str(tmp_path),
            max_steps=1,
            per_device_train_batch_size=2,
            max_length=None,  # never cut the image's tokens
            loss_type=loss_type,
            loss_weights=loss_weights,
            learning_rate=1e-2,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            activation_checkpointing=False,
        ),
        train_dataset=ds,
        processing_class=processor,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["pixel_values"].shape[0] == 2 * 2  # the images of chosen and rejected, 2 rows
    trainer.train()
    assert trainer.state.global_step == 1
    losses = _losses(trainer)
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert _moved(model, before), "one optimisation step changed no weight"


def test_kto_takes_one_step_on_the_kto_export(tiny: tuple[Path, Any, Path], tmp_path: Path) -> None:
    from trl import KTOConfig, KTOTrainer

    checkpoint, processor, root = tiny
    (folder,) = (root / "kto").iterdir()
    ds = datasets.load_dataset(str(folder), split="SynthWords")
    assert set(ds["label"]) == {True, False}  # both kinds of rows, as KTO needs
    model = _model(checkpoint)
    before = _snapshot(model)
    trainer = KTOTrainer(
        model=model,
        args=KTOConfig(
            output_dir=str(tmp_path),
            max_steps=1,
            per_device_train_batch_size=4,
            max_length=None,
            learning_rate=1e-2,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            activation_checkpointing=False,
        ),
        train_dataset=ds,
        processing_class=processor,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    losses = _losses(trainer)
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert _moved(model, before), "one optimisation step changed no weight"


def _recording(reward: Callable[..., list[float | None]]) -> tuple[Callable[..., Any], list[Any]]:
    calls: list[dict[str, Any]] = []

    def recorded(completions: list[Any], **kwargs: Any) -> list[float | None]:
        scores = reward(completions, **kwargs)
        calls.append({"completions": completions, "kwargs": kwargs, "scores": scores})
        return scores

    recorded.__name__ = getattr(reward, "__name__", "accuracy_reward")
    return recorded, calls


def test_grpo_takes_one_step_on_the_rl_export(tiny: tuple[Path, Any, Path], tmp_path: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    from rsieve.rewards.trl import accuracy_reward

    checkpoint, processor, root = tiny
    (folder,) = (root / "rl").iterdir()
    ds = datasets.load_dataset(str(folder), split=RL_SPLIT)
    assert {"images", "prompt", "ground_truth"} <= set(ds.column_names)
    model = _model(checkpoint)
    before = _snapshot(model)
    reward, calls = _recording(accuracy_reward)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(
            output_dir=str(tmp_path),
            max_steps=1,
            num_generations=2,
            per_device_train_batch_size=2,  # one prompt, its two completions
            max_completion_length=8,
            learning_rate=1e-2,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            activation_checkpointing=False,
        ),
        train_dataset=ds,
        processing_class=processor,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    assert calls, "the reward function was never called"
    for call in calls:
        kwargs = call["kwargs"]
        n = len(call["completions"])
        # The dataset's own columns reach the reward function, one value per completion.
        columns = ("images", "ground_truth", "references", "family", "protocol", "pass_rate", "id")
        for column in columns:
            assert column in kwargs and len(kwargs[column]) == n, column
        rows = {row["id"]: row for row in ds.remove_columns("images")}
        for i, truth in zip(kwargs["id"], kwargs["ground_truth"], strict=True):
            assert truth == rows[i]["ground_truth"]
        assert len(call["scores"]) == n
        assert all(isinstance(s, float) for s in call["scores"])
    losses = _losses(trainer)
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert any("rewards/accuracy_reward/mean" in entry for entry in trainer.state.log_history)
    # Random weights answer nonsense, so both completions usually score 0.0: a group whose
    # completions score alike has no advantage and (beta 0) no gradient. The step is
    # asserted by its count and its logged loss; the weights only where rewards differed.
    if any(len(set(call["scores"])) > 1 for call in calls):
        assert _moved(model, before)
