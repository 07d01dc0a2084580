"""vllm-mimic (tests only): Triton's vLLM backend interface, without a language model.

Decoupled, like the vLLM backend: each request is answered on its response sender with a
final flag. It reads the inputs as the backend does (``text_input`` as given, each
``image`` element base64-decoded and opened with Pillow, ``sampling_parameters`` as JSON
of SamplingParams, the ``exclude_input_in_output`` and ``return_*`` flags) and answers,
deterministically, what it received: ``<think>`` + the sha256 of the prompt and of each
decoded image, and the sampling parameters + ``</think>MIMIC``. Like vLLM: the prompt is
prepended to ``text_output`` unless ``exclude_input_in_output`` is true; the output is cut
at ``max_tokens`` whitespace-separated "tokens" (finish reason ``length``); finish reason
and token counts are sent only when their ``return_*`` flag is true; a prompt whose count
of ``<|image_pad|>`` differs from the number of images is refused, as vLLM refuses it.
With ``stream`` true the answer comes in two responses, as the backend streams: the first
half of the words (finish reason ``None``, the backend's while it runs), then the rest
with the finish reason and the final flag; token counts are per response (the backend's
deltas), and ``exclude_input_in_output`` must be true (the backend refuses otherwise).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

PLACEHOLDER = "<|image_pad|>"


def _flag(request: Any, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else False


class RequestError(Exception):
    pass


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        if not pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"])):
            raise pb_utils.TritonModelException("vllm-mimic must be decoupled, as vLLM is")

    def _answer(self, request: Any) -> list[Any]:
        text_input = pb_utils.get_input_tensor_by_name(request, "text_input")
        if text_input is None:
            raise RequestError("text_input is required")
        prompt = bytes(text_input.as_numpy().reshape(-1)[0]).decode("utf-8")
        image = pb_utils.get_input_tensor_by_name(request, "image")
        digests = []
        for element in image.as_numpy().reshape(-1) if image is not None else []:
            try:
                data = base64.b64decode(bytes(element), validate=True)
                Image.open(io.BytesIO(data)).convert("RGB")
            except (binascii.Error, ValueError, OSError) as exc:
                raise RequestError(f"image is not base64 of an image: {exc}") from exc
            digests.append(hashlib.sha256(data).hexdigest())
        if prompt.count(PLACEHOLDER) != len(digests):
            raise RequestError(
                f"{prompt.count(PLACEHOLDER)} image placeholders in the prompt "
                f"but {len(digests)} images"
            )
        params_t = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        params = (
            json.loads(bytes(params_t.as_numpy().reshape(-1)[0]).decode("utf-8"))
            if params_t is not None
            else {}
        )
        if not isinstance(params, dict):
            raise RequestError("sampling_parameters must be a JSON object")
        body = (
            f"prompt {hashlib.sha256(prompt.encode()).hexdigest()} images "
            f"{','.join(digests) or 'none'} sampling {json.dumps(params, sort_keys=True)}"
            "</think>MIMIC"
        )
        words = body.split(" ")
        budget = int(params.get("max_tokens", 16))
        finish = "length" if len(words) > budget else "stop"
        kept = words[:budget]
        if not _flag(request, "stream"):
            generated = " ".join(kept)
            output = generated if _flag(request, "exclude_input_in_output") else prompt + generated
            return [self._response(request, output, finish, prompt, len(kept))]
        if not _flag(request, "exclude_input_in_output"):
            raise RequestError("When streaming, `exclude_input_in_output` = False is not allowed.")
        half = len(kept) // 2
        first, rest = " ".join(kept[:half]), " ".join(kept[half:])
        return [
            self._response(request, first + (" " if half else ""), "None", prompt, half),
            self._response(request, rest, finish, prompt, len(kept) - half),
        ]

    def _response(self, request: Any, text: str, finish: str, prompt: str, tokens: int) -> Any:
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))
        ]
        if _flag(request, "return_finish_reason"):
            tensors.append(
                pb_utils.Tensor("finish_reason", np.array([finish.encode()], dtype=np.object_))
            )
        if _flag(request, "return_num_input_tokens"):
            tensors.append(
                pb_utils.Tensor(
                    "num_input_tokens", np.array([len(prompt.split())], dtype=np.uint32)
                )
            )
        if _flag(request, "return_num_output_tokens"):
            tensors.append(
                pb_utils.Tensor("num_output_tokens", np.array([tokens], dtype=np.uint32))
            )
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests: list[Any]) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            try:
                responses = self._answer(request)
            except Exception as exc:  # noqa: BLE001 - this request's error only
                responses = [
                    pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"vllm-mimic: {exc}")
                    )
                ]
            for k, response in enumerate(responses):
                sender.send(response, flags=final if k == len(responses) - 1 else 0)
        return None
