"""Images prepared once for the model: sent as they are when a VLM takes them unchanged,
otherwise converted, resized to the configured longest side and re-encoded as PNG."""

from __future__ import annotations

import hashlib
import io

import pytest
from PIL import Image

from rsieve.images import ImageError, prepare_image


def encode(img: Image.Image, fmt: str = "PNG", **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize(("mode", "fmt"), [("RGB", "PNG"), ("L", "PNG"), ("RGB", "JPEG")])
def test_ready_images_are_sent_byte_for_byte(mode: str, fmt: str) -> None:
    data = encode(Image.new(mode, (120, 40), "white"), fmt)
    image = prepare_image(data, max_side=512, max_pixels=10**6)
    assert image.data == data and not image.reencoded
    assert image.sha256 == hashlib.sha256(data).hexdigest()
    assert (image.width, image.height, image.format) == (120, 40, fmt)


def test_large_image_is_resized_to_the_max_side() -> None:
    data = encode(Image.new("RGB", (1000, 250), "white"))
    image = prepare_image(data, max_side=400, max_pixels=10**7)
    assert image.reencoded and (image.width, image.height) == (400, 100)
    decoded = Image.open(io.BytesIO(image.data))
    assert (decoded.format, decoded.mode, decoded.size) == ("PNG", "RGB", (400, 100))
    assert image.sha256 == hashlib.sha256(image.data).hexdigest()
    assert image.meta()["bytes"] == len(image.data)
    # Deterministic: the same input prepares to the same bytes.
    assert prepare_image(data, max_side=400, max_pixels=10**7).data == image.data


def test_transparency_is_composited_on_white() -> None:
    rgba = Image.new("RGBA", (10, 10), (0, 0, 0, 0))
    image = prepare_image(encode(rgba), max_side=64, max_pixels=10**4)
    assert image.reencoded
    assert Image.open(io.BytesIO(image.data)).getpixel((5, 5)) == (255, 255, 255)


def test_exif_rotation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = encode(Image.new("RGB", (60, 20), "white"), "JPEG", exif=exif.tobytes())
    image = prepare_image(data, max_side=512, max_pixels=10**6)
    assert image.reencoded and (image.width, image.height) == (20, 60)


def test_other_formats_are_reencoded() -> None:
    image = prepare_image(encode(Image.new("RGB", (8, 8)), "BMP"), max_side=64, max_pixels=10**4)
    assert image.reencoded and image.format == "PNG"


@pytest.mark.parametrize(
    ("data", "message"), [(b"not an image", "cannot decode"), (b"", "cannot decode")]
)
def test_undecodable_is_an_image_error(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        prepare_image(data, max_side=64, max_pixels=10**4)


def test_pixel_limit_is_checked_before_decoding() -> None:
    data = encode(Image.new("L", (200, 200)))
    with pytest.raises(ImageError, match="exceeds"):
        prepare_image(data, max_side=4096, max_pixels=200 * 199)
