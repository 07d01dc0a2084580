"""Perceptual image hashes and an index of them answering Hamming-radius queries.

`perceptual_hash(data)` is imagehash's DCT hash (`phash`, hash_size 8) of an image's bytes,
opened only as a format rsieve accepts (`rsieve.images.IMAGE_FORMATS`), after EXIF
orientation and with transparency composited on white (as `rsieve.images.prepare_image`
treats what the model sees), as a 64-bit int; `hash_hex` / `parse_hash` write and read it as
16 hex digits (imagehash's own `str(h)`). Two images are near-duplicates when their hashes
differ in few bits (`hamming`); bench/bench_phash.py measures how few on real images
(recall under JPEG re-encoding, resizing, small crops and brightness changes; false matches
between distinct images). Two properties of this hash matter to its users:

- Each bit says whether one of the 8 x 8 lowest DCT coefficients exceeds their median, so
  an image with distinct coefficients has exactly 32 bits set (every one of 352 real
  images measured), and the distance between two such hashes is even: thresholds 2k and
  2k + 1 match the same pairs.
- An image with no low-frequency detail (flat, or varying along one axis only) has its
  coefficients tied at the median: only the DC bit is set, its hash is 1 << 63, and all
  such images match each other (their bits set, `h.bit_count()`, are fewer than 32).

`HashIndex(max_radius)` answers "which stored hashes lie within Hamming distance r of h"
(r <= max_radius) by multi-index hashing (Norouzi, Punjani and Fleet, "Fast search in
Hamming space with multi-index hashing", CVPR 2012):

- Why MIH: a linear scan costs every stored hash per query (1,000,000 popcounts: some
  milliseconds in numpy, and it grows with the index); a BK-tree or VP-tree visits most
  of its nodes at the radii near-duplicate search needs (8-16 of 64 bits) and is slow to
  build and to store; LSH is approximate. MIH is exact, cheap to update and its tables
  are plain sorted arrays.
- The bound: the 64 bits are cut into m = 4 blocks of 16. If two hashes differ in at most
  r bits, one of the 4 blocks differs in at most floor(r / 4) bits (pigeonhole). So a
  query looks up, in each block's table, every 16-bit value within floor(r / 4) bits of
  its own block (1, 17, 137, 697, 2517 values for floor(r / 4) = 0..4), and verifies the
  full 64-bit distance of the candidates found. At r = 12 that is 4 x 697 lookups; with a
  million uniformly spread hashes (about 15 per 16-bit value) about 42,000 candidates.
  m = 4 (16-bit blocks, 2^16 buckets) is what the paper advises for about 2^16 to 2^24
  hashes (block length near log2 n). Real perceptual hashes are not uniform: a crowded
  block value (1 << 63 from flat images above all) costs its whole bucket on every query
  that reaches it. The cost of a query depends on its own radius (`max_radius`, at most
  `RADIUS_LIMIT`, only bounds it): floor(r / 4) = 2 (r = 8..11) costs about a fifth of
  floor(r / 4) = 3 (r = 12..15). bench/bench_hashindex.py measures it.
- Updates: a hash is appended at once (its row number is its insertion order); the block
  tables cover the first rows and are rebuilt, each by one O(n) stable radix sort of the
  16-bit block values, when the rows appended since (scanned linearly by every query)
  exceed `PENDING_ROWS` or n / 64. Interleaved add/query at a million rows costs a few
  microseconds per add amortised; `add` alone never rebuilds.
- Memory per hash: 8 bytes (the hash) + 4 x 4 bytes (the row number in each block's
  table) + 8 bytes (where its key ends) + the key's UTF-8 bytes, plus a fixed 4 x 65,537
  x 4 bytes (1 MiB) of bucket offsets, plus the growth slack of the arrays (at most half
  of the hashes array; none after `from_bytes`). About 32 bytes + the key: 48 MB held
  for a million hashes with 16-character keys (measured, slack included).

`to_bytes()` / `HashIndex.from_bytes()`: a versioned little-endian binary format (never
pickle: the index is stored in S3 and loaded by workers). The block tables are not stored
(rebuilt on load: about 0.1 s for a million hashes), so the format holds only
what cannot be derived and a load trusts nothing it reads:

    magic b"RSHX" | version u16 (1) | max_radius u16 | count u64 | key bytes u64 | crc32 u32
    | count x u64 hashes | count x u32 key lengths | key bytes (UTF-8, concatenated)

the CRC-32 covering everything after the header: 12 bytes per hash + the keys.

Pure: bytes in, numbers out; no files, network or processes.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from array import array
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps

from rsieve.images import IMAGE_FORMATS

__all__ = [
    "BLOCKS",
    "BLOCK_BITS",
    "FORMAT_VERSION",
    "HASH_BITS",
    "PENDING_ROWS",
    "RADIUS_LIMIT",
    "REFERENCE_CROPS",
    "HashIndex",
    "hamming",
    "hash_hex",
    "image_hashes",
    "informative",
    "parse_hash",
    "perceptual_hash",
    "reference_hashes",
]

HASH_BITS = 64
BLOCKS = 4
BLOCK_BITS = HASH_BITS // BLOCKS  # 16
RADIUS_LIMIT = 31  # floor(31 / 4) = 7: 26,333 values per block (the cost is the caller's)
PENDING_ROWS = 4096  # rows appended since the last rebuild that a query scans linearly
FORMAT_VERSION = 1

_MASK64 = (1 << HASH_BITS) - 1
_MAGIC = b"RSHX"
_HEADER = struct.Struct("<4sHHQQI")
_BUCKETS = 1 << BLOCK_BITS
_POP16 = np.array([bin(i).count("1") for i in range(_BUCKETS)], dtype=np.uint8)
# Every 16-bit flip mask, fewest bits first: the first _FLIPS_UPTO[s] are those with <= s bits.
_FLIPS = np.argsort(_POP16, kind="stable").astype(np.int64)
_FLIPS_UPTO = np.cumsum(np.bincount(_POP16, minlength=BLOCK_BITS + 1))

_U64 = np.dtype("<u8")
_U32 = np.dtype("<u4")
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_S1, _S2, _S4, _S56 = np.uint64(1), np.uint64(2), np.uint64(4), np.uint64(56)


# --------------------------------------------------------------------------- hashes


Crop = tuple[float, float, float, float]  # the fraction cut from the left, top, right, bottom


def _hashes(data: bytes, crops: tuple[Crop, ...], max_pixels: int | None) -> list[int]:
    """The phash of the image in `data` cropped by each of `crops`."""
    import imagehash  # scipy behind it: imported on first use, not with the module

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img: Image.Image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            if max_pixels is not None and img.width * img.height > max_pixels:
                raise ValueError(f"{img.width}x{img.height} exceeds {max_pixels} pixels")
            img.load()
            img = ImageOps.exif_transpose(img)
            if img.mode in {"RGBA", "LA", "PA"} or (img.mode == "P" and "transparency" in img.info):
                rgba = img.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                img = Image.alpha_composite(white, rgba)
            if img.mode not in {"L", "RGB"}:
                img = img.convert("RGB")
            # phash converts to "L" itself; once here, not once a crop (the same pixels).
            img = img.convert("L")
            return [int(str(imagehash.phash(_crop(img, f), hash_size=8)), 16) for f in crops]
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"cannot decode image: {type(exc).__name__}: {exc}") from exc


def _crop(img: Image.Image, sides: Crop) -> Image.Image:
    if not any(sides):
        return img
    left, top, right, bottom = sides
    w, h = img.width, img.height
    return img.crop((round(w * left), round(h * top), w - round(w * right), h - round(h * bottom)))


# A reference image (an evaluation set's) is indexed as itself and as 10 light crops of it:
# 2.5% and 5% off every side, 5% off each side alone, and 5% off each corner's two sides. A
# pool image cut unevenly (each side its own 0-5%), resized, brightened and re-encoded then
# lies near one of the eleven (bench/bench_decontam.py on 352 real images, 528 such copies:
# recall 99.8% at 8 bits, and no false match among 704 distinct images and copies of them;
# with the image and two even crops alone, 90.0%: the misses were word crops cut unevenly).
_EDGE = 0.05
REFERENCE_CROPS: tuple[Crop, ...] = (
    (0.0, 0.0, 0.0, 0.0),
    (0.025, 0.025, 0.025, 0.025),
    (_EDGE, _EDGE, _EDGE, _EDGE),
    (_EDGE, 0.0, 0.0, 0.0),
    (0.0, _EDGE, 0.0, 0.0),
    (0.0, 0.0, _EDGE, 0.0),
    (0.0, 0.0, 0.0, _EDGE),
    (_EDGE, _EDGE, 0.0, 0.0),
    (0.0, _EDGE, _EDGE, 0.0),
    (0.0, 0.0, _EDGE, _EDGE),
    (_EDGE, 0.0, 0.0, _EDGE),
)


def perceptual_hash(data: bytes, *, max_pixels: int | None = None) -> int:
    """imagehash's `phash` (hash_size 8) of the image in `data`, as a 64-bit int.

    ValueError when the bytes are not an image of an accepted format, cannot be decoded,
    or (with `max_pixels`, checked from the header before decoding) are too large."""
    return _hashes(data, (REFERENCE_CROPS[0],), max_pixels)[0]


def image_hashes(data: bytes, *, max_pixels: int | None = None) -> list[int]:
    """The hashes of the image and of its light crops, in REFERENCE_CROPS order (the first
    is `perceptual_hash`): what a pool image is indexed under for near-duplicates, so a
    later copy cut by up to 5% a side, or an earlier one it was cut from, is found."""
    return _hashes(data, REFERENCE_CROPS, max_pixels)


def reference_hashes(data: bytes, *, max_pixels: int | None = None) -> list[int]:
    """The hashes an evaluation-set image is indexed under (REFERENCE_CROPS), distinct."""
    return list(dict.fromkeys(_hashes(data, REFERENCE_CROPS, max_pixels)))


def informative(h: int) -> bool:
    """A DCT hash with 32 bits set: a flat or one-way gradient image hashes to a
    degenerate value (1 << 63) that would match every other such image."""
    return h.bit_count() == 32


def hash_hex(h: int) -> str:
    """16 lower-case hex digits, zero-padded (imagehash's `str()` of a 64-bit hash)."""
    return f"{_check_hash(h):016x}"


def parse_hash(text: str) -> int:
    """The hash written by `hash_hex` (or imagehash): exactly 16 hex digits, any case."""
    s = text.strip()
    if len(s) != 16 or any(c not in "0123456789abcdefABCDEF" for c in s):
        raise ValueError(f"not a 64-bit hash (16 hex digits): {text!r}")
    return int(s, 16)


def hamming(a: int, b: int) -> int:
    """The number of bits in which two hashes differ."""
    return (a ^ b).bit_count()


def _check_hash(h: int) -> int:
    if type(h) is int and 0 <= h <= _MASK64:
        return h
    if isinstance(h, bool) or not isinstance(h, int | np.integer) or not 0 <= h <= _MASK64:
        raise ValueError(f"not a 64-bit hash: {h!r}")
    return int(h)


def _distances(hashes: np.ndarray, q: np.uint64 | np.ndarray) -> np.ndarray:
    """Hamming distance of each uint64 to `q` (one, or one each) (SWAR popcount in place;
    numpy 1.26 has no bitwise_count)."""
    x = hashes ^ q
    t = np.right_shift(x, _S1)
    t &= _M1
    x -= t
    np.right_shift(x, _S2, out=t)
    t &= _M2
    x &= _M2
    x += t
    np.right_shift(x, _S4, out=t)
    x += t
    x &= _M4
    x *= _H01
    x >>= _S56
    return x.astype(np.int64)


# --------------------------------------------------------------------------- the index


class HashIndex:
    """64-bit hashes with a key each (what the hash belongs to), searched by Hamming radius.

    `add(h, key)` appends; `near(h, radius)` returns every stored (key, distance) within
    `radius` bits (0 <= radius <= max_radius), nearest first, then in insertion order.
    The same hash or key may be added more than once: each add is a row of its own."""

    def __init__(self, max_radius: int = 12) -> None:
        if isinstance(max_radius, bool) or not isinstance(max_radius, int):
            raise ValueError(f"max_radius must be an int, not {max_radius!r}")
        if not 0 <= max_radius <= RADIUS_LIMIT:
            raise ValueError(f"max_radius must lie in [0, {RADIUS_LIMIT}], not {max_radius}")
        self._max_radius = max_radius
        self._n = 0
        self._hashes = np.zeros(1024, dtype=np.uint64)  # capacity grows by half
        self._key_ends = array("Q")
        self._key_blob = bytearray()
        # Rows [0, _indexed) are in the block tables: per block, bucket offsets (65,537)
        # and the row numbers sorted by that block's 16-bit value (stable: by row within).
        self._indexed = 0
        self._offsets: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []

    @property
    def max_radius(self) -> int:
        return self._max_radius

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"HashIndex(max_radius={self._max_radius}, hashes={self._n})"

    # -- updates

    def add(self, h: int, key: str) -> None:
        """Store `h` (0 <= h < 2**64) for `key`."""
        h = _check_hash(h)
        if not isinstance(key, str):
            raise ValueError(f"key must be a str, not {type(key).__name__}")
        encoded = key.encode("utf-8")  # UnicodeEncodeError (a ValueError) for lone surrogates
        if len(encoded) > 0xFFFFFFFF:
            raise ValueError("key longer than 4 GiB")
        if self._n >= 0xFFFFFFFF:
            raise ValueError("a HashIndex holds at most 2**32 - 1 hashes")
        if self._n == len(self._hashes):
            grown = np.zeros(max(1024, len(self._hashes) * 3 // 2), dtype=np.uint64)
            grown[: self._n] = self._hashes
            self._hashes = grown
        self._hashes[self._n] = h
        self._key_blob += encoded
        self._key_ends.append(len(self._key_blob))
        self._n += 1

    def _reindex(self) -> None:
        """Rebuild the block tables over every row (O(n): a radix sort per block)."""
        n = self._n
        hashes = self._hashes[:n]
        offsets, rows = [], []
        for b in range(BLOCKS):
            values = ((hashes >> np.uint64(BLOCK_BITS * b)) & np.uint64(0xFFFF)).astype(np.uint16)
            off = np.zeros(_BUCKETS + 1, dtype=np.uint32)
            np.cumsum(np.bincount(values, minlength=_BUCKETS), out=off[1:])
            offsets.append(off)
            rows.append(np.argsort(values, kind="stable").astype(np.uint32))
        self._offsets, self._rows, self._indexed = offsets, rows, n

    # -- queries

    def near(self, h: int, radius: int) -> list[tuple[str, int]]:
        """Every stored (key, distance) with distance <= `radius`, sorted by distance, then
        by insertion order."""
        return self.near_any([h], radius)

    def near_any(self, hs: Sequence[int], radius: int) -> list[tuple[str, int]]:
        """`near` for several hashes at once: every stored (key, least distance to any of
        `hs`) within `radius`, sorted likewise. One pass over the block tables for all of
        them (the crop hashes of an image: rsieve.clean.decontam), not one per hash."""
        queries = [_check_hash(h) for h in hs]
        if isinstance(radius, bool) or not isinstance(radius, int):
            raise ValueError(f"radius must be an int, not {radius!r}")
        if not 0 <= radius <= self._max_radius:
            raise ValueError(f"radius must lie in [0, {self._max_radius}], not {radius}")
        if not queries:
            return []
        if self._n - self._indexed > max(PENDING_ROWS, self._indexed // 64):
            self._reindex()
        rows, dists = self._near_rows(np.array(queries, dtype=np.uint64), radius)
        if not len(rows):
            return []
        order = np.lexsort((rows, dists))  # by distance, then row (insertion order)
        ends = self._key_ends
        blob = self._key_blob
        out = []
        for i in order.tolist():
            r = int(rows[i])
            start = ends[r - 1] if r else 0
            out.append((blob[start : ends[r]].decode("utf-8"), int(dists[i])))
        return out

    def _near_rows(self, qs: np.ndarray, radius: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows within `radius` of any of the hashes `qs` (each row once, ascending) and
        their least distance."""
        found_rows, found_dists = [], []
        if self._indexed:
            flips = _FLIPS[: _FLIPS_UPTO[radius // BLOCKS]]
            parts, owners = [], []
            for b in range(BLOCKS):
                own = ((qs >> np.uint64(BLOCK_BITS * b)) & np.uint64(0xFFFF)).astype(np.int64)
                values = (flips[None, :] ^ own[:, None]).ravel()
                query = np.repeat(np.arange(len(qs)), len(flips))
                off = self._offsets[b]
                starts = off[values].astype(np.int64)
                lens = off[values + 1].astype(np.int64) - starts
                hit = lens > 0
                starts, lens, query = starts[hit], lens[hit], query[hit]
                total = int(lens.sum())
                if not total:
                    continue
                # positions starts[i] .. starts[i] + lens[i] - 1, concatenated
                shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)
                parts.append(self._rows[b][shift + np.arange(total)])
                owners.append(np.repeat(query, lens))
            if parts:
                cand = np.concatenate(parts)
                d = _distances(self._hashes[cand], qs[np.concatenate(owners)])
                keep = d <= radius
                cand, d = cand[keep], d[keep]
                if len(cand):
                    order = np.lexsort((d, cand))  # by row, least distance first
                    cand, d = cand[order], d[order]
                    cand, first = np.unique(cand, return_index=True)
                    found_rows.append(cand.astype(np.int64))
                    found_dists.append(d[first])
        if self._indexed < self._n:
            pending = self._hashes[self._indexed : self._n]
            d = _distances(pending[None, :], qs[:, None]).min(axis=0)
            (hit,) = np.nonzero(d <= radius)
            found_rows.append(hit + self._indexed)
            found_dists.append(d[hit])
        if not found_rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(found_rows), np.concatenate(found_dists)

    # -- storage

    def to_bytes(self) -> bytes:
        """The versioned binary form (module docstring); never pickle."""
        n = self._n
        ends = np.frombuffer(self._key_ends, dtype=np.uint64).astype(np.int64) if n else None
        lens = np.diff(ends, prepend=0) if ends is not None else np.zeros(0, np.int64)
        payload = b"".join(
            (
                self._hashes[:n].astype(_U64).tobytes(),
                lens.astype(_U32).tobytes(),
                bytes(self._key_blob),
            )
        )
        header = _HEADER.pack(
            _MAGIC,
            FORMAT_VERSION,
            self._max_radius,
            n,
            len(self._key_blob),
            zlib.crc32(payload),
        )
        return header + payload

    @classmethod
    def from_bytes(cls, data: bytes) -> HashIndex:
        """An index written by `to_bytes`; ValueError for anything else."""
        view = memoryview(data)
        if len(view) < _HEADER.size:
            raise ValueError("not a HashIndex: too short")
        magic, version, max_radius, n, blob_len, crc = _HEADER.unpack_from(view)
        if magic != _MAGIC:
            raise ValueError("not a HashIndex: bad magic")
        if version != FORMAT_VERSION:
            raise ValueError(f"HashIndex format version {version} is not {FORMAT_VERSION}")
        if not 0 <= max_radius <= RADIUS_LIMIT or n > 0xFFFFFFFF:
            raise ValueError("corrupt HashIndex header")
        if len(view) != _HEADER.size + 12 * n + blob_len:
            raise ValueError("corrupt HashIndex: wrong length")
        payload = view[_HEADER.size :]
        if zlib.crc32(payload) != crc:
            raise ValueError("corrupt HashIndex: checksum mismatch")
        hashes = np.frombuffer(payload, dtype=_U64, count=n).astype(np.uint64)
        lens = np.frombuffer(payload, dtype=_U32, count=n, offset=8 * n).astype(np.int64)
        raw = bytes(payload[12 * n :])
        ends = np.cumsum(lens)
        if (ends[-1] if n else 0) != blob_len:
            raise ValueError("corrupt HashIndex: key lengths do not add up")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"corrupt HashIndex: keys are not UTF-8: {exc}") from exc
        # Valid UTF-8 throughout and every key starting on a character (not a continuation
        # byte 0b10xxxxxx): then every key alone is valid UTF-8.
        starts = ends[:-1][ends[:-1] < blob_len]
        if len(starts) and np.any((np.frombuffer(raw, np.uint8)[starts] & 0xC0) == 0x80):
            raise ValueError("corrupt HashIndex: a key starts inside a UTF-8 character")
        index = cls(max_radius)
        index._hashes = hashes if n else index._hashes
        index._n = n
        index._key_ends = array("Q", ends.astype(np.uint64).tobytes())
        index._key_blob = bytearray(raw)
        if n:
            index._reindex()
        return index
