"""docker-compose.yml's cpu profile run for real on this machine's images (`make images`),
with the generator killed mid-run: `make compose-test`, which first makes `make run`'s
export to compare with. Skipped in `make test` (minutes of image builds and a whole stack
in containers); docs/deploy.md says when to run it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scripts import compose_run

pytestmark = pytest.mark.skipif(
    os.environ.get("RSIEVE_COMPOSE_TEST") != "1",
    reason="needs Docker and `make images`: run `make compose-test`",
)

MAKE_RUN_OUT = compose_run.REPO / "out"
FIGURES = compose_run.REPO / "out-compose" / "compose-test.json"


def test_compose_run_survives_a_killed_generator_and_equals_make_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (MAKE_RUN_OUT / compose_run.DATASET / "run_report.json").is_file(), "make run first"
    code = compose_run.main(
        ["--fault", "--expect", str(MAKE_RUN_OUT), "--out", str(tmp_path / "out")]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # The figures, for whoever runs `make compose-test` (it prints them).
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=1))
    assert figures["failures"] == [] and code == 0, figures
    # The kill happened mid-run and compose brought the container back.
    assert figures["generator_restarts"] >= 1 and "killed_at_s" in figures, figures
    # The shard the generator died with was delivered again.
    assert figures["generate_deliveries"] >= 2, figures
    # Every item in exactly one place, and the same splits and counts as `make run`.
    assert figures["audit_ok"] is True
    assert figures["compose"]["splits"] == figures["make_run"]["splits"]
    assert figures["compose"]["families"] == figures["make_run"]["families"]
    assert sum(figures["compose"]["splits"].values()) > 0
