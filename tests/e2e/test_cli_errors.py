"""CLI failures without a stack: one line on stderr that says what to do, exit 1, never
a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsieve_cli.local.ports import free_port
from rsieve_cli.local.stack import REPO_ROOT


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    port = free_port()
    env = {
        **os.environ,
        "RSIEVE_STACK_DIR": str(tmp_path / "no-stack"),
        "COLUMNS": "200",
        "RSIEVE_API_URL": f"http://127.0.0.1:{port}",
        "RSIEVE_S3_ENDPOINT": f"http://127.0.0.1:{port}",
        "RSIEVE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
    }
    return subprocess.run(
        [sys.executable, "-m", "rsieve_cli.app", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


def _one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args", [["status"], ["status", "x-000000000000", "--json"]])
def test_status_without_a_stack_says_start_it(tmp_path: Path, args: list[str]) -> None:
    _one_line_error(_cli(tmp_path, *args), "cannot reach the API", "rsieve stack up")


def test_submit_of_a_folder_that_is_not_a_pool(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _one_line_error(_cli(tmp_path, "submit", str(tmp_path / "empty")), "no items.jsonl", "fix:")
    _one_line_error(_cli(tmp_path, "submit", str(tmp_path / "missing")), "not a folder")


@pytest.mark.parametrize(
    "args",
    [
        ["export", "x-000000000000", "--to", "out"],
        ["card", "x-000000000000"],
        ["recheck", "x-000000000000"],
    ],
)
def test_storage_commands_without_a_stack(tmp_path: Path, args: list[str]) -> None:
    _one_line_error(_cli(tmp_path, *args), "rsieve stack up")
