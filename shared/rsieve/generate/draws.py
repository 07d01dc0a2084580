"""Best-of-n, the asking side (docs/sampling.md): the samples an item is asked. Pure.

- `draws`: the samples an item is asked, each with its own seed, derived from the run's
  base seed, the item's id and the sample's index, so a rerun asks exactly the same and a
  sample's seed does not depend on which other items share its batch.
- `circular_items`: under circular sampling, the item each sample sees, its options
  rotated.

With one sample (the default) nothing here changes anything: `draws` is `[None]`.
rsieve.compact.settle settles the samples after the verifier and the judge.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from rsieve.mcq import lettered_options, render_block
from rsieve.schemas import Item

__all__ = ["Draw", "circular_items", "draws", "rotate", "sample_seed"]


@dataclass(frozen=True)
class Draw:
    """One sample of an item: its index (0..n-1) and the seed it is asked with."""

    index: int
    seed: int


def sample_seed(base: int, item_id: str, index: int) -> int:
    """The seed of sample `index` of an item: 31 bits of sha256(base, id, index)."""
    digest = hashlib.sha256(f"{base}\0{item_id}\0{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def draws(item_id: str, samples: int, base_seed: int) -> list[Draw | None]:
    """The samples to ask for an item: `[None]` for one (the request as without
    best-of-n), else one Draw per sample."""
    if samples <= 1:
        return [None]
    return [Draw(k, sample_seed(base_seed, item_id, k)) for k in range(samples)]


def rotate(item: Item, shift: int) -> Item | None:
    """The item with its options rotated by `shift` (circular sampling, VLMEvalKit's
    CircularEval): letter i gets the text of letter i + shift, the reference letters move
    with their texts, and the question's options block is rendered again in place. The
    options are the item's, or its question's lettered block. None when it has none, or
    the block is not one line per option as rsieve.mcq renders it."""
    options = item.options or lettered_options(item.question)
    if not options or len(options) < 2:
        return None
    letters = list(options)
    block = render_block(options)
    if block not in item.question:
        return None
    m = len(letters)
    r = shift % m
    if r == 0:  # asked as it is; its options known, as every rotation's are
        return item.model_copy(update={"options": options})
    rotated = {letters[i]: options[letters[(i + r) % m]] for i in range(m)}
    moved = {letters[(i + r) % m]: letters[i] for i in range(m)}  # old letter -> new
    references = [moved.get(ref.strip().strip("().").upper(), ref) for ref in item.references]
    question = item.question.replace(block, render_block(rotated), 1)
    return item.model_copy(
        update={"question": question, "options": rotated, "references": references}
    )


def circular_items(item: Item, samples: int) -> list[Item]:
    """The item each of `samples` samples is asked about under circular sampling: sample
    k sees the options rotated by k (every rotation, in turn); an item that cannot be
    rotated is asked as it is."""
    return [rotate(item, k) or item for k in range(samples)]
