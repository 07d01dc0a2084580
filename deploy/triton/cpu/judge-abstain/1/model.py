"""judge-abstain: the CPU stack's stand-in judge, named for what it does.

No language model can be served on the CPU stack, so this model answers every prompt with
``<think>No language model is served on this CPU stack; the judge abstains.</think>UNSURE``
and ``finish_reason`` ``"stop"``. Only a CORRECT verdict promotes a candidate, so an
abstaining judge can never promote a wrong answer. The optional ``image`` is ignored.
"""

from __future__ import annotations

from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils

ANSWER = "<think>No language model is served on this CPU stack; the judge abstains.</think>UNSURE"


class TritonPythonModel:
    """Answers UNSURE to every prompt, in the rsieve text-generation interface."""

    def initialize(self, args: dict[str, str]) -> None:
        self.answer = ANSWER.encode("utf-8")

    def _answer(self, request: Any) -> Any:
        prompt = pb_utils.get_input_tensor_by_name(request, "prompt")
        if prompt is None:
            raise ValueError("judge-abstain: the prompt input is required")
        rows = prompt.as_numpy().reshape(-1).shape[0]
        text = np.array([self.answer] * rows, dtype=np.object_).reshape(-1, 1)
        finish = np.array([b"stop"] * rows, dtype=np.object_).reshape(-1, 1)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text", text),
                pb_utils.Tensor("finish_reason", finish),
            ]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:  # noqa: BLE001 - one failing request must not fail the batch
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        return responses
