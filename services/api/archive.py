"""Safe extraction of an uploaded pool archive (tar, tar.gz/bz2/xz or zip).

An image member over the per-image bound is not extracted: the pool goes on without it and
its lines are quarantined `image_too_large`. Refused, the whole upload with it
(ArchiveError, a 422): absolute names, names with `..`
or a NUL byte, links (symbolic or hard), devices and FIFOs, encrypted zip members, a file
where a folder is needed, more members (files and folders) or more bytes than the limits,
more bytes than `max_ratio` times the archive's own size, and tar extended headers (pax,
GNU long names) over EXTENDED_HEADER_BYTES, which the tar reader would otherwise read
into memory whole before any budget sees them. Members are written one by one to paths
checked to lie inside the destination; nothing is ever extracted by the archive library's
own path handling."""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rsieve.adapters.pools import pool_format
from rsieve.errors import PermanentError
from rsieve.run.submission import RECORD_SUFFIXES

__all__ = ["ArchiveError", "extract_pool", "find_pool"]

CHUNK = 1 << 20
# Pax and GNU long-name headers of a real pool are a few hundred bytes.
EXTENDED_HEADER_BYTES = 64 * 1024
_EXTENDED = {
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
}


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses an extended header over EXTENDED_HEADER_BYTES before the
    reader loads it (tarfile reads a pax or long-name header whole)."""

    def _proc_member(self, archive: tarfile.TarFile) -> Any:
        if self.type in _EXTENDED and self.size > EXTENDED_HEADER_BYTES:
            raise ArchiveError(
                f"a tar extended header of {self.size} bytes (at most {EXTENDED_HEADER_BYTES})"
            )
        return super()._proc_member(archive)  # type: ignore[misc]  # not in the stubs


class ArchiveError(ValueError):
    """The archive is refused; the message says why."""


def _safe_name(name: str, dest: Path) -> Path:
    path = PurePosixPath(name.replace("\\", "/"))
    if "\0" in name:
        raise ArchiveError(f"archive member {name!r} has a NUL byte in its name")
    if path.is_absolute() or ".." in path.parts or not path.parts or ":" in path.parts[0]:
        raise ArchiveError(f"archive member {name!r} leaves the pool folder")
    target = (dest / Path(*path.parts)).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ArchiveError(f"archive member {name!r} leaves the pool folder")
    return target


class _Budget:
    def __init__(self, max_files: int, max_bytes: int, max_member_bytes: int | None) -> None:
        self.files, self.bytes, self.member = max_files, max_bytes, max_member_bytes

    def file(self) -> None:
        self.files -= 1
        if self.files < 0:
            raise ArchiveError(
                "the archive holds more members (files and folders) than "
                "RSIEVE_API_MAX_UPLOAD_FILES"
            )

    def copy(self, src: IO[bytes], target: Path, name: str, size: int) -> None:
        """`size`: what the archive says the member holds, checked before any byte is
        read (and the bytes counted as they come, whatever it said). Records (items.jsonl,
        Parquet, InfinityMM JSON) are bounded by the archive's budget only."""
        is_record = PurePosixPath(name).suffix in RECORD_SUFFIXES
        _folder(target.parent, name)
        try:
            out = target.open("xb")
        except FileExistsError:
            raise ArchiveError(f"archive member {name!r} appears twice") from None
        if self.member is not None and not is_record and size > self.member:
            # Not read: a sparse file of the size it declares stands in, so the upload
            # refuses it by its size (image_too_large) and the pool goes on without it.
            # Skipped bytes still count: a compressed tar is inflated to reach the next.
            self._spend(size)
            with out:
                out.truncate(size)
            return
        cap = None if self.member is None or is_record else self.member
        written = 0
        with out:
            while chunk := src.read(CHUNK):
                written += len(chunk)
                if cap is not None and written > cap:
                    raise ArchiveError(f"archive member {name!r} holds more than it says")
                self._spend(len(chunk))
                out.write(chunk)

    def _spend(self, n: int) -> None:
        self.bytes -= n
        if self.bytes < 0:
            raise ArchiveError(
                "the archive expands beyond RSIEVE_API_MAX_EXTRACTED_BYTES or "
                "RSIEVE_API_MAX_EXPANSION_RATIO times its own size"
            )


def _folder(folder: Path, name: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ArchiveError(f"archive member {name!r} is both a file and a folder") from None


def extract_pool(
    archive: Path | IO[bytes],
    dest: Path,
    *,
    max_files: int,
    max_bytes: int,
    max_ratio: float = 50.0,
    max_member_bytes: int | None = None,
) -> Path:
    """Extract into dest (created) and return the pool folder inside it. `archive`: a path
    or a seekable binary file (the upload as the server spooled it: no second copy). An
    image member over `max_member_bytes` is not extracted but stands in as a sparse file of
    its declared size, for the upload to refuse (image_too_large)."""
    dest.mkdir(parents=True, exist_ok=True)
    if isinstance(archive, Path):
        with archive.open("rb") as f:
            return extract_pool(
                f,
                dest,
                max_files=max_files,
                max_bytes=max_bytes,
                max_ratio=max_ratio,
                max_member_bytes=max_member_bytes,
            )
    archive.seek(0, 2)
    ratio_bound = int(max_ratio * max(archive.tell(), CHUNK))
    archive.seek(0)
    budget = _Budget(max_files, min(max_bytes, ratio_bound), max_member_bytes)
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, dest, budget)
        else:
            # Not tarfile.is_tarfile: it reads the first member with the stock TarInfo,
            # extended header and all, into memory.
            _extract_tar(archive, dest, budget)
    except tarfile.ReadError as exc:
        raise ArchiveError(
            f"the upload is neither a zip nor a tar archive, or it is damaged: {exc}"
        ) from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, NotImplementedError) as exc:
        raise ArchiveError(f"the archive is damaged or unsupported: {exc}") from None

    return find_pool(dest)


def _extract_zip(archive: IO[bytes], dest: Path, budget: _Budget) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            target = _safe_name(info.filename, dest)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"archive member {info.filename!r} is a link")
            budget.file()
            if info.is_dir():
                _folder(target, info.filename)
                continue
            if info.flag_bits & 0x1:
                raise ArchiveError(f"archive member {info.filename!r} is encrypted")
            with zf.open(info) as src:
                budget.copy(src, target, info.filename, info.file_size)


def _extract_tar(archive: IO[bytes], dest: Path, budget: _Budget) -> None:
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:*", tarinfo=_BoundedTarInfo) as tf:
        for member in tf:
            target = _safe_name(member.name, dest)
            budget.file()
            if member.isdir():
                _folder(target, member.name)
                continue
            if not member.isfile():
                raise ArchiveError(f"archive member {member.name!r} is a link or a device")
            src = tf.extractfile(member)
            assert src is not None
            budget.copy(src, target, member.name, member.size)


def find_pool(root: Path) -> Path:
    """The pool folder (any format rsieve.adapters.pools reads: items.jsonl, Parquet,
    InfinityMM records): the root, or its one top-level folder."""
    children = [p for p in root.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    candidates = [children[0], root] if len(children) == 1 and children[0].is_dir() else [root]
    for folder in candidates:
        try:
            pool_format(folder)
        except PermanentError:
            continue
        return folder
    raise ArchiveError(
        "the archive holds no pool at its top (or in its one folder): no items.jsonl, "
        "no Parquet files and no InfinityMM records"
    )


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
