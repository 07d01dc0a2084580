"""The judge server's own guard (rsieve_cli.local.llama_judge): listening beyond loopback
(a container's 0.0.0.0) without a bearer key is refused before anything loads."""

from __future__ import annotations

import pytest

from rsieve_cli.local import llama_judge


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "judge-server"])
def test_a_reachable_server_without_a_key_is_refused(
    host: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(llama_judge.API_KEY_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_:
        llama_judge.main(
            ["--model", "/nonexistent.gguf", "--alias", "j", "--port", "1", "--host", host]
        )
    assert exit_.value.code == 2
    assert llama_judge.API_KEY_ENV in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_key(host: str) -> None:
    assert llama_judge._loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.2", "judge-server"])
def test_other_addresses_are_not_loopback(host: str) -> None:
    assert not llama_judge._loopback(host)
