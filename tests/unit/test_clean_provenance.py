"""Provenance resolvers: classification and verdicts (pure), and the cleaner's local / S3
resolver against temporary files and a fake store."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from rsieve.clean.provenance import Resolution, SourceRef, decide, parse_source, verify_source
from rsieve.errors import NotFoundError, PermanentError
from rsieve.settings import Settings
from services.cleaner.sources import StackResolver

IMG = hashlib.sha256(b"image").hexdigest()
OTHER = hashlib.sha256(b"other").hexdigest()


@pytest.mark.parametrize(
    ("source", "kind", "location"),
    [
        (None, "none", None),
        ("", "none", None),
        ({}, "none", None),
        (IMG, "hash", None),
        ({"sha256": IMG}, "hash", None),
        ("/data/a.png", "local", "/data/a.png"),
        ("file:///data/a.png", "local", "file:///data/a.png"),
        ({"path": "sub/a.png"}, "local", "sub/a.png"),
        ({"uri": "file:///data/a.png", "sha256": IMG}, "local", "file:///data/a.png"),
        ("s3://bucket/k/a.png", "s3", "s3://bucket/k/a.png"),
        ({"s3": "s3://bucket/a.png"}, "s3", "s3://bucket/a.png"),
        ({"repo": "o/r", "path": "a.png", "commit": "abc"}, "dataset", "o/r/a.png/abc"),
        ({"dataset": "x/y", "split": "test", "row": 3}, "dataset", "x/y/test/3"),
        ("https://example.org/a.png", "remote", "https://example.org/a.png"),
        ("LLaVA-CC3M", "tag", None),
        ({"generator": "scripts/x.py"}, "tag", None),
        (7, "tag", None),
    ],
)
def test_parse_source(source: Any, kind: str, location: str | None) -> None:
    ref = parse_source(source)
    assert (ref.kind, ref.location) == (kind, location)


FOUND = Resolution("found", sha256=IMG)
FOUND_OTHER = Resolution("found", sha256=OTHER)
MISSING = Resolution("missing")
UNRES = Resolution("unresolvable", why="not under a provenance root")


@pytest.mark.parametrize("policy", ["strict", "lenient"])
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_location_match_mismatch_missing(kind: str, policy: str) -> None:
    ref = SourceRef(kind, "/x.png" if kind == "local" else "s3://b/x.png")  # type: ignore[arg-type]
    assert decide(ref, IMG, policy, FOUND) == (True, f"{kind}_match")
    ok, why = decide(ref, IMG, policy, FOUND_OTHER)
    assert not ok and "bytes differ from the image" in why
    assert OTHER[:16] not in why  # another object's hash is never echoed
    ok, why = decide(ref, IMG, policy, MISSING)
    assert not ok and "does not exist" in why


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_unresolvable_is_refused_only_under_strict(kind: str) -> None:
    ref = SourceRef(kind, "/x.png")  # type: ignore[arg-type]
    ok, why = decide(ref, IMG, "strict", UNRES)
    assert not ok and "unresolvable under strict policy" in why and "provenance root" in why
    assert decide(ref, IMG, "lenient", UNRES) == (True, "unresolved")
    assert decide(ref, IMG, "strict", None)[0] is False  # no resolver: not verified


def test_unresolvable_location_with_matching_hash_is_admitted_by_the_hash() -> None:
    ref = SourceRef("local", "upstream/x.png", IMG)
    assert decide(ref, IMG, "strict", UNRES) == (True, "sha256_match")


def test_recorded_hash_mismatch_wins_over_a_matching_location() -> None:
    ok, why = decide(SourceRef("local", "/x.png", OTHER), IMG, "lenient", FOUND)
    assert not ok and why.startswith("sha256 mismatch")
    ok, why = decide(SourceRef("s3", "s3://b/x", "nothex"), IMG, "lenient", FOUND)
    assert not ok and why.startswith("recorded sha256 is not a sha256")


@pytest.mark.parametrize("policy", ["strict", "lenient"])
def test_dataset_rows_are_recorded_unless_a_hash_is_given(policy: str) -> None:
    row = {"dataset": "x/y", "split": "test", "row": 3}
    assert verify_source(row, IMG, policy, None) == (True, "recorded")
    assert verify_source(row | {"sha256": IMG}, IMG, policy, None) == (True, "sha256_match")
    assert not verify_source(row | {"sha256": OTHER}, IMG, policy, None)[0]
    assert verify_source("https://x.org/a.png", IMG, policy, None) == (True, "recorded")
    assert verify_source("LLaVA-CC3M", IMG, policy, None) == (True, "recorded")


def test_no_source_follows_the_policy() -> None:
    assert verify_source(None, IMG, "strict", None) == (False, "no_source")
    assert verify_source(None, IMG, "lenient", None) == (True, "no_source")


class _Resolver:
    def __init__(self, answer: Resolution) -> None:
        self.answer, self.calls = answer, 0

    def resolve(self, ref: SourceRef) -> Resolution:
        self.calls += 1
        return self.answer


def test_verify_source_asks_the_resolver_only_when_it_can_change_the_verdict() -> None:
    r = _Resolver(FOUND)
    assert verify_source("/data/x.png", IMG, "strict", r) == (True, "local_match")
    assert verify_source({"path": "/x", "sha256": OTHER}, IMG, "strict", r)[0] is False
    assert verify_source({"dataset": "d", "row": 1}, IMG, "strict", r) == (True, "recorded")
    assert r.calls == 1


# --- the cleaner's resolver ------------------------------------------------------------


class _Store:
    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.reads: list[str] = []

    def get(self, key: str) -> bytes:
        if key not in self.objects:
            raise NotFoundError(key)
        self.reads.append(key)
        return self.objects[key]

    def size(self, key: str) -> int | None:
        return len(self.objects[key]) if key in self.objects else None


def _stack_resolver(
    roots: list[Path], objects: dict[str, dict[str, bytes]], **settings: Any
) -> StackResolver:
    stores = {bucket: _Store(held) for bucket, held in objects.items()}

    def store_for(bucket: str) -> Any:
        if bucket not in stores:
            raise PermanentError(f"S3 NoSuchBucket on {bucket}")
        return stores[bucket]

    class _Lazy:  # the error surfaces on get, as with a real store
        def __init__(self, bucket: str) -> None:
            self.bucket = bucket

        def get(self, key: str) -> bytes:
            return store_for(self.bucket).get(key)

        def size(self, key: str) -> int | None:
            return store_for(self.bucket).size(key)

    resolver = StackResolver(
        Settings(provenance_roots=[str(r) for r in roots], s3_bucket="rsieve", **settings),
        _Lazy,  # type: ignore[arg-type]
    )
    resolver.stores = stores  # type: ignore[attr-defined]  # what the tests look into
    return resolver


def test_local_resolver(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "a.png").write_bytes(b"image")
    (root / "b.png").write_bytes(b"other")
    (outside / "c.png").write_bytes(b"image")
    (root / "link.png").symlink_to(outside / "c.png")
    r = _stack_resolver([root], {})
    check = lambda source: verify_source(source, IMG, "strict", r)  # noqa: E731
    assert check(str(root / "a.png")) == (True, "local_match")
    assert check(f"file://{root}/a.png") == (True, "local_match")
    assert check({"path": "a.png"}) == (True, "local_match")  # relative: under a root
    assert "bytes differ" in check(str(root / "b.png"))[1]
    assert "does not exist" in check(str(root / "nope.png"))[1]
    assert "provenance root" in check(str(outside / "c.png"))[1]
    assert "provenance root" in check(str(root / "link.png"))[1]  # a link leaving the root
    assert "provenance root" in check({"path": "../outside/c.png"})[1]
    none = _stack_resolver([], {})
    ok, why = verify_source(str(root / "a.png"), IMG, "strict", none)
    assert not ok and "no provenance_roots configured" in why


def test_s3_resolver() -> None:
    r = _stack_resolver([], {"rsieve": {"up/a.png": b"image", "up/b.png": b"other"}})
    check = lambda source: verify_source(source, IMG, "strict", r)  # noqa: E731
    assert check("s3://rsieve/up/a.png") == (True, "s3_match")
    assert "bytes differ" in check("s3://rsieve/up/b.png")[1]
    assert "does not exist" in check("s3://rsieve/up/c.png")[1]
    ok, why = check("s3://elsewhere/a.png")
    assert not ok and "unresolvable" in why and "bucket not in provenance_buckets" in why
    assert verify_source("s3://elsewhere/a.png", IMG, "lenient", r) == (True, "unresolved")
    allowed = _stack_resolver([], {}, provenance_buckets=["elsewhere"])
    ok, why = verify_source("s3://elsewhere/a.png", IMG, "strict", allowed)
    assert not ok and "NoSuchBucket" in why


@pytest.mark.parametrize("bucket", ["Bad_Bucket", "a", "x" * 64, "-lead", "bucket!"])
def test_a_malformed_bucket_is_unresolvable_never_a_retry(bucket: str) -> None:
    r = _stack_resolver([], {}, provenance_buckets=[bucket])
    ok, why = verify_source(f"s3://{bucket}/a.png", IMG, "strict", r)
    assert not ok and "not an S3 bucket name" in why


def test_an_s3_object_over_the_image_limit_is_never_read() -> None:
    r = _stack_resolver([], {"rsieve": {"big.png": b"x" * 2048}}, image_max_bytes=1024)
    ok, why = verify_source("s3://rsieve/big.png", IMG, "strict", r)
    assert not ok and "2048 bytes, more than image_max_bytes" in why
    assert r.stores["rsieve"].reads == []  # type: ignore[attr-defined]
