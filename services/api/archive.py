"""Safe extraction of an uploaded pool archive (tar, tar.gz/bz2/xz or zip).

Refused, the whole upload with it: absolute names, names with `..`, links (symbolic or
hard), devices and FIFOs, more files or more bytes than the limits. Members are written
one by one to paths checked to lie inside the destination; nothing is ever extracted by
the archive library's own path handling."""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO

__all__ = ["ArchiveError", "extract_pool", "find_pool"]

CHUNK = 1 << 20


class ArchiveError(ValueError):
    """The archive is refused; the message says why."""


def _safe_name(name: str, dest: Path) -> Path:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts or ":" in path.parts[0]:
        raise ArchiveError(f"archive member {name!r} leaves the pool folder")
    target = (dest / Path(*path.parts)).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ArchiveError(f"archive member {name!r} leaves the pool folder")
    return target


class _Budget:
    def __init__(self, max_files: int, max_bytes: int) -> None:
        self.files, self.bytes = max_files, max_bytes

    def file(self) -> None:
        self.files -= 1
        if self.files < 0:
            raise ArchiveError("the archive holds more files than RSIEVE_API_MAX_UPLOAD_FILES")

    def copy(self, src: IO[bytes], target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("xb") as out:
            while chunk := src.read(CHUNK):
                self.bytes -= len(chunk)
                if self.bytes < 0:
                    raise ArchiveError("the archive expands beyond RSIEVE_API_MAX_EXTRACTED_BYTES")
                out.write(chunk)


def extract_pool(archive: Path, dest: Path, *, max_files: int, max_bytes: int) -> Path:
    """Extract into dest (created) and return the pool folder inside it."""
    dest.mkdir(parents=True, exist_ok=True)
    budget = _Budget(max_files, max_bytes)
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, dest, budget)
        elif tarfile.is_tarfile(archive):
            _extract_tar(archive, dest, budget)
        else:
            raise ArchiveError("the upload is neither a tar nor a zip archive")
    except FileExistsError as exc:
        raise ArchiveError(f"archive member {exc.filename!r} appears twice") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise ArchiveError(f"the archive is damaged: {exc}") from None
    return find_pool(dest)


def _extract_zip(archive: Path, dest: Path, budget: _Budget) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            target = _safe_name(info.filename, dest)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"archive member {info.filename!r} is a link")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            budget.file()
            with zf.open(info) as src:
                budget.copy(src, target)


def _extract_tar(archive: Path, dest: Path, budget: _Budget) -> None:
    with tarfile.open(archive, mode="r:*") as tf:
        for member in tf:
            target = _safe_name(member.name, dest)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if not member.isfile():
                raise ArchiveError(f"archive member {member.name!r} is a link or a device")
            budget.file()
            src = tf.extractfile(member)
            assert src is not None
            budget.copy(src, target)


def find_pool(root: Path) -> Path:
    """The folder with items.jsonl: the root, or its one top-level folder."""
    if (root / "items.jsonl").is_file():
        return root
    children = [p for p in root.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    if len(children) == 1 and children[0].is_dir() and (children[0] / "items.jsonl").is_file():
        return children[0]
    raise ArchiveError("the archive has no items.jsonl at its top (or in its one folder)")


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
