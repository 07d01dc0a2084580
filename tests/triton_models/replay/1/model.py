"""replay (tests only): recorded outputs behind the rsieve text-generation interface.

Reads a JSON object mapping key -> ``{"text": str, "finish_reason": str}`` from the file
named by the model-config parameter ``replay_file`` or, when that is empty, the environment
variable ``RSIEVE_REPLAY_FILE``. The key of a request row is
``sha256(prompt utf-8 bytes + b"\\0" + image bytes).hexdigest()`` (image bytes empty when
the optional ``image`` input is absent); ``rsieve_cli.local.replay.replay_key`` computes it.
The file is re-read when it changes. An unknown key is an error for that request only.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils


def replay_key(prompt: bytes, image: bytes) -> str:
    return hashlib.sha256(prompt + b"\0" + image).hexdigest()


class RequestError(Exception):
    """A problem with one request, reported to that request only."""


class TritonPythonModel:
    """Answers each request with its recorded output."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        param = config.get("parameters", {}).get("replay_file", {}).get("string_value", "")
        path = param or os.environ.get("RSIEVE_REPLAY_FILE", "")
        if not path:
            raise pb_utils.TritonModelException(
                "replay: set the replay_file parameter or RSIEVE_REPLAY_FILE"
            )
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._records: dict[str, dict[str, str]] = {}
        self._load()

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            st = self.path.stat()
        except OSError as exc:
            raise RequestError(f"replay: cannot read replay file {self.path}: {exc}") from exc
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise RequestError(f"replay: {self.path} must hold a JSON object")
            self._records = data
            self._stamp = stamp
        return self._records

    def _answer(self, request: Any) -> Any:
        prompt = pb_utils.get_input_tensor_by_name(request, "prompt")
        if prompt is None:
            raise RequestError("replay: the prompt input is required")
        prompts = prompt.as_numpy().reshape(-1)
        image = pb_utils.get_input_tensor_by_name(request, "image")
        images = image.as_numpy().reshape(-1) if image is not None else [b""] * len(prompts)
        if len(images) != len(prompts):
            raise RequestError(f"replay: {len(prompts)} prompts but {len(images)} images")
        records = self._load()
        texts: list[bytes] = []
        finishes: list[bytes] = []
        for raw_prompt, raw_image in zip(prompts, images, strict=True):
            key = replay_key(bytes(raw_prompt), bytes(raw_image))
            record = records.get(key)
            if record is None:
                raise RequestError(f"replay: no recorded output for key {key}")
            texts.append(str(record["text"]).encode("utf-8"))
            finishes.append(str(record.get("finish_reason", "stop")).encode("utf-8"))
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text", np.array(texts, dtype=np.object_).reshape(-1, 1)),
                pb_utils.Tensor(
                    "finish_reason", np.array(finishes, dtype=np.object_).reshape(-1, 1)
                ),
            ]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        # RSIEVE_REPLAY_DELAY_S stands in for a real model's time per batch, so fault tests
        # can stop a worker while its shard is in flight.
        delay = float(os.environ.get("RSIEVE_REPLAY_DELAY_S", "0") or 0)
        if delay > 0:
            time.sleep(delay)
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:  # noqa: BLE001 - one failing request must not fail the batch
                message = str(exc) if isinstance(exc, RequestError) else f"replay: {exc!r}"
                error = pb_utils.TritonError(message)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        return responses
