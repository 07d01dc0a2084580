"""Fakes for `services.worker.bootstrap` (unit tests of the services' logic, no stack):
an in-memory object store that keeps the `ObjectStore` protocol, and a recorder of the
tasks a stage enqueues. Redis is fakeredis's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rsieve.errors import NotFoundError


class MemoryStore:
    """rsieve.adapters.storage.ObjectStore in a dict (keys sorted on listing, like S3)."""

    def __init__(self, bucket: str = "rsieve") -> None:
        self.bucket = bucket
        self.objects: dict[str, bytes] = {}

    def get(self, key: str) -> bytes:
        if key not in self.objects:
            raise NotFoundError(key)
        return self.objects[key]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.get(key)[start:end]  # [start, end), as S3Store.get_range

    def put(self, key: str, data: bytes, *, content_type: str = "") -> None:
        self.objects[key] = bytes(data)

    def put_file(self, key: str, path: str, *, content_type: str = "") -> None:
        self.objects[key] = Path(path).read_bytes()

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def exists(self, key: str) -> bool:
        return key in self.objects

    def list(self, prefix: str) -> Iterator[str]:
        return iter(sorted(k for k in self.objects if k.startswith(prefix)))

    def size(self, key: str) -> int | None:
        return len(self.objects[key]) if key in self.objects else None

    def sizes(self, prefix: str) -> dict[str, int]:
        return {k: len(self.objects[k]) for k in self.list(prefix)}


class Sent:
    """What a stage enqueued, as (task name, kwargs)."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, task: str, kwargs: dict[str, Any]) -> None:
        self.tasks.append((task, kwargs))
