"""fixed-latency-vlm (benchmarks only): a stand-in for a GPU VLM that takes a fixed time
per batch, named for what it is.

Each batch (up to ``max_batch_size`` requests, formed by Triton's dynamic batcher) is held
for ``delay_s`` whatever its size, the way a GPU decodes a batch in about the time of one
request. The ideal rate is therefore max_batch_size / delay_s, and anything below it is
time the pipeline left the "GPU" idle or under-filled.

Answers in the rsieve interface: ``<think>fixed-latency stand-in</think>`` followed by the
text after the last ``ANSWER:`` in the prompt when there is one (so a benchmark pool can
choose which items the verifier accepts), else ``unknown``. The optional image is read
and ignored. Batch sizes and counts are in Triton's own metrics
(``nv_inference_exec_count``, ``nv_inference_request_success``,
``nv_inference_pending_request_count``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils

MARK = b"ANSWER:"


def answer(prompt: bytes) -> bytes:
    _, found, tail = prompt.rpartition(MARK)
    text = tail.strip().splitlines()[0] if found and tail.strip() else b"unknown"
    return b"<think>fixed-latency stand-in</think>" + text


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        value = config.get("parameters", {}).get("delay_s", {}).get("string_value", "")
        self.delay = float(value or os.environ.get("RSIEVE_FIXED_LATENCY_S") or 0.25)

    def execute(self, requests: list[Any]) -> list[Any]:
        deadline = time.monotonic() + self.delay
        responses = []
        for request in requests:
            prompts = pb_utils.get_input_tensor_by_name(request, "prompt").as_numpy()
            rows = prompts.reshape(-1)
            text = np.array([[answer(bytes(p))] for p in rows], dtype=np.object_)
            finish = np.array([[b"stop"]] * len(rows), dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("text", text),
                        pb_utils.Tensor("finish_reason", finish),
                    ]
                )
            )
        time.sleep(max(0.0, deadline - time.monotonic()))
        return responses
