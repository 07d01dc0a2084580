"""Object storage behind one small interface; boto3 errors become rsieve errors.

Keys are deterministic, so a redelivered message rewrites the same object; every one is
built by rsieve.keys, whose docstring draws the bucket's layout.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from rsieve.errors import NotFoundError, PermanentError, RetryableError
from rsieve.run.packs import (
    INDEX,
    INDEX_BUCKETED_FROM,
    ImageRef,
    PackIndex,
    PackWriter,
    Read,
    index_bucket_key,
    index_buckets,
    plan_reads,
    slice_read,
)
from rsieve.settings import Settings

__all__ = ["ObjectStore", "PackReader", "S3Store", "parse_s3_uri", "read_images", "write_packs"]


class ObjectStore(Protocol):
    bucket: str

    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, end: int) -> bytes: ...
    def put(self, key: str, data: bytes, *, content_type: str = ...) -> None: ...
    def put_file(self, key: str, path: str, *, content_type: str = ...) -> None: ...
    def delete(self, key: str) -> None: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str) -> Iterator[str]: ...
    def sizes(self, prefix: str) -> dict[str, int]: ...
    def size(self, key: str) -> int | None: ...


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise PermanentError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


def _translate(exc: Exception, key: str) -> Exception:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("NoSuchKey", "404", "NotFound"):
            return NotFoundError(key)
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout"):
            return RetryableError(f"S3 {code} on {key}")
        return PermanentError(f"S3 {code} on {key}")
    if isinstance(exc, EndpointConnectionError | BotoCoreError):
        return RetryableError(f"S3 unreachable on {key}: {type(exc).__name__}")
    return exc


class S3Store:
    """Any S3 endpoint (SeaweedFS locally). One bucket; keys as in the module docstring."""

    def __init__(self, settings: Settings, *, bucket: str | None = None) -> None:
        self.bucket = bucket or settings.s3_bucket
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint,
            region_name=settings.s3_region,
            aws_access_key_id=settings.s3_access_key.get_secret_value(),
            aws_secret_access_key=settings.s3_secret_key.get_secret_value(),
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                s3={"addressing_style": "path"},
            ),
        )

    @contextmanager
    def _as_rsieve_errors(self, key: str) -> Iterator[None]:
        """boto3's errors as rsieve's (NotFound, Retryable, Permanent), in one place."""
        try:
            yield
        except Exception as exc:
            raise _translate(exc, key) from exc

    def get(self, key: str) -> bytes:
        with self._as_rsieve_errors(key):
            return bytes(self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object (one ranged GET)."""
        if end <= start:
            return b""
        with self._as_rsieve_errors(key):
            body = self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )["Body"]
            return bytes(body.read())

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        with self._as_rsieve_errors(key):
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType=content_type
            )

    def put_file(
        self, key: str, path: str, *, content_type: str = "application/octet-stream"
    ) -> None:
        """Upload a local file; large files go as multipart uploads (parts of 64 MiB)."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=64 * 1024 * 1024, multipart_chunksize=64 * 1024 * 1024
        )
        with self._as_rsieve_errors(key):
            self._client.upload_file(
                path, self.bucket, key, Config=config, ExtraArgs={"ContentType": content_type}
            )

    def delete(self, key: str) -> None:
        with self._as_rsieve_errors(key):
            self._client.delete_object(Bucket=self.bucket, Key=key)

    def exists(self, key: str) -> bool:
        try:
            with self._as_rsieve_errors(key):
                self._client.head_object(Bucket=self.bucket, Key=key)
            return True
        except NotFoundError:
            return False

    def list(self, prefix: str) -> Iterator[str]:
        with self._as_rsieve_errors(prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    yield obj["Key"]

    def size(self, key: str) -> int | None:
        """The object's size in bytes (one HEAD), None when there is no such object."""
        try:
            with self._as_rsieve_errors(key):
                return int(self._client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except NotFoundError:
            return None

    def sizes(self, prefix: str) -> dict[str, int]:
        """Key -> size in bytes of every object under `prefix` (one listing)."""
        with self._as_rsieve_errors(prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            return {o["Key"]: int(o["Size"]) for page in pages for o in page.get("Contents", [])}


def write_packs(store: ObjectStore, prefix: str, images: Iterable[tuple[str, bytes]]) -> PackIndex:
    """A pool's images (path, bytes), in the order given, as packs under `prefix`, then
    their index (`_packs/index.json`), which is written last (after its buckets, for a
    large pool: rsieve.run.packs.INDEX_BUCKETS); memory is one pack and the index."""
    writer = PackWriter(prefix)
    for path, data in images:
        if done := writer.add(path, data):
            store.put(*done)
    if done := writer.flush():
        store.put(*done)
    if len(writer.index.images) >= INDEX_BUCKETED_FROM:
        for bucket, part in enumerate(index_buckets(writer.index)):
            store.put(prefix + index_bucket_key(bucket), part.model_dump_json().encode())
    store.put(
        prefix + INDEX, writer.index.model_dump_json().encode(), content_type="application/json"
    )
    return writer.index


def read_images(
    store: ObjectStore, refs: Iterable[ImageRef], *, threads: int = 8
) -> dict[str, bytes]:
    """sha256 -> bytes of every image `refs` point at: one ranged GET per stretch of a
    pack (rsieve.run.packs.plan_reads), several at once. An image its pack does not hold
    (missing object, short pack) is absent from the answer."""
    reads = plan_reads(refs)

    def fetch(read: Read) -> list[tuple[str, bytes]]:
        try:
            return list(slice_read(read, store.get_range(read.pack, read.start, read.end)))
        except NotFoundError:
            return []

    if len(reads) <= 1:
        return dict(pair for read in reads for pair in fetch(read))
    with ThreadPoolExecutor(max_workers=min(threads, len(reads))) as pool:
        return dict(pair for found in pool.map(fetch, reads) for pair in found)


class PackReader:
    """Images by sha256 for a reader that walks them in (roughly) pack order, such as the
    compactor writing rows in pool order: a miss fetches the whole planned read holding
    the image, and the last `keep` reads stay in memory (at most `keep` x 32 MiB)."""

    def __init__(self, store: ObjectStore, refs: Iterable[ImageRef], keep: int = 2) -> None:
        self._store, self._keep = store, keep
        self._reads = plan_reads(refs)
        self._read_of: dict[str, int] = {}  # sha256 -> its read's number
        for n, read in enumerate(self._reads):
            for ref in read.refs:
                self._read_of.setdefault(ref.sha256, n)
        self._cache: OrderedDict[int, dict[str, bytes]] = OrderedDict()

    def __contains__(self, sha: str) -> bool:
        return sha in self._read_of

    def get(self, sha: str) -> bytes:
        n = self._read_of.get(sha)
        if n is None:
            raise NotFoundError(f"no pack holds image {sha}")
        if n not in self._cache:
            read = self._reads[n]
            self._cache[n] = dict(
                slice_read(read, self._store.get_range(read.pack, read.start, read.end))
            )
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        self._cache.move_to_end(n)
        if sha not in self._cache[n]:
            raise NotFoundError(f"pack {self._reads[n].pack} is shorter than its index says")
        return self._cache[n][sha]
