"""The committed example pool is well formed and reproducible by its generator."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POOL = REPO / "examples" / "pool"
SCRIPT = REPO / "scripts" / "make_example_pool.py"
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
# Every font the generator names (fonts-dejavu-core has the plain faces, -extra the rest).
FONTS = sorted(set(re.findall(r'"(DejaVu[\w-]+\.ttf)"', SCRIPT.read_text(encoding="utf-8"))))
GENERATOR = "scripts/make_example_pool.py"
FAMILIES = {"SynthWords", "SynthAmounts", "SynthChoice"}


def _records() -> list[dict[str, object]]:
    lines = (POOL / "items.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines, "items.jsonl is empty"
    return [json.loads(line) for line in lines]


def test_lines_have_contract_fields() -> None:
    for rec in _records():
        assert set(rec) - {"protocol", "options"} == {
            "id",
            "family",
            "image",
            "question",
            "answer",
            "source",
        }, rec
        for key in ("id", "family", "image", "question", "answer"):
            assert isinstance(rec[key], str) and rec[key], (key, rec)
        assert rec["family"] in FAMILIES
        image = rec["image"]
        assert isinstance(image, str)
        assert "/" not in image and (POOL / image).is_file(), image
        source = rec["source"]
        assert isinstance(source, dict)
        assert source["generator"] == GENERATOR
        if rec["family"] == "SynthChoice":
            assert rec["protocol"] == "mc"
            assert rec["answer"] in {"A", "B", "C", "D"}
        else:
            assert "protocol" not in rec


def test_ids_unique() -> None:
    ids = [rec["id"] for rec in _records()]
    assert len(ids) == len(set(ids))


def test_sha256_matches_image_bytes() -> None:
    for rec in _records():
        source = rec["source"]
        assert isinstance(source, dict)
        digest = hashlib.sha256((POOL / str(rec["image"])).read_bytes()).hexdigest()
        assert source["sha256"] == digest, rec["id"]


def test_one_image_carries_two_questions() -> None:
    by_image: dict[tuple[object, object], list[dict[str, object]]] = {}
    for rec in _records():
        by_image.setdefault((rec["family"], rec["image"]), []).append(rec)
    shared = [recs for recs in by_image.values() if len(recs) > 1]
    assert len(shared) == 1
    assert len({rec["question"] for rec in shared[0]}) == 2


def test_every_file_is_referenced() -> None:
    names = {str(rec["image"]) for rec in _records()} | {"items.jsonl"}
    assert {p.name for p in POOL.iterdir()} == names


def test_regenerates_byte_identical(tmp_path: Path) -> None:
    # The generator draws with the DejaVu fonts; `make test` installs them (Debian's
    # fonts-dejavu-core and fonts-dejavu-extra) when they are missing.
    missing = [f for f in FONTS if not (FONT_DIR / f).is_file()]
    assert not missing, f"DejaVu fonts missing from {FONT_DIR}: {missing}; run `make test`"
    out = tmp_path / "pool"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    committed = sorted(p.name for p in POOL.iterdir())
    regenerated = sorted(p.name for p in out.iterdir())
    assert regenerated == committed
    differ = [name for name in committed if (out / name).read_bytes() != (POOL / name).read_bytes()]
    assert not differ, (
        f"regenerated files differ from examples/pool: {differ}; rerun {GENERATOR} "
        "(different Pillow/FreeType/zlib or DejaVu fonts also change the bytes)"
    )
