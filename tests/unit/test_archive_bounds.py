"""Archive extraction (services/api/archive.py) refuses what would take the API's memory or
disk, or crash it into a 500: every refusal is an ArchiveError (the route's 422)."""

from __future__ import annotations

import gzip
import io
import tarfile
import tracemalloc
import zipfile
from pathlib import Path
from typing import Literal

import pytest

from services.api.archive import EXTENDED_HEADER_BYTES, ArchiveError, extract_pool

ITEMS = b'{"id": "a"}\n'


def tar_bytes(
    members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]],
    *,
    fmt: int = tarfile.PAX_FORMAT,
    mode: Literal["w", "w:gz"] = "w",
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=fmt) as tf:
        for m in members:
            info, data = m if isinstance(m, tuple) else (m, b"")
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def file_info(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def extract(tmp_path: Path, data: bytes, **limits: int | float) -> Path:
    archive = tmp_path / "upload"
    archive.write_bytes(data)
    kwargs = {"max_files": 1000, "max_bytes": 10**9, **limits}
    return extract_pool(archive, tmp_path / "out", **kwargs)  # type: ignore[arg-type]


def test_a_plain_pool_archive_extracts(tmp_path: Path) -> None:
    data = tar_bytes([file_info("pool/items.jsonl", ITEMS), file_info("pool/a.png", b"png")])
    folder = extract(tmp_path, data)
    assert (folder / "items.jsonl").read_bytes() == ITEMS and (folder / "a.png").is_file()


def test_a_huge_pax_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tarfile.TarInfo("items.jsonl")
    big.pax_headers = {"comment": "x" * (32 * 1024**2)}
    data = tar_bytes([big])
    compressed = tmp_path / "bomb.tar.gz"
    compressed.write_bytes(gzip.compress(data))
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError, match="extended header"):
            extract_pool(compressed, tmp_path / "out", max_files=10, max_bytes=10**9)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024**2, f"{peak} bytes allocated at the peak"


def test_a_gnu_long_name_over_the_bound_is_refused(tmp_path: Path) -> None:
    info, data = file_info("d/" * (EXTENDED_HEADER_BYTES // 2 + 10) + "items.jsonl", ITEMS)
    with pytest.raises(ArchiveError, match="extended header"):
        extract(tmp_path, tar_bytes([(info, data)], fmt=tarfile.GNU_FORMAT))


def test_an_archive_that_inflates_past_its_ratio_is_refused(tmp_path: Path) -> None:
    data = tar_bytes(
        [file_info("items.jsonl", ITEMS), file_info("zeros.bin", b"\0" * 20_000_000)], mode="w:gz"
    )
    assert len(data) < 100_000
    with pytest.raises(ArchiveError, match="EXPANSION_RATIO"):
        extract(tmp_path, data, max_ratio=5.0)
    (tmp_path / "ok").mkdir()
    assert extract(tmp_path / "ok", data, max_ratio=1000.0).is_dir()


def test_folders_count_as_members(tmp_path: Path) -> None:
    folders = []
    for k in range(20):
        info = tarfile.TarInfo(f"d{k}")
        info.type = tarfile.DIRTYPE
        folders.append(info)
    with pytest.raises(ArchiveError, match="more members"):
        extract(tmp_path, tar_bytes([*folders, file_info("items.jsonl", ITEMS)]), max_files=10)


def test_an_encrypted_zip_member_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("items.jsonl", ITEMS)
    raw = bytearray(buf.getvalue())
    # Set the "encrypted" flag bit in the local and the central header (as a real encrypted
    # zip has it): the reader would ask for a password and fail as a server error.
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.find(signature)
        raw[at + offset] |= 0x1
    with pytest.raises(ArchiveError, match="encrypted"):
        extract(tmp_path, bytes(raw))


def test_a_nul_byte_in_a_name_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("items.jsonl", ITEMS)
    raw = buf.getvalue().replace(b"items.jsonl", b"items\0jsonl")
    with pytest.raises(ArchiveError):
        extract(tmp_path, raw)


def test_a_file_where_a_folder_is_needed_is_refused(tmp_path: Path) -> None:
    data = tar_bytes([file_info("pool", b"a file"), file_info("pool/items.jsonl", ITEMS)])
    with pytest.raises(ArchiveError, match="both a file and a folder"):
        extract(tmp_path, data)


def test_an_image_over_the_bound_is_left_out_unread_as_a_sparse_stand_in(
    tmp_path: Path,
) -> None:
    """An image member over max_member_bytes is not extracted: a sparse file of its declared
    size stands in (no disk taken), which upload_pool then refuses as image_too_large. Its
    declared size still counts against the archive's budget."""
    data = tar_bytes([file_info("items.jsonl", ITEMS * 100), file_info("big.png", b"x" * 5000)])
    folder = extract(tmp_path, data, max_member_bytes=4096)
    big = folder / "big.png"
    assert big.stat().st_size == 5000 and b"x" not in big.read_bytes()
    assert big.stat().st_blocks * 512 < 5000  # a hole, not bytes
    (tmp_path / "ok").mkdir()  # items.jsonl is bounded by the whole archive's budget only
    ok = extract(tmp_path / "ok", data, max_member_bytes=5000)
    assert (ok / "big.png").read_bytes() == b"x" * 5000
    (tmp_path / "budget").mkdir()
    with pytest.raises(ArchiveError, match="MAX_EXTRACTED_BYTES"):
        extract(tmp_path / "budget", data, max_member_bytes=4096, max_bytes=5000)


def test_a_parquet_pool_archive_is_a_pool(tmp_path: Path) -> None:
    data = tar_bytes([file_info("pool/part-0.parquet", b"PAR1")])
    assert extract(tmp_path, data).name == "pool"
    (tmp_path / "none").mkdir()
    with pytest.raises(ArchiveError, match="holds no pool"):
        extract(tmp_path / "none", tar_bytes([file_info("pool/a.png", b"png")]))
