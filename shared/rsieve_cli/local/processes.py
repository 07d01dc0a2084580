"""How the local services are started and stopped: each a process of its own.

Used by the local stack and by the integration-test fixtures. Every launcher is a plain
:class:`subprocess.Popen` in its own session (``start_new_session=True``) so that
:func:`stop` can signal the whole process group; stdout and stderr go to a log file the
caller names. Everything listens on 127.0.0.1 only, and every port is chosen explicitly so
that two stacks (a run and the tests) can live side by side on one machine.

Every fact the launchers rely on was found by running the real binaries on Debian 12 and
is stated where it is used (rsieve_cli.local.redis_server, seaweedfs, triton_server,
llama_judge; the ports in rsieve_cli.local.ports).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def popen(
    cmd: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session with stdout+stderr appended to ``log``."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} exec: {' '.join(cmd)}\n".encode())
        fh.flush()
        # The child keeps its own copy of the descriptor; ours is closed on leaving.
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd is not None else None,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> int | None:
    """Stop ``proc`` and its process group: SIGTERM, wait ``timeout`` s, then SIGKILL.

    Returns the exit code (``None`` if ``proc`` is ``None``). Safe to call twice.
    """
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # Kill whatever is left of the group (children such as Triton's Python stubs too).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # pragma: no cover - a zombie that will not die
        return None


def log_tail(log: Path | None, chars: int = 4000) -> str:
    """The end of a launcher's log: why a service did not come up is usually in its last lines."""
    if log is None or not Path(log).exists():
        return ""
    return Path(log).read_text(errors="replace")[-chars:]


def check_alive(proc: subprocess.Popen[bytes] | None, what: str, log: Path | None) -> None:
    if proc is not None and proc.poll() is not None:
        tail = log_tail(log)
        raise RuntimeError(f"{what} exited with code {proc.returncode}; log tail:\n{tail}")
