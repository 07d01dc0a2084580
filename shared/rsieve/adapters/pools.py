"""Pool formats on disk, all read into the one pool contract: `items.jsonl` plus the image
files its lines name (docs/cleaning.md).

- folder: `items.jsonl` + images (the design's contract), read as is;
- Parquet or a Hugging Face dataset folder (`*.parquet`, e.g. `data/train-*.parquet`) with
  an image column (HF `Image()` structs `{bytes, path}`, raw bytes or a path in the folder);
  embedded images become `images/<sha256>.<ext>`;
- InfinityMM-style records: one `.json` per sample beside its image, `conversations` with
  an `<image>` turn, a `source` tag; one item per human/gpt turn pair;
- conversation rows (LLaVA / ShareGPT `conversations`, OpenAI-style `messages`) in Parquet
  or in `.jsonl` / `.json` (a list of rows) files, one image per row (`image` / `images`):
  one item per (user, assistant) pair; a row rsieve cannot honour (more than one image, no
  image, a question that is not text on the one image) becomes one line with
  `unsupported: <reason>`, which the cleaner quarantines with that reason.

`read_pool(folder)` detects the format and returns a `PoolFiles`: the items.jsonl bytes,
the files to upload (path in the pool -> file on disk or bytes) and the files refused
(a symbolic link whose target leaves the pool folder is never read: path -> why). This
module reads local files only; uploading is the client's.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from rsieve import keys
from rsieve.adapters.storage import ObjectStore, write_packs
from rsieve.clean.cleaning import pool_image_path
from rsieve.clean.provenance import parse_source
from rsieve.errors import PermanentError
from rsieve.images import IMAGE_FORMATS
from rsieve.run.submission import ITEMS, REFUSED, pool_digest
from rsieve.run.watch import COMPLETE

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

    def take(self, folder: Path, path: str) -> None:
        """The image file `path` of the pool in `folder`: uploaded when it is a file inside
        the folder, refused when it is a symbolic link leaving it, neither when absent
        (the cleaner says missing_image). Taken once."""
        if path in self.files or path in self.refused:
            return
        file, why = _inside(folder, path)
        if file is not None:
            self.files[path] = file
        elif why is not None:
            self.refused[path] = why

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
    """`folder` (items.jsonl), `conversations` (Parquet whose first file has a
    `conversations` / `messages` column, else `.jsonl` / `.json` row files holding them),
    `parquet` (any other Parquet), `infinitymm` (one `.json` record per sample)."""
    if (folder / "items.jsonl").is_file():
        return "folder"
    parquets = sorted(folder.rglob("*.parquet"))
    if parquets:
        return "conversations" if _parquet_has_turns(parquets[0]) else "parquet"
    candidates = sorted(_json_files(folder), key=lambda p: p.suffix != ".jsonl")  # .jsonl first
    if any(_conversation_file(p) for p in candidates[:50]):
        return "conversations"
    for path in sorted(folder.rglob("*.json"))[:50]:
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("conversations"), list):
            return "infinitymm"
    raise PermanentError(
        f"{folder} is not a pool: no items.jsonl, no Parquet files, no conversation rows "
        "and no InfinityMM records"
    )


def read_pool(folder: Path, *, family: str | None = None) -> PoolFiles:
    """The pool in `folder` as items.jsonl + files. `family` names the family of records
    that carry none (InfinityMM records: else their `source` tag; conversation rows)."""
    fmt = pool_format(folder)
    if fmt == "folder":
        return _folder(folder)
    if fmt == "parquet":
        return _parquet(folder, family)
    if fmt == "conversations":
        return _conversations(folder, family)
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
        if path is not None:
            pool.take(folder, path)
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
                pool.take(folder, path)
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
        if path is not None:
            pool.take(folder, path)
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


# Conversation rows (docs/cleaning.md, "Conversation pools").
_TURNS = ("conversations", "messages")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


def _parquet_has_turns(file: Path) -> bool:
    import pyarrow.parquet as pq  # deferred: only Parquet pools need it

    try:
        names = pq.read_schema(file).names
    except (OSError, ValueError):  # not Parquet after all: the Parquet reader says so
        return False
    return any(k in names for k in _TURNS)


def _json_files(folder: Path) -> list[Path]:
    """`.jsonl` / `.json` files that may hold rows (the pool's own items.jsonl is not one)."""
    return sorted(
        p
        for p in folder.rglob("*.json*")
        if p.suffix in (".json", ".jsonl") and p != folder / "items.jsonl" and _own(folder, p)
    )


def _own(folder: Path, path: Path) -> bool:
    """A regular file inside the folder (a symbolic link leaving it is never read)."""
    return path.is_file() and path.resolve().is_relative_to(folder.resolve())


def _conversation_file(path: Path) -> bool:
    """A `.jsonl` whose first row, or a `.json` list whose opening (1 MiB), holds turns."""
    try:
        with path.open("rb") as f:
            if path.suffix == ".jsonl":
                for raw in f:
                    if raw.strip():
                        row = json.loads(raw)
                        return isinstance(row, dict) and any(
                            isinstance(row.get(k), list) for k in _TURNS
                        )
                return False
            head = f.read(1 << 20).decode("utf-8", "ignore").lstrip()
    except (OSError, ValueError):
        return False
    return head.startswith("[") and any(f'"{k}"' in head for k in _TURNS)


def _json_rows(path: Path) -> list[Any]:
    """The rows of a `.jsonl` (one a non-blank line; an unparsable line is its ValueError)
    or of a `.json` list (none when the file holds no list; a file that does not parse is
    refused: its rows cannot be counted, so none may be dropped silently)."""
    if path.suffix == ".jsonl":
        rows: list[Any] = []
        with path.open("rb") as f:
            for raw in f:
                if raw.strip():
                    try:
                        rows.append(json.loads(raw))
                    except ValueError as exc:
                        rows.append(exc)
        return rows
    try:
        data = json.loads(path.read_bytes())
    except ValueError as exc:
        raise PermanentError(f"{path.name}: a conversation file that is not JSON: {exc}") from exc
    return data if isinstance(data, list) else []


def _conversations(folder: Path, family: str | None) -> PoolFiles:
    """Every row of every conversation file ends as items (one per user/assistant pair) or
    as one `unsupported` line per row or pair (quarantined by the cleaner)."""
    pool = PoolFiles("conversations", b"")
    records: list[dict[str, Any]] = []
    parquets = sorted(p for p in folder.rglob("*.parquet") if _own(folder, p))
    files: Iterable[tuple[Path, list[Any]]]
    if parquets:
        import pyarrow.parquet as pq  # deferred: only Parquet pools need it

        files = ((f, pq.read_table(f).to_pylist()) for f in parquets)
    else:
        files = ((f, _json_rows(f)) for f in _json_files(folder) if _conversation_file(f))
    for file, rows in files:
        for n, row in enumerate(rows):
            records.extend(_row_items(pool, folder, file, n, row, family))
    pool.items = _jsonl(records)
    return pool


def _row_source(own: Any, rel: str, n: int, fmt: str | None) -> Any:
    """{dataset: <file>, row: n, format} merged with the row's own source (its keys win).
    When the row's source names a location (path, URI, URL) the file is recorded as `file`,
    not `dataset`, so provenance still checks that location (rsieve.clean.provenance)."""
    ours: dict[str, Any] = {"dataset": rel, "row": n, **({"format": fmt} if fmt else {})}
    own = _plain(own)
    if own is None or own == "" or own == {}:
        return ours
    if isinstance(own, str):
        kind = parse_source(own).kind
        key = "sha256" if kind == "hash" else "uri" if kind in ("local", "s3", "remote") else "tag"
        own = {key: own}
    elif not isinstance(own, dict):
        own = {"tag": own}
    if parse_source(own).kind in ("local", "s3", "remote"):
        return {"file": ours.pop("dataset"), **ours, **own}
    return ours | own


def _content(content: Any) -> tuple[str, int, list[str]]:
    """(text, images referred to, parts of other kinds) of a turn's `value` / `content`:
    a string (`<image>` placeholders counted) or a list of `{"type": ...}` parts."""
    if isinstance(content, str):
        return content, content.count("<image>"), []
    texts: list[str] = []
    images, other = 0, []
    for part in content if isinstance(content, list) else [] if content is None else [content]:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind == "text" and isinstance(part, dict):
            text = part.get("text")
            texts.append(text if isinstance(text, str) else "")
            images += texts[-1].count("<image>")
        elif kind == "image" and isinstance(part, dict) and part.get("image") is None:
            images += 1  # a placeholder for the row's image
        else:
            other.append("an inline image" if kind in ("image", "image_url") else f"{kind!r}")
    return "\n".join(texts), images, other


def _pairs(turns: list[Any], fmt: str) -> Iterator[tuple[tuple[str, int, list[str]], str]]:
    """((question text, images, other parts), answer text) per user turn(s) answered by an
    assistant turn. Consecutive user turns are one question; system turns, an assistant
    turn with no question before it and a last question with no answer are skipped."""
    question: tuple[str, int, list[str]] | None = None
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = _ROLES.get(str(turn.get("from"))) if fmt == "llava" else turn.get("role")
        text, images, other = _content(turn.get("value" if fmt == "llava" else "content"))
        if role == "user":
            if question is None:
                question = (text, images, other)
            else:
                question = (f"{question[0]}\n{text}", question[1] + images, question[2] + other)
        elif role == "assistant" and question is not None:
            yield question, text
            question = None


def _row_images(row: dict[str, Any]) -> list[Any]:
    value = row.get("images")
    if value is None or value == []:
        value = row.get("image")
    values = value if isinstance(value, list) else [value]
    return [
        v
        for v in values
        if v not in (None, "", {})
        and not (isinstance(v, dict) and v.get("bytes") is None and not v.get("path"))
    ]


def _place_image(pool: PoolFiles, folder: Path, file: Path, image: Any) -> str | None:
    """The pool path of a row's image: embedded bytes become `images/<sha256>.<ext>`; a
    path is looked for beside the row's file, then from the pool folder (through `_inside`:
    a symbolic link leaving the folder is refused). None when it holds neither."""
    if isinstance(image, dict) and image.get("bytes") is not None:
        data, hint = image["bytes"], image.get("path")
    elif isinstance(image, bytes | bytearray):
        data, hint = bytes(image), None
    else:
        data, hint = None, image.get("path") if isinstance(image, dict) else image
    if data is not None:
        name = _image_name(data, hint)
        pool.files[name] = data
        return name
    if not isinstance(hint, str):
        return None
    path = pool_image_path(hint)
    here = file.parent.relative_to(folder).as_posix()
    if here != ".":
        beside = pool_image_path(posixpath.join(here, hint))
        if beside and ((folder / beside).exists() or (folder / beside).is_symlink()):
            path = beside
    if path is None:
        return hint  # leaves the pool folder: the cleaner says image_outside_pool
    pool.take(folder, path)
    return path


def _row_items(
    pool: PoolFiles, folder: Path, file: Path, n: int, row: Any, family: str | None
) -> list[dict[str, Any]]:
    """One conversation row (row `n` of `file`) as pool lines: an item per pair, or an
    `unsupported` line (reason, detail) for the row or for a pair rsieve cannot honour."""
    rel = file.relative_to(folder).as_posix()
    if not isinstance(row, dict):
        detail = str(row) if isinstance(row, ValueError) else f"a JSON {type(row).__name__}"
        return [
            {
                "id": f"{file.stem}-{n}",
                **({"family": family} if family else {}),
                "source": _row_source(None, rel, n, None),
                "unsupported": "invalid_json",
                "unsupported_detail": f"the row is not a JSON object: {detail}"[:300],
            }
        ]
    fmt = "llava" if isinstance(row.get("conversations"), list) else None
    if fmt is None and isinstance(row.get("messages"), list):
        fmt = "messages"
    row_id = str(row["id"]) if row.get("id") is not None else f"{file.stem}-{n}"
    row_family = row.get("family") or family
    source = _row_source(row.get("source"), rel, n, fmt)

    def line(k: int, **fields: Any) -> dict[str, Any]:
        head = {"id": row_id + (f"-{k}" if k else "")}
        return head | ({"family": row_family} if row_family else {}) | fields

    def unsupported(reason: str, detail: str, k: int = 0) -> dict[str, Any]:
        return line(k, source=source, unsupported=reason, unsupported_detail=detail)

    if fmt is None:
        return [unsupported("unsupported_turn", "the row has no conversations or messages")]
    images = _row_images(row)
    if len(images) > 1:
        return [unsupported("multi_image", f"{len(images)} images")]
    if not images:
        return [unsupported("no_image", "no image or images")]
    pairs = list(_pairs(row["conversations" if fmt == "llava" else "messages"], fmt))
    if not pairs:
        return [unsupported("unsupported_turn", "no user turn answered by an assistant turn")]
    image = None
    if any(not other and refs <= 1 for (_, refs, other), _ in pairs):
        image = _place_image(pool, folder, file, images[0])
        if image is None:
            return [unsupported("no_image", "the image holds neither bytes nor a path")]
    extra = {k: row[k] for k in ("options", "protocol") if row.get(k) is not None}
    if "options" in extra:
        extra["options"] = _plain(extra["options"])
    out: list[dict[str, Any]] = []
    for k, ((text, refs, other), answer) in enumerate(pairs):
        if other or refs > 1:
            held = ", ".join(other) if other else f"{refs} images"
            out.append(unsupported("unsupported_turn", f"the question holds {held}", k))
            continue
        question = text.replace("<image>", "").strip()
        out.append(line(k, image=image, question=question, answer=answer, source=source) | extra)
    return out


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
    Parquet / HF dataset folder, InfinityMM records, conversation rows). The images go in
    packs with their index (`_packs/`, rsieve.run.packs), a few objects instead of one per
    image. Image files the upload refused (symbolic links leaving the folder; files over
    `image_max_bytes`, by their size before a byte is read) are listed in `_refused.json`
    for the cleaner, which quarantines their lines. `_complete` is written last and holds
    the digest."""
    pool = read_pool(folder, family=family)
    if image_max_bytes is not None:
        pool.refuse_larger_than(image_max_bytes)
    names = sorted(pool.files)
    extra: dict[str, bytes] = {ITEMS: pool.items}
    if pool.refused:
        extra[REFUSED] = json.dumps(pool.refused, sort_keys=True).encode()
    shas = {name: hashlib.sha256(pool.read(name)).hexdigest() for name in names}
    pool_sha = pool_digest(pool.items, shas, extra.get(REFUSED))
    prefix = keys.pool_prefix(pool_sha)
    if not store.exists(prefix + COMPLETE):
        # In line order, so a shard's images lie together.
        write_packs(store, prefix, ((n, pool.read(n)) for n in _in_line_order(pool.items, names)))
        for name, data in extra.items():
            store.put(prefix + name, data)
        store.put(prefix + COMPLETE, pool_sha.encode())
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
