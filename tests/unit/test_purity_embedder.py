"""Task purity on the real embedding model (all-MiniLM-L6-v2 on the CPU, torch imported
for it): the `model` tier, apart from the rules of tests/unit/test_clean_purity.py,
which run on a bag-of-words stand-in."""

from __future__ import annotations

from rsieve.adapters.embedder import load_embedder
from rsieve.clean.purity import PurityQuestion, measure_purity
from tests.unit.test_clean_purity import GENERAL_VQA


def test_real_embedding_model_separates_general_vqa() -> None:
    paraphrases = [
        "Copy the lettering of this crop.",
        "Give the lettering shown here.",
        "Key in the lettering from this crop.",
        "Provide the exact lettering in this crop.",
    ]
    qs = [PurityQuestion(i + 1, paraphrases[i % 4]) for i in range(24)]
    qs += [PurityQuestion(100 + i, q) for i, q in enumerate(GENERAL_VQA[3:])]
    got = measure_purity(
        "Lettering", "anls", qs, threshold=0.05, min_items=20, embed=load_embedder()
    )
    assert got.dropped_lines == [100, 101, 102]
    assert got.by_rule == {"embedding_off": 3, "embedding_on": 24}
