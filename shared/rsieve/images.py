"""Preparing an image once for the model: the exact bytes sent, their hash and shape.

`prepare_image(data, max_side=..., max_pixels=...)` decodes with a pixel limit (checked
from the header before any decode), and returns the bytes to send:

- as they are, when they are already what a VLM processor takes without change: PNG or
  JPEG, RGB or grayscale, no EXIF rotation, longest side within `max_side`. Re-encoding
  those would change nothing the model sees (a lossless PNG) or lose detail (JPEG).
- otherwise re-encoded as PNG after EXIF orientation, transparency composited on white,
  conversion to RGB and a Lanczos resize of the longest side to `max_side`.

Pure: bytes in, bytes out; the generator records `sha256` and the shape with every
generation, so what the model saw is known exactly.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps

__all__ = [
    "IMAGE_FORMATS",
    "MAX_PIXELS",
    "ImageError",
    "PreparedImage",
    "image_mime",
    "prepare_image",
]

# The only formats Pillow may open for rsieve (its other decoders are attack surface no pool
# needs); anything else is `unreadable_image`.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
# The pixel count above which an image is image_too_large (the default of the setting
# image_max_pixels), read from its header before any decode.
MAX_PIXELS = 40_000_000

_AS_IS_FORMATS = {"PNG", "JPEG"}
_AS_IS_MODES = {"RGB", "L"}
_ORIENTATION = 0x0112


class ImageError(ValueError):
    """The image cannot be prepared: `reason` is its quarantine reason, `unreadable_image`
    (undecodable) or `image_too_large` (over the pixel limit)."""

    def __init__(self, message: str, reason: str = "unreadable_image") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PreparedImage:
    data: bytes
    sha256: str
    width: int
    height: int
    format: str
    reencoded: bool

    def meta(self) -> dict[str, object]:
        return {
            "sha256": self.sha256,
            "bytes": len(self.data),
            "width": self.width,
            "height": self.height,
            "format": self.format,
            "reencoded": self.reencoded,
        }


def _done(data: bytes, img: Image.Image, fmt: str, reencoded: bool) -> PreparedImage:
    return PreparedImage(
        data, hashlib.sha256(data).hexdigest(), img.width, img.height, fmt, reencoded
    )


def prepare_image(data: bytes, *, max_side: int, max_pixels: int) -> PreparedImage:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img: Image.Image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            if img.width * img.height > max_pixels:
                raise ImageError(
                    f"{img.width}x{img.height} exceeds {max_pixels} pixels", "image_too_large"
                )
            img.load()
    except ImageError:
        raise
    except Exception as exc:
        raise ImageError(f"cannot decode image: {type(exc).__name__}: {exc}") from exc
    fmt = img.format or ""
    rotated = img.getexif().get(_ORIENTATION, 1) not in (0, 1)
    if (
        fmt in _AS_IS_FORMATS
        and img.mode in _AS_IS_MODES
        and not rotated
        and max(img.size) <= max_side
    ):
        return _done(data, img, fmt, reencoded=False)
    img = ImageOps.exif_transpose(img)
    if img.mode in {"RGBA", "LA", "PA"} or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    img = img.convert("RGB")
    if max(img.size) > max_side:
        scale = max_side / max(img.size)
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        img = img.resize(size, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return _done(buf.getvalue(), img, "PNG", reencoded=True)


# Leading bytes of the formats an image may be sent in, and their media types.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


def image_mime(data: bytes) -> str:
    """The media type of encoded image bytes, from their leading bytes (a `data:` URL's
    type); application/octet-stream when none is known."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    return "application/octet-stream"
