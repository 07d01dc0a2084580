"""The sampling options of `rsieve run` and `rsieve submit`, declared once
(rsieve_cli.commands.sampling.takes_sampling): both commands take every one, and what was
given reaches the upload as the API's `sampling`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import rsieve_cli.client as client
import rsieve_cli.shell as shell
from rsieve_cli.app import app
from rsieve_cli.commands.sampling import OPTIONS

RUNNER = CliRunner()


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    def upload(settings: object, pool: Path, name: str, sampling: Any = None) -> str:
        sent.append({"pool": pool, "name": name, "sampling": sampling})
        return "run-1"

    monkeypatch.setattr(client, "upload", upload)
    monkeypatch.setattr(shell, "api", lambda method, path, **kw: {"ok": True})
    monkeypatch.setattr(shell, "settings", lambda: object())
    (tmp_path / "items.jsonl").write_text("")
    return sent


def test_both_commands_take_every_sampling_option() -> None:
    command = typer.main.get_command(app)
    for name in ("run", "submit"):
        params = {p.name for p in command.commands[name].params}  # type: ignore[attr-defined]
        assert set(OPTIONS) <= params, (name, set(OPTIONS) - params)
        assert "sampling" not in params


def test_what_was_given_is_the_runs_sampling(uploads: list[dict[str, Any]], tmp_path: Path) -> None:
    args = ["--samples", "4", "--temperature", "0.7", "--pass-rate-window", "0.2,0.8"]
    result = RUNNER.invoke(app, ["submit", str(tmp_path), "--dataset", "d", *args, "--circular"])
    assert result.exit_code == 0, result.output
    assert uploads[-1]["sampling"] == {
        "samples": 4,
        "temperature": 0.7,
        "pass_rate_window": [0.2, 0.8],
        "circular": True,
    }
    result = RUNNER.invoke(app, ["submit", str(tmp_path), "--dataset", "d", "--no-blind-pass"])
    assert result.exit_code == 0 and uploads[-1]["sampling"] == {"blind_pass": False}
    result = RUNNER.invoke(app, ["submit", str(tmp_path), "--dataset", "d"])
    assert result.exit_code == 0 and uploads[-1]["sampling"] is None


def test_a_window_that_is_no_range_is_one_line_with_the_fix(
    uploads: list[dict[str, Any]], tmp_path: Path
) -> None:
    result = RUNNER.invoke(app, ["submit", str(tmp_path), "--pass-rate-window", "low"])
    assert result.exit_code == 1
    assert "--pass-rate-window 'low'" in result.output and "give LOW,HIGH" in result.output
    assert not uploads
