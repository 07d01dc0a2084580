"""Provenance: does an item's recorded source resolve to the image attached to it?

Pure: `parse_source` reads what a source names (a content hash, a local path, an s3:// URI,
a dataset row or remote file, or only a tag); `decide` takes the verdict from that, the
attached image's sha256, the policy, and what a `SourceResolver` found at the location.
The resolvers that read files and objects live in the cleaner (services/cleaner/sources.py)
behind the `SourceResolver` interface, so the rules are tested without any I/O.

Verdicts (`check` is written to clean_meta.provenance, or is the quarantine detail):
- a recorded sha256 must equal the image's (`sha256_match`);
- a local path or s3:// URI that resolves must hold the same bytes (`local_match`,
  `s3_match`); one that does not exist is refused whatever the policy; one the cleaner may
  not read (outside `provenance_roots`, a bucket its credentials do not reach) is refused
  under `strict` unless a matching sha256 is recorded, admitted as `unresolved` under
  `lenient`;
- a dataset row, a repository file or an http(s) URL cannot be fetched offline: admitted
  as `recorded` unless a sha256 is also given (then the hash decides);
- a source that names no location (a tag such as InfinityMM's) is `recorded`;
- no source at all is refused under `strict` and admitted under `lenient` (`no_source`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["Resolution", "SourceRef", "SourceResolver", "decide", "parse_source", "verify_source"]

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
Kind = Literal["none", "hash", "local", "s3", "dataset", "remote", "tag"]
_LABEL = {"local": "local path", "s3": "s3 object"}


@dataclass(frozen=True)
class SourceRef:
    """What a source names: `kind`, `location` (a path or URI, for local / s3 / remote /
    dataset), and the recorded sha256 if any (`sha256_raw` as written, may be malformed)."""

    kind: Kind
    location: str | None = None
    sha256_raw: Any = None


@dataclass(frozen=True)
class Resolution:
    """What a resolver found at a location: `found` with the bytes' sha256, `missing`
    (the location is checkable and holds nothing), or `unresolvable` (the cleaner may not
    or cannot read it: `why`)."""

    status: Literal["found", "missing", "unresolvable"]
    sha256: str | None = None
    why: str = ""


class SourceResolver(Protocol):
    def resolve(self, ref: SourceRef) -> Resolution:
        """Only called for `local` and `s3` references."""
        ...


def _location_kind(text: str) -> Kind:
    if text.startswith("s3://"):
        return "s3"
    if text.startswith("file://") or text.startswith("/"):
        return "local"
    if text.startswith(("http://", "https://", "hf://", "gs://")):
        return "remote"
    return "tag"


def parse_source(source: Any) -> SourceRef:
    """Classify a pool item's `source` (a string or an object)."""
    if source is None or source == "" or source == {}:
        return SourceRef("none")
    if isinstance(source, str):
        text = source.strip()
        if _SHA256.fullmatch(text):
            return SourceRef("hash", sha256_raw=text)
        kind = _location_kind(text)
        return SourceRef(kind, text if kind != "tag" else None)
    if not isinstance(source, dict):
        return SourceRef("tag")
    sha = source.get("sha256")
    if any(k in source for k in ("dataset", "repo", "hf_dataset")):  # a row or a repo file
        where = "/".join(
            str(source[k])
            for k in ("dataset", "repo", "split", "path", "row", "commit")
            if source.get(k) is not None
        )
        return SourceRef("dataset", where, sha)
    for key in ("uri", "url", "s3"):
        if isinstance(source.get(key), str):
            kind = _location_kind(source[key].strip())
            if kind != "tag":
                return SourceRef(kind, source[key].strip(), sha)
    if isinstance(source.get("path"), str) and source["path"].strip():
        return SourceRef("local", source["path"].strip(), sha)
    return SourceRef("hash" if sha is not None else "tag", None, sha)


def _sha_verdict(raw: Any, image_sha256: str) -> tuple[bool, str]:
    if not isinstance(raw, str) or not _SHA256.fullmatch(raw):
        return False, f"recorded sha256 is not a sha256: {str(raw)[:70]!r}"
    if raw.lower() == image_sha256:
        return True, "sha256_match"
    return False, f"sha256 mismatch: recorded {raw[:16]}.., image {image_sha256[:16]}.."


def decide(
    ref: SourceRef, image_sha256: str, policy: str, found: Resolution | None = None
) -> tuple[bool, str]:
    """(admitted, check). `found` is the resolver's answer for local / s3 references
    (None: not resolved, treated as unresolvable)."""
    if ref.kind == "none":
        return policy == "lenient", "no_source"
    sha = None if ref.sha256_raw is None else _sha_verdict(ref.sha256_raw, image_sha256)
    if sha is not None and not sha[0]:
        return sha  # a recorded hash that is malformed or differs: refused whatever else
    if ref.kind in ("hash", "dataset", "remote", "tag"):
        return sha if sha is not None else (True, "recorded")
    label, where = _LABEL[ref.kind], str(ref.location)[:200]
    found = found or Resolution("unresolvable", why="not resolved")
    if found.status == "found":
        if found.sha256 == image_sha256:
            return True, f"{ref.kind}_match"
        # Never the found object's hash: it could be anyone's object the credentials reach.
        has = "other bytes" if found.sha256 else found.why
        return (
            False,
            f"{label} bytes differ from the image: {where} has {has}, image "
            f"sha256 {image_sha256[:16]}..",
        )
    if found.status == "missing":
        return False, f"{label} does not exist: {where}"
    if sha is not None:  # the location cannot be read, but the recorded hash matched
        return sha
    if policy == "lenient":
        return True, "unresolved"
    return False, f"{label} unresolvable under strict policy: {where} ({found.why})"


def verify_source(
    source: Any, image_sha256: str, policy: str, resolver: SourceResolver | None
) -> tuple[bool, str]:
    """parse_source, the resolver for local and s3 references (only when its answer can
    change the verdict), then decide."""
    ref = parse_source(source)
    found = None
    if ref.kind in ("local", "s3") and resolver is not None:
        sha = None if ref.sha256_raw is None else _sha_verdict(ref.sha256_raw, image_sha256)
        if sha is None or sha[0]:
            found = resolver.resolve(ref)
    return decide(ref, image_sha256, policy, found)
