"""rsieve.hashindex: the perceptual hash, its text form, and the multi-index Hamming search
checked against brute force (random hashes with planted near neighbours), its ordering, its
updates and its binary form."""

from __future__ import annotations

import io
import random
import struct
import zlib

import imagehash
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from rsieve import hashindex
from rsieve.hashindex import (
    HashIndex,
    hamming,
    hash_hex,
    parse_hash,
    perceptual_hash,
)

MASK = (1 << 64) - 1


def flip(rng: random.Random, h: int, k: int) -> int:
    for bit in rng.sample(range(64), k):
        h ^= 1 << bit
    return h


def brute(stored: list[tuple[int, str]], q: int, radius: int) -> list[tuple[str, int]]:
    hits = [(hamming(h, q), row, key) for row, (h, key) in enumerate(stored)]
    return [(key, d) for d, _, key in sorted(hits) if d <= radius]


def clustered(rng: random.Random, n: int, max_radius: int) -> list[int]:
    """Random hashes, each cluster with neighbours at every distance up to max_radius + 2."""
    out: list[int] = []
    while len(out) < n:
        base = rng.getrandbits(64)
        out.append(base)
        out.extend(flip(rng, base, rng.randint(0, max_radius + 2)) for _ in range(5))
    return out[:n]


# --------------------------------------------------------------------------- the index


@pytest.mark.parametrize("pending_rows", [8, 100_000], ids=["tables", "linear-tail"])
def test_near_equals_brute_force_for_every_radius(
    monkeypatch: pytest.MonkeyPatch, pending_rows: int
) -> None:
    # Small PENDING_ROWS: most rows are in the block tables, rebuilt as adds go on; large:
    # every row is in the linear tail. Both must answer exactly as brute force.
    monkeypatch.setattr(hashindex, "PENDING_ROWS", pending_rows)
    rng = random.Random(7)
    index = HashIndex(max_radius=12)
    stored: list[tuple[int, str]] = []
    hashes = clustered(rng, 1500, 12)
    for i, h in enumerate(hashes):
        index.add(h, f"k{i}")
        stored.append((h, f"k{i}"))
        if i % 250 == 249:  # queries between adds: tables and tail both in play
            for _ in range(10):
                q = flip(rng, rng.choice(hashes[: i + 1]), rng.randint(0, 14))
                r = rng.randint(0, 12)
                assert index.near(q, r) == brute(stored, q, r)
    assert len(index) == 1500
    for _ in range(40):
        q = flip(rng, rng.choice(hashes), rng.randint(0, 14))
        for r in range(13):
            assert index.near(q, r) == brute(stored, q, r)
    for _ in range(10):
        q = rng.getrandbits(64)
        assert index.near(q, 12) == brute(stored, q, 12)


def brute_any(stored: list[tuple[int, str]], qs: list[int], radius: int) -> list[tuple[str, int]]:
    hits = [(min(hamming(h, q) for q in qs), row, key) for row, (h, key) in enumerate(stored)]
    return [(key, d) for d, _, key in sorted(hits) if d <= radius]


@pytest.mark.parametrize("pending_rows", [8, 100_000], ids=["tables", "linear-tail"])
def test_near_any_equals_brute_force_least_distance_to_any(
    monkeypatch: pytest.MonkeyPatch, pending_rows: int
) -> None:
    """Several hashes in one pass (an image's crop hashes): each stored row once, at its
    least distance to any of them, in the order `near` gives."""
    monkeypatch.setattr(hashindex, "PENDING_ROWS", pending_rows)
    rng = random.Random(11)
    index = HashIndex(max_radius=12)
    hashes = clustered(rng, 1200, 12)
    stored = [(h, f"k{i}") for i, h in enumerate(hashes)]
    for h, key in stored:
        index.add(h, key)
    for _ in range(60):
        qs = [flip(rng, rng.choice(hashes), rng.randint(0, 14)) for _ in range(rng.randint(1, 10))]
        r = rng.randint(0, 12)
        assert index.near_any(qs, r) == brute_any(stored, qs, r)
        assert index.near_any(qs[:1], r) == index.near(qs[0], r)
    assert index.near_any([], 12) == []


@settings(max_examples=40, deadline=None)
@given(
    max_radius=st.integers(0, 16),
    base=st.integers(0, MASK),
    flips=st.lists(st.lists(st.integers(0, 63), max_size=18), min_size=1, max_size=40),
    query_flips=st.lists(st.integers(0, 63), max_size=18),
    data=st.data(),
)
def test_near_property(
    max_radius: int,
    base: int,
    flips: list[list[int]],
    query_flips: list[int],
    data: st.DataObject,
) -> None:
    stored = []
    for i, bits in enumerate(flips):
        h = base
        for b in bits:
            h ^= 1 << b
        stored.append((h, f"row{i % 7}"))  # repeated keys: rows stay distinct
    index = HashIndex(max_radius=max_radius)
    half = len(stored) // 2
    for h, key in stored[:half]:
        index.add(h, key)
    index._reindex()  # the first half in the tables, the rest in the tail
    for h, key in stored[half:]:
        index.add(h, key)
    q = base
    for b in query_flips:
        q ^= 1 << b
    r = data.draw(st.integers(0, max_radius))
    assert index.near(q, r) == brute(stored, q, r)


def test_keys_distances_and_order() -> None:
    index = HashIndex(max_radius=8)
    h = 0x0123_4567_89AB_CDEF
    index.add(h ^ 0b111, "three")
    index.add(h, "exact-1")
    index.add(h ^ (1 << 63), "one")
    index.add(h, "exact-2")
    index.add(h ^ 0xFF, "eight")
    index.add(h ^ 0x1FF, "nine")
    index.add(h ^ (1 << 40), "one-b")
    assert index.near(h, 8) == [
        ("exact-1", 0),
        ("exact-2", 0),
        ("one", 1),
        ("one-b", 1),
        ("three", 3),
        ("eight", 8),
    ]
    assert index.near(h, 0) == [("exact-1", 0), ("exact-2", 0)]
    assert index.near(~h & MASK, 8) == []
    assert HashIndex().near(h, 12) == []


def test_flips_spread_over_blocks_are_found() -> None:
    # 12 flips, 3 in each 16-bit block: the pigeonhole bound's worst case at radius 12.
    h = 0xDEAD_BEEF_0BAD_F00D
    q = h
    for block in range(4):
        for bit in (0, 5, 11):
            q ^= 1 << (16 * block + bit)
    index = HashIndex(max_radius=12)
    for i in range(5000):  # enough rows for the block tables
        index.add(random.Random(i).getrandbits(64), f"noise{i}")
    index.add(h, "target")
    assert ("target", 12) in index.near(q, 12)
    assert ("target", 12) not in index.near(q, 11)


def test_round_trip_through_bytes() -> None:
    rng = random.Random(3)
    index = HashIndex(max_radius=10)
    keys = ["plain", "名前\tq", "emoji 🙂", "", "tab\tsep\nline"]
    stored = []
    for i, h in enumerate(clustered(rng, 600, 10)):
        key = f"{keys[i % len(keys)]}{i}"
        index.add(h, key)
        stored.append((h, key))
    blob = index.to_bytes()
    assert blob[:4] == b"RSHX"
    assert len(blob) == 28 + 12 * 600 + sum(len(k.encode()) for _, k in stored)
    back = HashIndex.from_bytes(blob)
    assert len(back) == 600 and back.max_radius == 10
    assert back.to_bytes() == blob
    for _ in range(30):
        q = flip(rng, rng.choice(stored)[0], rng.randint(0, 12))
        r = rng.randint(0, 10)
        assert back.near(q, r) == index.near(q, r) == brute(stored, q, r)
    # still updatable after a load (growth from an exact-size array)
    back.add(stored[0][0], "late")
    assert back.near(stored[0][0], 0)[-1] == ("late", 0)
    empty = HashIndex.from_bytes(HashIndex(max_radius=3).to_bytes())
    assert len(empty) == 0 and empty.max_radius == 3 and empty.near(5, 3) == []
    one = HashIndex.from_bytes(_one_row())
    one.add(1, "b")
    one.add(3, "c")
    assert one.near(0, 2) == [("a", 0), ("b", 1), ("c", 2)]


def _one_row() -> bytes:
    index = HashIndex(max_radius=4)
    index.add(0, "a")
    return index.to_bytes()


def _forge(hashes: list[int], lens: list[int], blob: bytes, version: int = 1) -> bytes:
    payload = struct.pack(f"<{len(hashes)}Q", *hashes) + struct.pack(f"<{len(lens)}I", *lens)
    payload += blob
    header = struct.pack(
        "<4sHHQQI", b"RSHX", version, 8, len(hashes), len(blob), zlib.crc32(payload)
    )
    return header + payload


def test_from_bytes_refuses_anything_else() -> None:
    good = _one_row()
    assert HashIndex.from_bytes(_forge([1, 2], [1, 2], b"abc")).near(1, 0) == [("a", 0)]
    bad = {
        "short": good[:10],
        "magic": b"XXXX" + good[4:],
        "truncated": good[:-1],
        "extra": good + b"\0",
        "checksum": good[:-1] + bytes([good[-1] ^ 1]),
        "version": _forge([1], [1], b"a", version=2),
        "lengths": _forge([1, 2], [1, 1], b"abc"),
        "utf8": _forge([1], [2], b"\xff\xfe"),
        "split character": _forge([1, 2], [1, 1], "é".encode()),
        "pickle": b"\x80\x04\x95" + good[3:],
    }
    for name, data in bad.items():
        with pytest.raises(ValueError):
            HashIndex.from_bytes(data)
        assert name


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        HashIndex(max_radius=-1)
    with pytest.raises(ValueError):
        HashIndex(max_radius=hashindex.RADIUS_LIMIT + 1)
    index = HashIndex(max_radius=6)
    for h in (-1, 1 << 64, 1.5, "ff", True):
        with pytest.raises(ValueError):
            index.add(h, "k")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        index.add(1, 7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        index.near(1, 7)
    with pytest.raises(ValueError):
        index.near(1, -1)
    index.add(np.uint64(MASK), "numpy")  # type: ignore[arg-type]
    assert index.near(MASK, 0) == [("numpy", 0)]
    assert repr(index) == "HashIndex(max_radius=6, hashes=1)"


def test_hex_form_and_hamming() -> None:
    assert hash_hex(0) == "0" * 16
    assert hash_hex(0xAB) == "00000000000000ab"
    assert hash_hex(MASK) == "f" * 16
    for h in (0, 1, 0xAB, MASK, 0x8000_0000_0000_0000):
        assert parse_hash(hash_hex(h)) == h
    assert parse_hash("ABCDEF0123456789") == 0xABCDEF0123456789
    for text in ("", "ab", "0x00000000000000ab", "g" * 16, "0" * 17, "+000000000000001"):
        with pytest.raises(ValueError):
            parse_hash(text)
    with pytest.raises(ValueError):
        hash_hex(1 << 64)
    assert hamming(0, MASK) == 64 and hamming(0b1011, 0b0001) == 2 and hamming(5, 5) == 0


# --------------------------------------------------------------------------- the perceptual hash


def _scene(seed: int, size: tuple[int, int] = (160, 120)) -> Image.Image:
    rng = random.Random(seed)
    img = Image.new("RGB", size, (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
        x1, y1 = x0 + rng.randrange(20, 80), y0 + rng.randrange(20, 60)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
    return img


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_perceptual_hash_is_imagehash_phash() -> None:
    img = _scene(1)
    data = _encode(img, "PNG")
    h = perceptual_hash(data)
    assert h == int(str(imagehash.phash(img, hash_size=8)), 16)
    assert 0 <= h <= MASK and parse_hash(hash_hex(h)) == h


def test_jpeg_copy_is_near_and_other_images_are_far() -> None:
    for seed in range(3):
        img = _scene(seed)
        png = perceptual_hash(_encode(img, "PNG"))
        jpeg = perceptual_hash(_encode(img, "JPEG", quality=80))
        assert hamming(png, jpeg) <= 4
    others = [perceptual_hash(_encode(_scene(seed), "PNG")) for seed in (10, 11, 12, 13)]
    assert all(hamming(a, b) > 16 for i, a in enumerate(others) for b in others[i + 1 :])
    # every such hash has 32 of 64 bits set (the DCT median splits the 64 coefficients)
    assert all(h.bit_count() == 32 for h in others)


def test_images_without_low_frequency_detail_share_one_hash() -> None:
    # Documented degenerate case: a flat image, or one varying along one axis only, has
    # (almost) all its low-frequency DCT coefficients tied at the median; only the DC term
    # is above it, so they all hash to 1 << 63 and match each other.
    flat = Image.new("RGB", (90, 60), (120, 200, 40))
    gradient = Image.new("L", (128, 128))
    gradient.putdata([y * 2 for y in range(128) for x in range(128)])
    assert perceptual_hash(_encode(flat, "PNG")) == 1 << 63
    assert perceptual_hash(_encode(gradient, "PNG")) == 1 << 63


def test_transparency_and_grayscale_are_hashed() -> None:
    rgba = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    ImageDraw.Draw(rgba).rectangle((10, 10, 40, 50), fill=(200, 30, 30, 255))
    on_white = Image.new("RGB", (64, 64), "white")
    on_white.paste(rgba, mask=rgba)
    assert perceptual_hash(_encode(rgba, "PNG")) == perceptual_hash(_encode(on_white, "PNG"))
    gray = _scene(4).convert("L")
    assert perceptual_hash(_encode(gray, "PNG")) == perceptual_hash(_encode(gray, "BMP"))


def test_unreadable_bytes_raise_value_error() -> None:
    png = _encode(_scene(2), "PNG")
    ico = _encode(_scene(2, (32, 32)), "ICO")  # a Pillow format rsieve does not accept
    for data in (b"", b"not an image", png[:60], ico):
        with pytest.raises(ValueError):
            perceptual_hash(data)
    with pytest.raises(ValueError, match="exceeds"):
        perceptual_hash(png, max_pixels=100)
    assert perceptual_hash(png, max_pixels=160 * 120) == perceptual_hash(png)
