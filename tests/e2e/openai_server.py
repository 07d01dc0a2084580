"""A real OpenAI-compatible server for the tests: `transformers serve` (transformers' own,
from its `serving` extra) on a free port, serving one checkpoint folder under a name of
its own, started, killed and started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from rsieve_cli.local.ports import free_port


class Server:
    """`transformers serve NAME` in `root`, where NAME links to the checkpoint folder: the
    server gives the model the id it was started with, so NAME is what requests ask for."""

    def __init__(self, root: Path, name: str, checkpoint: Path, port: int | None = None) -> None:
        self.root, self.name, self.port = root, name, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        (root / name).symlink_to(checkpoint.resolve(), target_is_directory=True)
        self.log = root / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    @contextmanager
    def serving(cls, root: Path, name: str, checkpoint: Path) -> Iterator[Server]:
        server = cls(root, name, checkpoint)
        server.start()
        try:
            yield server
        finally:
            server.stop()

    def stop(self) -> None:
        """Terminate; kill when it does not go (a server mid-request may not)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)

    def start(self) -> None:
        exe = Path(sys.executable).with_name("transformers")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    exe,
                    "serve",
                    self.name,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--device",
                    "cpu",
                    "--log-level",
                    "info",
                ],
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"transformers serve did not start: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def completions(self) -> int:
        """Chat completions the server has answered (its access log)."""
        return self.log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')
