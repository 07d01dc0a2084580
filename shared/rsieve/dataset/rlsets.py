"""RL prompt sets from a run (`rsieve export RUN --format rl`): one row per item that got an
answer, with everything its reward needs, for GRPO/DAPO-style training with verifiable
rewards. Pure: a settled outcome (the judge stage's) and its image in, a row out.

An item is kept when its pass rate (the share of its samples the verifier accepted under
the training rule: what the reward scores 1.0, rsieve.dataset.preference.pass_rate) lies
strictly inside the band, by default (0, 1): an item every sample got right or every
sample got wrong gives a GRPO group no signal (DAPO's dynamic sampling drops such groups;
EasyR1's online filter keeps mean scores in (0.01, 0.99)). The card counts the others as
`too_easy` / `too_hard`; an item whose reference no protocol form can be read from is left
out `unparseable_reference` (a reward could only guess there).

The ground truth is `rsieve.rewards.GroundTruth`, encoded as one JSON string: the
references, the protocol, the options, the training rule, the family. The same string is
in every layout, and `rsieve.rewards` decodes it; the layouts (`LAYOUTS`) differ only in
where each trainer reads things:

- `trl`: GRPOTrainer's conversational `prompt` (image placeholder, question), `images`;
  every other column reaches the reward function as a keyword argument;
- `verl`: `data_source` `rsieve/<family>`, `prompt` with exactly one `<image>` per image,
  `images` as `[{"bytes": ...}]`, `ability`, `reward_model` `{"style": "rule",
  "ground_truth": ...}`, `extra_info`;
- `easyr1`: `problem` (`<image>` then the question), `answer` (the ground truth), `images`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import datasets

from rsieve.dataset.preference import MESSAGE, item_samples, pass_rate, prompt_messages
from rsieve.rewards import encode, ground_truth_of, reference_parseable
from rsieve.schemas import Outcome

__all__ = [
    "IMAGE_TOKEN",
    "LAYOUTS",
    "Band",
    "RlCounts",
    "layout_features",
    "rl_row",
]

Layout = Literal["trl", "verl", "easyr1"]
LAYOUTS: tuple[Layout, ...] = ("trl", "verl", "easyr1")
# verl's and EasyR1's placeholder: each stands for one image of the row.
IMAGE_TOKEN = "<image>"

_OPTIONS = datasets.List({"label": datasets.Value("string"), "text": datasets.Value("string")})
_COMMON = {
    "id": datasets.Value("string"),
    "family": datasets.Value("string"),
    "protocol": datasets.Value("string"),
    "references": datasets.List(datasets.Value("string")),
    "options": _OPTIONS,
    "training_rule": datasets.Value("string"),
    "ground_truth": datasets.Value("string"),
    "pass_rate": datasets.Value("float64"),
    "samples": datasets.Value("int64"),
    "run": datasets.Value("string"),
}


def layout_features(layout: Layout) -> datasets.Features:
    """The columns of a layout's rows."""
    if layout == "trl":
        return datasets.Features(
            {"images": datasets.List(datasets.Image()), "prompt": MESSAGE, **_COMMON}
        )
    if layout == "verl":
        return datasets.Features(
            {
                "data_source": datasets.Value("string"),
                "prompt": datasets.List(
                    {"role": datasets.Value("string"), "content": datasets.Value("string")}
                ),
                "images": datasets.List({"bytes": datasets.Value("binary")}),
                "ability": datasets.Value("string"),
                "reward_model": {
                    "style": datasets.Value("string"),
                    "ground_truth": datasets.Value("string"),
                },
                "extra_info": {
                    "index": datasets.Value("int64"),
                    "id": datasets.Value("string"),
                    "family": datasets.Value("string"),
                    "pass_rate": datasets.Value("float64"),
                    "samples": datasets.Value("int64"),
                    "run": datasets.Value("string"),
                },
            }
        )
    if layout == "easyr1":
        return datasets.Features(
            {
                "problem": datasets.Value("string"),
                "answer": datasets.Value("string"),
                "images": datasets.List(datasets.Image()),
                **{k: v for k, v in _COMMON.items() if k != "ground_truth"},
            }
        )
    raise ValueError(f"unknown layout {layout!r}; known: {list(LAYOUTS)}")


@dataclass(frozen=True)
class Band:
    """Pass rates kept: strictly between `low` and `high`."""

    low: float = 0.0
    high: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(
                f"the pass-rate band must satisfy 0 <= LOW < HIGH <= 1, not {self.low} {self.high}"
            )

    def place(self, rate: float) -> str:
        if rate <= self.low:
            return "too_hard"
        if rate >= self.high:
            return "too_easy"
        return "kept"


@dataclass
class RlCounts:
    """One family's figures for the export card."""

    items: int = 0
    kept: int = 0
    too_easy: int = 0
    too_hard: int = 0
    unparseable_reference: int = 0
    image_token_in_question: int = 0

    def count(self, place: str) -> None:
        self.items += 1
        setattr(self, place, getattr(self, place) + 1)


def rl_row(
    head: Outcome,
    image_bytes: bytes,
    *,
    training_rule: str,
    band: Band,
    layout: Layout,
    index: int = 0,
    run: str = "",
) -> tuple[dict[str, Any] | None, str]:
    """One settled item's row in `layout` (None when it is left out) and where it went:
    `kept`, `too_easy`, `too_hard`, `unparseable_reference` or (verl, EasyR1)
    `image_token_in_question` (the question itself holds `<image>`: the trainer would
    count two images)."""
    item = head.generation.item
    truth = ground_truth_of(item, training_rule)
    if not reference_parseable(truth):
        return None, "unparseable_reference"
    samples = item_samples(head)
    rate = pass_rate(samples)
    place = band.place(rate)
    if place != "kept":
        return None, place
    if layout != "trl" and IMAGE_TOKEN in item.question:
        return None, "image_token_in_question"
    encoded = encode(truth)
    common = {
        "id": item.id,
        "family": item.family,
        "protocol": item.protocol,
        "references": list(item.references),
        "options": [{"label": k, "text": v} for k, v in (item.options or {}).items()],
        "training_rule": training_rule,
        "ground_truth": encoded,
        "pass_rate": rate,
        "samples": len(samples),
        "run": run,
    }
    if layout == "trl":
        image = {"bytes": image_bytes, "path": item.image_sha256}
        return {"images": [image], "prompt": prompt_messages(item.question), **common}, place
    if layout == "verl":
        return {
            "data_source": f"rsieve/{item.family}",
            "prompt": [{"role": "user", "content": IMAGE_TOKEN + item.question}],
            "images": [{"bytes": image_bytes}],
            "ability": item.protocol,
            "reward_model": {"style": "rule", "ground_truth": encoded},
            "extra_info": {
                "index": index,
                "id": item.id,
                "family": item.family,
                "pass_rate": rate,
                "samples": len(samples),
                "run": run,
            },
        }, place
    if layout == "easyr1":
        del common["ground_truth"]
        return {
            "problem": IMAGE_TOKEN + item.question,
            "answer": encoded,
            "images": [{"bytes": image_bytes, "path": item.image_sha256}],
            **common,
        }, place
    raise ValueError(f"unknown layout {layout!r}; known: {list(LAYOUTS)}")
