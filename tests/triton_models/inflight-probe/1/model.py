"""inflight-probe (tests only): answers ``<think>executed in a batch of N</think>N``.

One instance holds each batch for ``delay_s`` (parameter, else RSIEVE_PROBE_DELAY_S, else
0.3 s), so the requests a client keeps in flight queue up and are executed together: the
batch sizes reported measure the client's real concurrency. Needs no third-party package
beyond numpy.
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


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        value = config.get("parameters", {}).get("delay_s", {}).get("string_value", "")
        self.delay = float(value or os.environ.get("RSIEVE_PROBE_DELAY_S") or 0.3)

    def execute(self, requests: list[Any]) -> list[Any]:
        time.sleep(self.delay)
        rows = [
            pb_utils.get_input_tensor_by_name(r, "prompt").as_numpy().shape[0] for r in requests
        ]
        size = sum(rows)
        text = f"<think>executed in a batch of {size}</think>{size}".encode()
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("text", np.array([[text]] * n, dtype=np.object_)),
                    pb_utils.Tensor("finish_reason", np.array([[b"stop"]] * n, dtype=np.object_)),
                ]
            )
            for n in rows
        ]
