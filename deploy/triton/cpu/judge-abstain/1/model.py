"""judge-abstain: the CPU stack's stand-in judge, named for what it does.

No language model can be served on the CPU stack, so this model answers every prompt with
``<think>No language model is served on this CPU stack; the judge abstains.</think>UNSURE``
and ``finish_reason`` ``"stop"``. Only a CORRECT verdict promotes a candidate, so an
abstaining judge can never promote a wrong answer. The optional ``image`` is ignored.
"""

from __future__ import annotations

import os
import site
import sys
from typing import Any


def _add_site_packages() -> None:
    """Put the site-packages named in ``RSIEVE_TRITON_SITE_PACKAGES`` first on ``sys.path``.

    The Triton Python-backend stub embeds the system libpython in isolated mode (it ignores
    ``PYTHONPATH``), so ``rsieve.local.processes.start_triton`` names the venv's
    site-packages in this variable instead. Unset (a production Triton image): a no-op.
    """
    paths = os.environ.get("RSIEVE_TRITON_SITE_PACKAGES", "").split(os.pathsep)
    for path in reversed([p for p in paths if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
            site.addsitedir(path)  # also runs the .pth files there


_add_site_packages()

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

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
            except Exception as exc:  # one failing request must not fail the batch
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        return responses
