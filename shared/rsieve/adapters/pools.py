"""Pool formats on disk, all read into the one pool contract: `items.jsonl` plus the image
files its lines name (docs/cleaning.md).

- folder: `items.jsonl` + images (the design's contract), read as is;
- Parquet or a Hugging Face dataset folder (`*.parquet`, e.g. `data/train-*.parquet`) with
  an image column (HF `Image()` structs `{bytes, path}`, raw bytes or a path in the folder);
  embedded images become `images/<sha256>.<ext>`;
- InfinityMM-style records: one `.json` per sample beside its image, `conversations` with
  an `<image>` turn, a `source` tag; one item per human/gpt turn pair.

`read_pool(folder)` detects the format and returns a `PoolFiles`: the items.jsonl bytes,
the files to upload (path in the pool -> file on disk or bytes) and the files refused
(a symbolic link whose target leaves the pool folder is never read: path -> why). This
module reads local files only; uploading is the client's.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from rsieve.adapters.storage import ObjectStore, write_packs
from rsieve.cleaning import pool_image_path
from rsieve.errors import PermanentError
from rsieve.images import IMAGE_FORMATS
from rsieve.submission import pool_digest

__all__ = ["PoolFiles", "pool_files", "pool_format", "read_pool", "upload_pool"]

_CONTRACT_FIELDS = ("id", "family", "image", "question", "answer", "source", "options", "protocol")


@dataclass
class PoolFiles:
    format: str
    items: bytes
    files: dict[str, Path | bytes] = field(default_factory=dict)
    refused: dict[str, str | dict[str, str]] = field(default_factory=dict)

    def read(self, name: str) -> bytes:
        data = self.files[name]
        return data if isinstance(data, bytes) else data.read_bytes()

    def size(self, name: str) -> int:
        data = self.files[name]
        return len(data) if isinstance(data, bytes) else data.stat().st_size

    def refuse_larger_than(self, max_bytes: int) -> None:
        """Move every file over `max_bytes` from `files` to `refused` (image_too_large), by
        its size on disk, before any of its bytes is read."""
        for name in [n for n in self.files if self.size(n) > max_bytes]:
            size = self.size(name)
            del self.files[name]
            self.refused[name] = {
                "reason": "image_too_large",
                "detail": f"{size} bytes > {max_bytes} (not uploaded)",
            }


def pool_format(folder: Path) -> str:
    if (folder / "items.jsonl").is_file():
        return "folder"
    if any(folder.rglob("*.parquet")):
        return "parquet"
    for path in sorted(folder.rglob("*.json"))[:50]:
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("conversations"), list):
            return "infinitymm"
    raise PermanentError(
        f"{folder} is not a pool: no items.jsonl, no Parquet files and no InfinityMM records"
    )


def read_pool(folder: Path, *, family: str | None = None) -> PoolFiles:
    """The pool in `folder` as items.jsonl + files. `family` names the family of records
    that carry none (InfinityMM records: else their `source` tag)."""
    fmt = pool_format(folder)
    if fmt == "folder":
        return _folder(folder)
    if fmt == "parquet":
        return _parquet(folder, family)
    return _infinitymm(folder, family)


def _inside(folder: Path, path: str) -> tuple[Path | None, str | None]:
    """(file, None) for a regular file inside the folder; (None, why) for a symbolic link
    that leaves it; (None, None) when there is no such file (the cleaner says missing)."""
    candidate = folder / path
    if not candidate.exists() and not candidate.is_symlink():
        return None, None
    resolved = candidate.resolve()
    if not resolved.is_relative_to(folder.resolve()):
        return None, "symbolic link to a file outside the pool folder"
    return (candidate, None) if resolved.is_file() else (None, None)


def _folder(folder: Path) -> PoolFiles:
    items = (folder / "items.jsonl").read_bytes()
    pool = PoolFiles("folder", items)
    for raw in items.split(b"\n"):
        try:
            image = json.loads(raw).get("image")
        except (ValueError, AttributeError):
            continue
        path = pool_image_path(image) if isinstance(image, str) else None
        if path is None or path in pool.files or path in pool.refused:
            continue
        file, why = _inside(folder, path)
        if file is not None:
            pool.files[path] = file
        elif why is not None:
            pool.refused[path] = why
    return pool


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


def _image_name(data: bytes, hint: str | None) -> str:
    suffix = Path(hint).suffix.lower() if hint else ""
    if not suffix:
        try:
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
                suffix = "." + (img.format or "bin").lower()
        except Exception:  # noqa: BLE001 - unreadable bytes are the cleaner's to report
            suffix = ".bin"
    return f"images/{hashlib.sha256(data).hexdigest()}{suffix}"


def _plain(value: Any) -> Any:
    """Parquet structs come back with None for keys other rows had: drop them. A source
    stored as a JSON string is read back as the object it encodes."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _parquet(folder: Path, family: str | None) -> PoolFiles:
    import pyarrow.parquet as pq  # deferred: only Parquet pools need it

    pool = PoolFiles("parquet", b"")
    records: list[dict[str, Any]] = []
    for file in sorted(folder.rglob("*.parquet")):
        rel = file.relative_to(folder).as_posix()
        for row_number, row in enumerate(pq.read_table(file).to_pylist()):
            rec: dict[str, Any] = {k: row[k] for k in _CONTRACT_FIELDS if row.get(k) is not None}
            image = row.get("image")
            if isinstance(image, dict) and image.get("bytes") is not None:
                data, hint = image["bytes"], image.get("path")
            elif isinstance(image, bytes):
                data, hint = image, None
            else:
                data, hint = None, image.get("path") if isinstance(image, dict) else image
            if data is not None:
                name = _image_name(data, hint)
                pool.files[name] = data
                rec["image"] = name
            elif isinstance(hint, str) and (path := pool_image_path(hint)):
                file_in, why = _inside(folder, path)
                if file_in is not None:
                    pool.files[path] = file_in
                elif why is not None:
                    pool.refused[path] = why
                rec["image"] = path
            rec.setdefault("id", f"{file.stem}-{row_number}")
            if family and "family" not in rec:
                rec["family"] = family
            rec["source"] = _plain(rec.get("source")) or {"dataset": rel, "row": row_number}
            if "options" in rec:
                rec["options"] = _plain(rec["options"])
            records.append(rec)
    pool.items = _jsonl(records)
    return pool


def _infinitymm(folder: Path, family: str | None) -> PoolFiles:
    pool = PoolFiles("infinitymm", b"")
    records: list[dict[str, Any]] = []
    for file in sorted(folder.rglob("*.json")):
        try:
            rec = json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
            continue
        image = rec.get("image")
        path = None
        if isinstance(image, str):  # beside its record, else relative to the pool folder
            beside = (file.parent / Path(image).name).relative_to(folder).as_posix()
            path = beside if (folder / beside).exists() else pool_image_path(image)
        if path is not None and path not in pool.files:
            file_in, why = _inside(folder, path)
            if file_in is not None:
                pool.files[path] = file_in
            elif why is not None:
                pool.refused[path] = why
        tag = rec.get("source")
        turns = [t for t in rec["conversations"] if isinstance(t, dict)]
        pairs = [
            (turns[i], turns[i + 1])
            for i in range(0, len(turns) - 1, 2)
            if turns[i].get("from") == "human" and turns[i + 1].get("from") == "gpt"
        ]
        for k, (human, gpt) in enumerate(pairs):
            item: dict[str, Any] = {
                "id": str(rec.get("id")) + (f"-{k}" if k else ""),
                "family": rec.get("family") or family or tag,
                "image": path if path is not None else image,
                "question": str(human.get("value", "")).replace("<image>", "").strip(),
                "answer": gpt.get("value"),
                "source": {
                    "dataset": "InfinityMM",
                    "tag": tag,
                    "record": file.relative_to(folder).as_posix(),
                    **({"phash": rec["phash"]} if "phash" in rec else {}),
                },
            }
            for key in ("options", "protocol"):
                if key in rec:
                    item[key] = rec[key]
            records.append(item)
    pool.items = _jsonl(records)
    return pool


def pool_files(folder: Path) -> list[str]:
    """items.jsonl and every file its lines name that lies inside the folder (a symbolic
    link leaving the folder is not one)."""
    if not (folder / "items.jsonl").is_file():
        raise PermanentError(f"{folder} is not a pool: it has no items.jsonl")
    return ["items.jsonl", *sorted(read_pool(folder).files)]


def upload_pool(
    store: ObjectStore,
    folder: Path,
    *,
    image_max_bytes: int | None = None,
    family: str | None = None,
) -> str:
    """Upload once under pools/<digest>/ (digest over every file's name and bytes), in the
    pool contract whatever the folder's format (ingest.read_pool: items.jsonl folder,
    Parquet / HF dataset folder, InfinityMM records). The images go in packs with their
    index (`_packs/`, rsieve.packs), a few objects instead of one per image. Image files
    the upload refused (symbolic links leaving the folder; files over `image_max_bytes`,
    by their size before a byte is read) are listed in `_refused.json` for the cleaner,
    which quarantines their lines. `_complete` is written last and holds the digest."""
    pool = read_pool(folder, family=family)
    if image_max_bytes is not None:
        pool.refuse_larger_than(image_max_bytes)
    names = sorted(pool.files)
    extra: dict[str, bytes] = {"items.jsonl": pool.items}
    if pool.refused:
        extra["_refused.json"] = json.dumps(pool.refused, sort_keys=True).encode()
    shas = {name: hashlib.sha256(pool.read(name)).hexdigest() for name in names}
    pool_sha = pool_digest(pool.items, shas, extra.get("_refused.json"))
    prefix = f"pools/{pool_sha}/"
    if not store.exists(prefix + "_complete"):
        # In line order, so a shard's images lie together.
        write_packs(store, prefix, ((n, pool.read(n)) for n in _in_line_order(pool.items, names)))
        for name, data in extra.items():
            store.put(prefix + name, data)
        store.put(prefix + "_complete", pool_sha.encode())
    return f"s3://{store.bucket}/{prefix}"


def _in_line_order(items: bytes, names: list[str]) -> list[str]:
    """`names` in the order items.jsonl first names them (the rest after, sorted)."""
    wanted, order = set(names), dict[str, int]()
    for raw in items.splitlines():
        try:
            image = json.loads(raw).get("image")
        except (ValueError, AttributeError):
            continue
        if isinstance(image, str) and (path := pool_image_path(image)) in wanted:
            order.setdefault(path, len(order))
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))
