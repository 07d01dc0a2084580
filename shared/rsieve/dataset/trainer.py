"""The trainer export (`rsieve export RUN --format messages`): card-format rows to rows in
TRL's conversational vision-language format, one row per qa entry.

Pure: a card row (rsieve.compact.rows: one image, its `qa` entries, `clean_meta`) goes in with the
split it was read from; out come rows whose `images` is that row's image (the stored
bytes, passed through) and whose `messages` are one user turn (the image placeholder, then
the question) and one assistant turn (the training target):

- `think` (from `<Family>_RS_think`): `<think>\\n{reasoning}\\n</think>\\n\\n{answer}`, the
  layout Qwen3's chat templates render a reasoning turn in, so a template that splits the
  content at `</think>` gives back the same text;
- `nothink` (from `<Family>_RS_nothink`): the answer alone;
- `rejected` (from `<Family>_rejected`, only when asked): the canonical reference.

`answer` is the card row's: for accepted entries the form of the model's answer that
passed the verifier, for rejected ones the canonical reference. Every row keeps the ids
that lead back to its card row: `source_split`, `image_sha256` (the row within the split),
`qa_index` (the entry within the row), `id` (the item) and `run`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import datasets
import yaml

from rsieve.compact.splits import SPLIT_KINDS, split_name

__all__ = [
    "MESSAGES_FEATURES",
    "TRAINER_SPLITS",
    "assistant_text",
    "card_kind",
    "family_of",
    "messages_front_matter",
    "messages_rows",
    "render_messages_card",
    "trainer_split",
]

# Card split kind (rsieve.compact.splits.SPLIT_KINDS) -> the trainer export's split.
TRAINER_SPLITS = {"RS_think": "think", "RS_nothink": "nothink", "rejected": "rejected"}

MESSAGES_FEATURES = datasets.Features(
    {
        "images": datasets.List(datasets.Image()),
        "messages": datasets.List(
            {
                "role": datasets.Value("string"),
                # {"type": "image"} (text null) or {"type": "text", "text": ...}
                "content": datasets.List(
                    {"type": datasets.Value("string"), "text": datasets.Value("string")}
                ),
            }
        ),
        "family": datasets.Value("string"),
        "kind": datasets.Value("string"),
        # Back to the card-format dataset: the split, the row, the entry, the item, the run.
        "source_split": datasets.Value("string"),
        "image_sha256": datasets.Value("string"),
        "qa_index": datasets.Value("int64"),
        "id": datasets.Value("string"),
        "run": datasets.Value("string"),
    }
)


def card_kind(split: str) -> str:
    """The kind (`RS_think`, `RS_nothink`, `rejected`) of a card split name."""
    for kind in SPLIT_KINDS:
        if split.endswith("_" + kind):
            return kind
    raise ValueError(f"{split!r} is not a card split name (<Family>_<kind>, kinds {SPLIT_KINDS})")


def trainer_split(split: str) -> str:
    """The trainer export split (`think`, `nothink`, `rejected`) a card split goes to."""
    return TRAINER_SPLITS[card_kind(split)]


def family_of(split: str, families: Iterable[str] = ()) -> str:
    """The family of a card split: the one of `families` (the runs' reports) whose split
    name it is, else the split name without its kind (the same unless the family had
    characters `split_name` maps to `_`)."""
    kind = card_kind(split)
    for family in families:
        if split_name(family, kind) == split:
            return family
    return split[: -len(kind) - 1]


def assistant_text(qa: dict[str, Any], kind: str) -> str:
    """The assistant turn of a qa entry in a trainer split (`think`, `nothink`, `rejected`)."""
    answer = qa["answer"] or ""
    if kind == "think":
        return f"<think>\n{(qa['reasoning'] or '').strip()}\n</think>\n\n{answer}"
    return answer


def messages_rows(
    row: dict[str, Any], split: str, *, family: str, include_rejected: bool = False
) -> list[dict[str, Any]]:
    """The trainer rows of one card row read from `split`: one per qa entry, in order; none
    for a rejected split unless `include_rejected`."""
    kind = trainer_split(split)
    if kind == "rejected" and not include_rejected:
        return []
    run = (row.get("clean_meta") or {}).get("run") or ""
    return [
        {
            "images": [row["image"]],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "text": None},
                        {"type": "text", "text": qa["question"]},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": assistant_text(qa, kind)}],
                },
            ],
            "family": family,
            "kind": kind,
            "source_split": split,
            "image_sha256": row["image_sha256"],
            "qa_index": index,
            "id": qa["id"],
            "run": run,
        }
        for index, qa in enumerate(row["qa"])
    ]


def messages_front_matter(files: dict[str, list[str]], rows: dict[str, int]) -> dict[str, Any]:
    """The export's README YAML: one config whose splits are the trainer splits written
    (split -> data files), with the features and split sizes, as `datasets` and the Hub
    read them."""
    info = datasets.DatasetInfo(features=MESSAGES_FEATURES)._to_yaml_dict()
    order = list(TRAINER_SPLITS.values())
    names = sorted(files, key=order.index)
    info["splits"] = [{"name": s, "num_examples": rows[s]} for s in names]
    return {
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": s, "path": files[s]} for s in names],
            }
        ],
        "dataset_info": info,
        "tags": ["rejection-sampling", "vision-language", "sft", "conversational"],
    }


def render_messages_card(
    dataset: str,
    runs: list[str],
    counts: dict[str, dict[str, int]],
    *,
    include_rejected: bool,
    front_matter: dict[str, Any],
) -> str:
    """The export's README.md: the YAML front matter, how to load it, what a row holds and
    the rows per split and family (`counts`: split -> family -> rows)."""
    order = list(TRAINER_SPLITS.values())
    lines = [
        "---",
        yaml.safe_dump(front_matter, sort_keys=False).rstrip(),
        "---",
        "",
        f"# {dataset}: trainer export (messages)",
        "",
        f"The accepted rows of the rsieve dataset `{dataset}` (runs: "
        + ", ".join(f"`{r}`" for r in runs)
        + ") in TRL's conversational vision-language format, one row per question: "
        "`images` (one image), `messages` (the user turn: an image placeholder and the "
        "question; the assistant turn: the training target), `family`, `kind`, and the ids "
        "back to the card-format dataset (`source_split`, `image_sha256`, `qa_index`, `id`, "
        "`run`).",
        "",
        "- `think`: `<think>\\n{reasoning}\\n</think>\\n\\n{answer}`;",
        "- `nothink`: the answer alone;",
        "- `rejected`: the reference answer"
        + (
            " (the model's answer failed the verifier and the judge)."
            if include_rejected
            else " (not exported: `rsieve export RUN --format messages --include-rejected`)."
        ),
        "",
        "```python",
        "import datasets",
        "",
        'ds = datasets.load_dataset("path/to/this/folder")  # splits: '
        + ", ".join(s for s in order if s in counts),
        "```",
        "",
        "| split | family | rows |",
        "|---|---|---|",
    ]
    for split in sorted(counts, key=order.index):
        for family, n in sorted(counts[split].items()):
            cell = family.replace("|", "\\|")
            lines.append(f"| {split} | {cell} | {n} |")
    return "\n".join(lines) + "\n"
