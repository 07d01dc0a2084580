"""rsieve.redis_keys owns every Redis key rsieve writes: each key's string pinned here (a
change is a migration: a running deployment's keys change name), and no Redis key
written out anywhere else in the tree."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from rsieve import redis_keys as rk

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "shared" / "rsieve" / "redis_keys.py"
# A string that begins with a key of rsieve's: `rsieve:` then a name or a placeholder.
_KEY = re.compile(r"^[rbfRBF]*(?:'''|\"\"\"|'|\")rsieve:[a-z{]")
# Strings that begin so and are not rsieve's Redis keys: container image names, and the
# scratch key of a test of Triton's own Redis cache.
NOT_KEYS = {
    ("tests/unit/test_k8s_manifests.py", 'f"rsieve:{tag}"'),
    ("tests/integration/test_triton_models.py", '"rsieve:k"'),
}


def test_every_key_is_pinned() -> None:
    assert rk.KEPT_S == 604800
    assert rk.METRICS == "rsieve:metrics"
    assert rk.METRIC_FAMILIES == "rsieve:metrics:families"
    assert rk.metric_counter("rsieve_items") == "rsieve:metrics:c:rsieve_items"
    assert rk.metric_histogram("rsieve_stage_seconds") == "rsieve:metrics:h:rsieve_stage_seconds"
    assert rk.progress("r-1", "judge") == "rsieve:progress:r-1:judge"
    assert rk.HOLDINGS == "rsieve:holdings"
    assert rk.holder("vm:1:ab") == "rsieve:holder:vm:1:ab"
    assert rk.run_orphaned("r-1") == "rsieve:run:r-1:orphaned"
    assert rk.run_failed("r-1") == "rsieve:run:r-1:failed"
    assert rk.run_errors("r-1") == "rsieve:run:r-1:errors"
    assert rk.run_stopped("r-1") == "rsieve:run:r-1:stopped"
    assert rk.deliveries("verify", "r-1", "00002") == "rsieve:verify:r-1:00002:deliveries"
    assert rk.inflight("verify", "r-1", "00002") == "rsieve:verify:r-1:00002:inflight"
    assert rk.stage_pattern("verify", "r-1") == "rsieve:verify:r-1:*"
    assert rk.deliveries_pattern("generate", "r-1") == "rsieve:generate:r-1:*:deliveries"
    assert rk.ingest_done("r-1", "clean") == "rsieve:ingest:r-1:clean"
    assert rk.ingest_sent("r-1", "screen") == "rsieve:ingest:r-1:sent:screen"
    assert rk.judged("r-1") == "rsieve:judged:r-1"
    assert rk.compact_done("r-1", "g0") == "rsieve:compact:r-1:g0"
    assert rk.compact_sent("r-1", "routes") == "rsieve:compact:r-1:sent:routes"
    assert rk.compact_lock("mydata") == "rsieve:compact:mydata"
    assert rk.pace("generate") == "rsieve:pace:generate"
    assert rk.engine_feeders("triton:8001", "vlm") == "rsieve:engine-feeders:triton:8001/vlm"
    assert rk.watch_size("inbox/a/") == "rsieve:watch:size:inbox/a/"
    assert rk.watch_claim("inbox/a/") == "rsieve:watch:claim:inbox/a/"
    assert rk.watch_taken("inbox/a/") == "rsieve:watch:taken:inbox/a/"
    assert rk.WATCH_LOOKS == "rsieve:watch:looks"
    assert rk.WATCH_TAKES == "rsieve:watch:takes"
    assert rk.SWEEP_DONE == "rsieve:sweep:done"


def key_literals(source: str) -> list[tuple[int, str]]:
    """The string literals of a Python source that begin with one of rsieve's keys."""
    return [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.STRING and _KEY.match(tok.string)
    ]


def test_the_scan_finds_a_key_written_out() -> None:
    source = 'r.get("rsieve:pace:judge")\nr.set(f"rsieve:{task}:{run}", 1)\nx = "rsieve: a word"\n'
    assert [line for line, _ in key_literals(source)] == [1, 2]


def test_no_redis_key_is_written_out_anywhere_else() -> None:
    found = []
    for folder in ("shared", "services", "scripts", "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in (OWNER, Path(__file__).resolve()) or ".venv" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            for line, literal in key_literals(path.read_text()):
                if (rel, literal) not in NOT_KEYS:
                    found.append(f"{rel}:{line}: {literal}")
    assert found == []
