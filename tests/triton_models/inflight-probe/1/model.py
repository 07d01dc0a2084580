"""inflight-probe (tests only): answers ``<think>executed in a batch of N</think>N``.

One instance holds each batch for ``delay_s`` (parameter, else RSIEVE_PROBE_DELAY_S, else
0.3 s), so the requests a client keeps in flight queue up and are executed together: the
batch sizes reported measure the client's real concurrency. Needs no third-party package
beyond numpy.
"""

from __future__ import annotations

import json
import os
import site
import sys
import time
from typing import Any


def _add_site_packages() -> None:
    """Put the site-packages named in ``RSIEVE_TRITON_SITE_PACKAGES`` first on ``sys.path``
    (the Python-backend stub ignores ``PYTHONPATH``). Unset: a no-op."""
    paths = os.environ.get("RSIEVE_TRITON_SITE_PACKAGES", "").split(os.pathsep)
    for path in reversed([p for p in paths if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
            site.addsitedir(path)


_add_site_packages()

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


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
