"""vlm (portable): any local Hugging Face VLM or text-only LLM behind the rsieve interface.

Triton Python backend, CPU or GPU. Loads the checkpoint folder named by the model-config
parameter ``checkpoint`` (or, when empty, the environment variable the parameter
``checkpoint_env`` names, by default RSIEVE_HF_CHECKPOINT) exactly as a user loads it. What
the checkpoint is decides how: a configuration that transformers maps to image-text-to-text
is loaded with ``AutoProcessor`` + ``AutoModelForImageTextToText``; any other with
``AutoTokenizer`` + ``AutoModelForCausalLM`` (a text-only LLM, e.g. the SmolLM2 judge of the
CPU stack). For each request it renders the checkpoint's own chat template (one user turn;
``add_generation_prompt=True``): for a VLM the content is a list (the image, then the
prompt text), for a text-only model the content is the prompt as a plain string, as such
templates read ``message['content']`` directly. A request with an image to a text-only
model is that request's error. It decodes greedily (temperature 0) up to the request's
``max_new_tokens`` (or the parameter's). Requests of a dynamic batch are generated together
(left padding), grouped by whether they carry an image and by budget.

Outputs: ``text`` (the assistant turn; when the template opened ``<think>`` for the
assistant, that opening is put back in front), ``finish_reason`` (``"stop"`` at end of
sequence, ``"length"`` at the budget), ``num_input_tokens`` and ``num_output_tokens``
(end-of-sequence token included). A bad request (undecodable or oversized image, empty
prompt) gets its own error; the others in its batch are answered.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, ImageOps

OPEN = "<think>"


def _param(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value != "" else default


class RequestError(Exception):
    """A problem with one request, reported to that request only."""


def decode_image(data: bytes, max_pixels: int, name: str = "vlm") -> Image.Image:
    if not data:
        raise RequestError(f"{name}: the image input is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > max_pixels:
                raise RequestError(
                    f"{name}: image of {img.width}x{img.height} pixels exceeds "
                    f"the limit of {max_pixels} pixels"
                )
            img.load()
    except RequestError:
        raise
    except Exception as exc:  # PIL raises many types for corrupt or unknown data
        raise RequestError(f"{name}: cannot decode image: {type(exc).__name__}: {exc}") from exc
    img = ImageOps.exif_transpose(img)
    if img.mode in {"RGBA", "LA", "PA"} or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return img.convert("RGB")


def is_image_text_to_text(path: str) -> bool:
    """Whether transformers maps the checkpoint's configuration to image-text-to-text."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    return type(AutoConfig.from_pretrained(path)) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING


class TritonPythonModel:
    """A transformers VLM or causal LM served through the rsieve interface."""

    def initialize(self, args: dict[str, str]) -> None:
        import torch

        config = json.loads(args["model_config"])
        self.name = args.get("model_name") or config.get("name") or "vlm"
        env = _param(config, "checkpoint_env", "RSIEVE_HF_CHECKPOINT")
        path = _param(config, "checkpoint", os.environ.get(env, ""))
        if not path:
            raise pb_utils.TritonModelException(
                f"{self.name}: set the checkpoint parameter or {env}"
            )
        self.max_new_tokens = int(_param(config, "max_new_tokens", "1024"))
        self.max_pixels = int(_param(config, "max_image_pixels", "40000000"))
        threads = int(_param(config, "torch_threads", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        gpu = args.get("model_instance_kind") == "GPU" and torch.cuda.is_available()
        self.device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
        dtype_name = _param(config, "dtype", "auto")
        if dtype_name == "auto":
            dtype_name = (
                ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if gpu else "float32"
            )
        self.dtype = getattr(torch, dtype_name)
        self.torch = torch
        self.multimodal = is_image_text_to_text(path)
        if self.multimodal:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            self.processor = AutoProcessor.from_pretrained(path)
            self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
            self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=self.dtype)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.processor = None
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        self.tokenizer.padding_side = "left"  # batched decoder-only generation
        self.model.to(self.device).eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pad = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else next(iter(self.eos))
        )
        if self.tokenizer.pad_token_id is None:  # padding=True needs a pad token
            self.tokenizer.pad_token_id = self.pad
        self.logger = pb_utils.Logger
        kind = "image-text-to-text" if self.multimodal else "text-only causal LM"
        self.logger.log_info(
            f"{self.name} ready: {path} ({type(self.model).__name__}, {kind}) "
            f"on {self.device} {dtype_name}, "
            f"max_new_tokens={self.max_new_tokens}"
        )

    # ------------------------------------------------------------------ rendering
    def _render(self, prompt: str, has_image: bool) -> tuple[str, str]:
        """(chat prompt, the prefix the template opened for the assistant)."""
        if self.processor is None:  # text-only: templates read message['content'] as text
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        else:
            content: list[dict[str, str]] = [{"type": "image"}] if has_image else []
            content.append({"type": "text", "text": prompt})
            text = self.processor.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
        _head, sep, tail = text.rpartition(OPEN)
        prefix = sep + tail if sep and not tail.strip() else ""
        return text, prefix

    # ------------------------------------------------------------------ generation
    def _generate(self, jobs: list[dict[str, Any]], budget: int) -> None:
        """Fill each job's text, finish reason and token counts (one batched generate)."""
        texts = [job["chat"] for job in jobs]
        if self.processor is None:
            # The rendered template already holds every special token it wants.
            enc = self.tokenizer(
                texts, return_tensors="pt", padding=True, add_special_tokens=False
            ).to(self.device)
        else:
            images = [job["image"] for job in jobs if job["image"] is not None]
            kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True}
            if images:
                kwargs["images"] = images
            enc = self.processor(**kwargs).to(self.device)
        if "pixel_values" in enc:
            enc["pixel_values"] = enc["pixel_values"].to(self.dtype)
        with self.torch.inference_mode():
            out = self.model.generate(
                **enc, max_new_tokens=budget, do_sample=False, pad_token_id=self.pad
            )
        start = enc["input_ids"].shape[1]
        for row, job in enumerate(jobs):
            ids = out[row, start:].tolist()
            stop = next((i for i, t in enumerate(ids) if t in self.eos), None)
            generated = ids[:stop] if stop is not None else ids
            job["n_out"] = stop + 1 if stop is not None else len(ids)
            job["finish"] = "stop" if stop is not None or len(ids) < budget else "length"
            job["n_in"] = int(enc["attention_mask"][row].sum())
            body = self.tokenizer.decode(generated, skip_special_tokens=False)
            job["text"] = job["prefix"] + body

    def _jobs(self, request: Any) -> list[dict[str, Any]]:
        prompt = pb_utils.get_input_tensor_by_name(request, "prompt")
        if prompt is None:
            raise RequestError(f"{self.name}: the prompt input is required")
        prompts = [bytes(p).decode("utf-8") for p in prompt.as_numpy().reshape(-1)]
        image = pb_utils.get_input_tensor_by_name(request, "image")
        raws = [bytes(x) for x in image.as_numpy().reshape(-1)] if image is not None else None
        if raws is not None and len(raws) != len(prompts):
            raise RequestError(f"{self.name}: {len(prompts)} prompts but {len(raws)} images")
        if raws is not None and not self.multimodal:
            raise RequestError(
                f"{self.name}: this checkpoint is a text-only language model; "
                "a request with an image is refused"
            )
        budget_t = pb_utils.get_input_tensor_by_name(request, "max_new_tokens")
        budgets = (
            [int(b) for b in budget_t.as_numpy().reshape(-1)]
            if budget_t is not None
            else [self.max_new_tokens] * len(prompts)
        )
        jobs = []
        for i, text in enumerate(prompts):
            if not text.strip():
                raise RequestError(f"{self.name}: the prompt is empty")
            if budgets[i] < 1:
                raise RequestError(f"{self.name}: max_new_tokens must be >= 1, got {budgets[i]}")
            img = decode_image(raws[i], self.max_pixels, self.name) if raws is not None else None
            chat, prefix = self._render(text, img is not None)
            jobs.append({"chat": chat, "prefix": prefix, "image": img, "budget": budgets[i]})
        return jobs

    def execute(self, requests: list[Any]) -> list[Any]:
        per_request: list[list[dict[str, Any]] | Exception] = []
        for request in requests:
            try:
                per_request.append(self._jobs(request))
            except Exception as exc:  # noqa: BLE001 - this request's error only
                per_request.append(exc)
        groups: dict[tuple[bool, int], list[dict[str, Any]]] = {}
        for jobs in per_request:
            if not isinstance(jobs, Exception):
                for job in jobs:
                    groups.setdefault((job["image"] is not None, job["budget"]), []).append(job)
        for (_, budget), jobs in groups.items():
            try:
                self._generate(jobs, budget)
            except Exception as exc:  # noqa: BLE001 - fail the group's requests, not all
                self.logger.log_error(f"{self.name}: generate failed: {exc!r}")
                for job in jobs:
                    job["error"] = f"{self.name}: generate failed: {type(exc).__name__}: {exc}"
        return [self._response(jobs) for jobs in per_request]

    def _response(self, jobs: list[dict[str, Any]] | Exception) -> Any:
        if isinstance(jobs, Exception):
            message = str(jobs) if isinstance(jobs, RequestError) else f"{self.name}: {jobs!r}"
            return pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(message)
            )
        failed = [job["error"] for job in jobs if "error" in job]
        if failed:
            return pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(failed[0])
            )

        def column(key: str, dtype: Any) -> Any:
            values = [job[key].encode("utf-8") if dtype is np.object_ else job[key] for job in jobs]
            return np.array(values, dtype=dtype).reshape(-1, 1)

        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text", column("text", np.object_)),
                pb_utils.Tensor("finish_reason", column("finish", np.object_)),
                pb_utils.Tensor("num_input_tokens", column("n_in", np.int32)),
                pb_utils.Tensor("num_output_tokens", column("n_out", np.int32)),
            ]
        )

    def finalize(self) -> None:
        self.model = None
