"""The bucket's layout (rsieve.keys), pinned: each key's exact string. A key that changes
orphans what was stored under the old one (runs in flight, published datasets, the judge
cache), so a change here is a storage migration, never a refactor. And rsieve.keys is the
one place keys are built: no other module of shared/ or services/ spells a top-level
prefix."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest

from rsieve import keys
from rsieve.clean import decontam
from rsieve.compact import compaction
from rsieve.judge import calibration, judgecache

ROOT = Path(__file__).resolve().parents[2]
RUN = "grow-0123456789abcdef"
SHA = "ab" * 32

PINNED = [
    # top level
    (keys.POOLS_PREFIX, "pools/"),
    (keys.pool_prefix(SHA), f"pools/{SHA}/"),
    (keys.IMAGES_PREFIX, "images/"),
    (keys.image(SHA), f"images/{SHA}"),
    (keys.EVALSETS_PREFIX, "evalsets/"),
    (keys.evalset("held-out"), "evalsets/held-out.json"),
    (keys.JUDGE_CACHE_PREFIX, "judge-cache/"),
    (keys.judge_reply(SHA), f"judge-cache/{SHA}.json"),
    (keys.INDEX_PREFIX, "index/"),
    (keys.RUN_INDEX_PREFIX, "index/runs/"),
    (keys.run_index(RUN), f"index/runs/{RUN}.json"),
    (keys.RUNS_PREFIX, "runs/"),
    (keys.DATASETS_PREFIX, "datasets/"),
    # runs/<run>/
    (keys.run_prefix(RUN), f"runs/{RUN}/"),
    (keys.run_spec(RUN), f"runs/{RUN}/run.json"),
    (keys.shards(RUN), f"runs/{RUN}/shards.json"),
    (keys.cleaning(RUN), f"runs/{RUN}/cleaning.json"),
    (keys.shard_input(RUN, "00003"), f"runs/{RUN}/input/00003.json"),
    (keys.stage_prefix(RUN, "verify"), f"runs/{RUN}/verify/"),
    (keys.stage_output(RUN, "judge", "00003"), f"runs/{RUN}/judge/00003.json"),
    (keys.progress(RUN, "generate", "00003"), f"runs/{RUN}/progress/generate/00003.json"),
    (keys.calibration_prefix(RUN), f"runs/{RUN}/calibration/"),
    (keys.calibration(RUN, "00003"), f"runs/{RUN}/calibration/00003.json"),
    (keys.corrupt_prefix(RUN), f"runs/{RUN}/corrupt/"),
    (
        keys.corrupt_copy(RUN, "verify", "00003", "ab" * 32),
        f"runs/{RUN}/corrupt/verify/00003.{'ab' * 8}.bad",
    ),
    (
        keys.corrupt_record(RUN, "verify", "00003", "ab" * 32),
        f"runs/{RUN}/corrupt/verify/00003.{'ab' * 8}.json",
    ),
    (keys.reviews_prefix(RUN), f"runs/{RUN}/reviews/"),
    (
        keys.review(RUN, "item-7"),
        f"runs/{RUN}/reviews/{hashlib.sha256(b'item-7').hexdigest()}.json",
    ),
    (
        keys.review(RUN, "a/b c"),
        f"runs/{RUN}/reviews/{hashlib.sha256(b'a/b c').hexdigest()}.json",
    ),
    # runs/<run>/ingest/
    (keys.ingest_plan(RUN), f"runs/{RUN}/ingest/plan.json"),
    (keys.ingest_done_prefix(RUN, "exact"), f"runs/{RUN}/ingest/done/exact/"),
    (keys.ingest_done(RUN, "exact", 7), f"runs/{RUN}/ingest/done/exact/00007.json"),
    (keys.ingest_part_prefix(RUN, "refs", 12), f"runs/{RUN}/ingest/refs/00012/"),
    (keys.ingest_part(RUN, "refs", 12, "00003"), f"runs/{RUN}/ingest/refs/00012/00003.json"),
    # runs/<run>/compact/
    (keys.compact_prefix(RUN), f"runs/{RUN}/compact/"),
    (keys.compact_plan(RUN), f"runs/{RUN}/compact/plan.json"),
    (keys.compact_calibration(RUN), f"runs/{RUN}/compact/calibration.json"),
    (keys.compact_piece(RUN, "p002", 5), f"runs/{RUN}/compact/route/p002/00005.json"),
    (keys.compact_routed_prefix(RUN), f"runs/{RUN}/compact/route/calibration/"),
    (keys.compact_routed(RUN, 5), f"runs/{RUN}/compact/route/calibration/00005.json"),
    (keys.compact_generation_prefix(RUN, 3), f"runs/{RUN}/compact/g3/"),
    (keys.compact_summary(RUN, 3, "p002"), f"runs/{RUN}/compact/g3/p002.json"),
    (keys.compact_quarantine(RUN, 3, "p002"), f"runs/{RUN}/compact/g3/p002.quarantine.jsonl"),
    # datasets/<dataset>/
    (keys.MANIFEST, "manifest.json"),
    (keys.NEAR_KEYS_SUFFIX, ".near.json"),
    (keys.dataset_prefix("grow"), "datasets/grow/"),
    (keys.dataset_file("grow", "data/x.parquet"), "datasets/grow/data/x.parquet"),
    (keys.manifest("grow"), "datasets/grow/manifest.json"),
    (keys.dataset_keys_prefix("grow"), "datasets/grow/keys/"),
    (keys.near_keys("grow", RUN), f"datasets/grow/keys/{RUN}.near.json"),
    (keys.near_keys("grow", f"{RUN}-p001"), f"datasets/grow/keys/{RUN}-p001.near.json"),
    # relative to the dataset's prefix
    (keys.data_shard("S", "run-1", 2, 10), "data/S-run-1-00002-of-00010.parquet"),
    (keys.data_shard("S", "run-1", 0, 1, "p001"), "data/S-run-1-p001-00000-of-00001.parquet"),
    (keys.qa_key_bucket("ab", RUN), f"keys/qa/ab-{RUN}.bin"),
    (keys.legacy_run_keys(RUN), f"keys/{RUN}.json"),
    (keys.example_image(SHA, "png"), f"examples/{SHA[:16]}.png"),
    (keys.commit_file(RUN, "README.md"), f"commits/{RUN}/README.md"),
]


@pytest.mark.parametrize(("got", "want"), PINNED, ids=[w for _, w in PINNED])
def test_each_key_is_pinned(got: str, want: str) -> None:
    assert got == want


def test_every_public_name_is_pinned() -> None:
    """A key added to rsieve.keys is added to PINNED too (the parsers aside)."""
    parsers = {"evalset_name", "dataset_of_manifest", "near_keys_run"}
    pinned = {w for _, w in PINNED}
    for name in set(keys.__all__) - parsers:
        value = getattr(keys, name)
        if isinstance(value, str):
            assert value in pinned, name
    functions = {n for n in keys.__all__ if callable(getattr(keys, n))} - parsers
    source = Path(__file__).read_text(encoding="utf-8")
    assert not {n for n in functions if f"keys.{n}(" not in source}


def test_the_parsers_invert_the_builders() -> None:
    assert keys.evalset_name(keys.evalset("held-out")) == "held-out"
    assert keys.evalset_name("evalsets/readme.txt") is None
    assert keys.evalset_name("runs/x.json") is None
    assert keys.dataset_of_manifest(keys.manifest("grow")) == "grow"
    assert keys.dataset_of_manifest("datasets/grow/commits/r/manifest.json") is None
    assert keys.dataset_of_manifest("datasets/grow/README.md") is None
    assert keys.near_keys_run("grow", keys.near_keys("grow", f"{RUN}-p001")) == f"{RUN}-p001"
    assert keys.near_keys_run("grow", keys.dataset_file("grow", keys.legacy_run_keys(RUN))) is None
    assert keys.near_keys_run("other", keys.near_keys("grow", RUN)) is None


def test_the_old_names_are_the_keys() -> None:
    """Names tests and callers knew before rsieve.keys stay, as the keys' own functions."""
    assert calibration.calibration_key is keys.calibration
    assert decontam.evalset_key is keys.evalset
    assert decontam.near_keys_key is keys.near_keys
    assert compaction.shard_name is keys.data_shard
    assert judgecache.CACHE_PREFIX == keys.JUDGE_CACHE_PREFIX


def test_the_manifest_points_at_commit_files() -> None:
    manifest = compaction.next_manifest(
        None, dataset="grow", run=RUN, shards=[], adds_up=True, sampled=False
    )
    assert manifest["files"]["README.md"] == keys.commit_file(RUN, "README.md")
    assert manifest["files"][f"reports/{RUN}.json"] == f"commits/{RUN}/run_report.json"


# Top-level prefixes no module but rsieve.keys may spell. `images/` is left out: a pool's
# own folder names embedded images `images/<sha256>.<ext>` (rsieve.adapters.pools).
PREFIXES = ("runs/", "datasets/", "index/", "evalsets/", "pools/", "judge-cache/")
NOT_KEYS = {"judge-cache/1"}  # rsieve.judge.judgecache.CACHE_VERSION: a version tag in the digest


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_keys(path: Path) -> list[str]:
    """`line: text` of each string in `path`'s code (docstrings and comments aside) that
    starts with a top-level prefix: a plain string, or an f-string's first part."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    heads: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                heads.append((node.lineno, first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            heads.append((node.lineno, node.value))
    return sorted(
        f"{line}: {text!r}"
        for line, text in heads
        if text.startswith(PREFIXES) and text not in NOT_KEYS
    )


SOURCES = sorted(
    p
    for folder in (ROOT / "shared", ROOT / "services")
    for p in folder.rglob("*.py")
    if p != ROOT / "shared" / "rsieve" / "keys.py"
)


def test_the_sources_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {
        "services/outputs.py",
        "services/compactor/steps.py",
        "shared/rsieve/judge/calibration.py",
    } <= names
    assert "shared/rsieve/keys.py" not in names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_key_is_spelled_outside_rsieve_keys(path: Path) -> None:
    found = spelled_keys(path)
    assert not found, f"{path.relative_to(ROOT)} builds keys itself (use rsieve.keys): {found}"


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""runs/<run>/x.json is documented here, and that is fine."""\n'
        '# f"runs/{run}/x" in a comment is fine too\n'
        'A = f"runs/{run}/shards.json"\n'
        'B = "datasets/" + name\n'
        'C = "index/runs/"\n'
        'D = f"s3://{bucket}/runs/"\n'
        'E = "judge-cache/1"\n',
        encoding="utf-8",
    )
    assert spelled_keys(bad) == ["3: 'runs/'", "4: 'datasets/'", "5: 'index/runs/'"]
