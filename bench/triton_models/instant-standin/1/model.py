"""instant-standin (benchmarks only): a STAND-IN for a generator VLM, not a model.

It answers every request at once, so that a benchmark of the pipeline (bench/bench_scale.py)
measures the rsieve services' own cost with the model's time near zero. The answer, in the
rsieve interface, is ``<think>instant stand-in</think>`` followed by the text of the
image's PNG tEXt chunk ``bench-answer`` (a benchmark pool chooses which items the verifier
accepts), else ``unknown``. The image is not decoded.
"""

from __future__ import annotations

from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils

KEYWORD = b"bench-answer"


def png_text(data: bytes, keyword: bytes = KEYWORD) -> bytes | None:
    """The text of a PNG tEXt chunk, without decoding the image: the chunk's length field
    (4 bytes before its type) bounds the text after ``keyword\\0``."""
    at = data.find(keyword + b"\0")
    if at < 8 or data[at - 4 : at] != b"tEXt":
        return None
    length = int.from_bytes(data[at - 8 : at - 4], "big")
    return data[at + len(keyword) + 1 : at + length]


def answer(image: bytes) -> bytes:
    return b"<think>instant stand-in</think>" + (png_text(image) or b"unknown")


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "prompt").as_numpy().reshape(-1)
            image = pb_utils.get_input_tensor_by_name(request, "image")
            images = image.as_numpy().reshape(-1) if image is not None else [b""] * len(rows)
            text = np.array([[answer(bytes(i))] for i in images], dtype=np.object_)
            finish = np.array([[b"stop"]] * len(rows), dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("text", text),
                        pb_utils.Tensor("finish_reason", finish),
                    ]
                )
            )
        return responses
