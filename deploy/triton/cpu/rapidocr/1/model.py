"""rapidocr: RapidOCR (PP-OCRv4 ONNX) behind the rsieve text-generation interface.

Triton Python backend, CPU. Inputs ``prompt`` (ignored: this is an OCR model) and the
optional ``image`` (raw encoded bytes); outputs ``text`` (``<think>trace</think>answer``)
and ``finish_reason`` (always ``"stop"``). One bad request in a batch gets its own error
response; the others are answered normally.

Model-config parameters (strings): ``use_det`` ("false" = recognition only on the whole
image, the default; "true" = detection + recognition), ``max_image_pixels`` (default
40,000,000) and ``text_score`` (default 0.5).
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any

import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

# isort: split
import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, ImageOps

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
DEFAULT_TEXT_SCORE = 0.5
MAX_TRACE_ITEMS = 8


def _param(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value != "" else default


def _as_bool(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


class RequestError(Exception):
    """A problem with one request (its image), reported to that request only."""


def decode_image(data: bytes, max_pixels: int) -> Image.Image:
    """Decode encoded image bytes into an RGB image, refusing more than ``max_pixels``."""
    if not data:
        raise RequestError("rapidocr: the image input is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                raise RequestError(
                    f"rapidocr: image of {width}x{height} = {width * height} pixels exceeds "
                    f"the limit of {max_pixels} pixels"
                )
            img.load()
    except RequestError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise RequestError(
            f"rapidocr: image exceeds the limit of {max_pixels} pixels: {exc}"
        ) from exc
    except Exception as exc:  # PIL raises many types for corrupt or unknown data
        raise RequestError(f"rapidocr: cannot decode image: {type(exc).__name__}: {exc}") from exc
    img = ImageOps.exif_transpose(img)
    if img.mode in {"RGBA", "LA", "PA"} or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB")


def _show(text: str) -> str:
    """``text`` quoted for the trace; a recognised "</think>" must not close the trace."""
    return repr(text.replace("<", "\u2039").replace(">", "\u203a"))


def render(results: list[tuple[str, float]], text_score: float) -> str:
    """``<think>`` + an honest trace of what the recogniser saw + ``</think>`` + the text."""
    kept = [(t, s) for t, s in results if t.strip() and s >= text_score]
    dropped = [(t, s) for t, s in results if t.strip() and s < text_score]
    parts: list[str] = []
    if len(kept) == 1:
        text, score = kept[0]
        parts.append(f"recognised {_show(text)} with confidence {score:.2f}")
    elif kept:
        shown = ", ".join(f"{_show(t)} ({s:.2f})" for t, s in kept[:MAX_TRACE_ITEMS])
        more = f" and {len(kept) - MAX_TRACE_ITEMS} more" if len(kept) > MAX_TRACE_ITEMS else ""
        parts.append(f"recognised {len(kept)} lines: {shown}{more}")
    if dropped:
        shown = ", ".join(f"{_show(t)} ({s:.2f})" for t, s in dropped[:MAX_TRACE_ITEMS])
        parts.append(f"dropped below confidence {text_score:.2f}: {shown}")
    if not kept:
        parts.insert(0, "no text recognised")
    return "<think>" + "; ".join(parts) + "</think>" + "\n".join(t for t, _ in kept)


class TritonPythonModel:
    """RapidOCR served through the rsieve text-generation interface."""

    def initialize(self, args: dict[str, str]) -> None:
        from rapidocr_onnxruntime import RapidOCR

        config = json.loads(args["model_config"])
        self.use_det = _as_bool(_param(config, "use_det", "false"))
        self.max_pixels = int(_param(config, "max_image_pixels", str(DEFAULT_MAX_IMAGE_PIXELS)))
        self.text_score = float(_param(config, "text_score", str(DEFAULT_TEXT_SCORE)))
        Image.MAX_IMAGE_PIXELS = self.max_pixels
        self.engine = RapidOCR()
        # Warm up so the first real request does not pay for ONNX session set-up.
        warm = Image.new("RGB", (160, 48), "white")
        self.engine(warm, use_det=self.use_det, use_cls=False, use_rec=True)
        self.logger = pb_utils.Logger
        self.logger.log_info(
            f"rapidocr ready: use_det={self.use_det} max_image_pixels={self.max_pixels} "
            f"text_score={self.text_score}"
        )

    def _recognise(self, data: bytes) -> str:
        img = decode_image(data, self.max_pixels)
        result, _ = self.engine(img, use_det=self.use_det, use_cls=False, use_rec=True)
        pairs: list[tuple[str, float]] = []
        for item in result or []:
            # recognition only: [text, score]; with detection: [box, text, score]
            text, score = (item[0], item[1]) if len(item) == 2 else (item[1], item[2])
            pairs.append((str(text), float(score)))
        return render(pairs, self.text_score)

    def _answer(self, request: Any) -> Any:
        prompt = pb_utils.get_input_tensor_by_name(request, "prompt")
        image = pb_utils.get_input_tensor_by_name(request, "image")
        if image is None:
            raise RequestError("rapidocr: the image input is required (it is an OCR model)")
        images = image.as_numpy().reshape(-1)
        rows = prompt.as_numpy().reshape(-1).shape[0] if prompt is not None else len(images)
        if len(images) != rows:
            raise RequestError(f"rapidocr: {rows} prompts but {len(images)} images")
        texts = [self._recognise(bytes(raw)) for raw in images]
        text = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
        finish = np.array([b"stop"] * len(texts), dtype=np.object_).reshape(-1, 1)
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
            except RequestError as exc:
                error = pb_utils.TritonError(str(exc))
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            except Exception as exc:  # noqa: BLE001 - one failing request must not fail the batch
                self.logger.log_error(f"rapidocr: request failed: {exc!r}")
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[],
                        error=pb_utils.TritonError(f"rapidocr: {type(exc).__name__}: {exc}"),
                    )
                )
        return responses

    def finalize(self) -> None:
        self.engine = None
