"""stochastic-standin (tests only; not a model): answers the word a question names right
with probability ``p_correct`` per sample. A request with a temperature above 0 and a
seed draws from ``random.Random(seed)``; otherwise (greedy) from the prompt's sha256, the
same every time. The answer follows a think block that names what decided it."""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils

_WORD = re.compile(r"the word (\w+)")


def _column(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.p = float(config["parameters"]["p_correct"]["string_value"])

    def answer(self, prompt: str, temperature: float, seed: int | None) -> str:
        if temperature > 0 and seed is not None:
            rng, why = random.Random(seed), f"seed {seed}"
        else:
            digest = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
            rng, why = random.Random(digest), "greedy"
        named = _WORD.search(prompt)
        word = named[1] if named else "nothing"
        right = rng.random() < self.p
        return f"<think>{why}</think>{word if right else f'wrong{rng.randrange(97)}'}"

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for r in requests:
            prompts = [p.decode("utf-8") for p in _column(r, "prompt")]
            temps = _column(r, "temperature")
            seeds = _column(r, "seed")
            texts = [
                self.answer(
                    p,
                    float(temps[i]) if temps is not None else 0.0,
                    int(seeds[i]) if seeds is not None else None,
                ).encode()
                for i, p in enumerate(prompts)
            ]
            n = len(texts)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("text", np.array(texts, dtype=np.object_).reshape(n, 1)),
                        pb_utils.Tensor(
                            "finish_reason", np.array([[b"stop"]] * n, dtype=np.object_)
                        ),
                    ]
                )
            )
        return responses
