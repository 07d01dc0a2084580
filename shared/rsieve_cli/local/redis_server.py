"""Redis, the queues' broker: `redis-server` on 127.0.0.1 with its append-only file in the
stack's state folder, bounded in memory (full means writes fail loudly)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from rsieve_cli.local.ports import HOST
from rsieve_cli.local.processes import popen
from rsieve_cli.local.ready import wait_ready


def _redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if Path("/usr/bin/redis-server").exists():
        return "/usr/bin/redis-server"
    raise FileNotFoundError("redis-server not found on PATH or in /usr/bin")


def start_redis(
    *, state_dir: Path, port: int, log: Path, appendonly: bool = True
) -> subprocess.Popen[bytes]:
    """Start ``redis-server`` on 127.0.0.1:``port`` keeping its AOF in ``state_dir``.

    With ``appendonly`` (the default) writes are fsynced every second, so queued messages
    survive a restart; RDB snapshots are off either way.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        _redis_binary(),
        "--bind", HOST,
        "--port", str(port),
        "--dir", str(state_dir),
        "--appendonly", "yes" if appendonly else "no",
        "--appendfsync", "everysec",
        "--save", "",
        # Bounded; full means writes fail loudly, never queued messages dropped silently.
        "--maxmemory", "1gb",
        "--maxmemory-policy", "noeviction",
        "--daemonize", "no",
        "--protected-mode", "yes",
    ]  # fmt: skip
    return popen(cmd, log=log, cwd=state_dir)


def wait_redis(
    port: int, timeout: float = 30.0, *, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Return when Redis on 127.0.0.1:``port`` answers PING (not while it loads its AOF)."""

    def pong() -> str | None:
        with socket.create_connection((HOST, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
        return None if reply.startswith(b"+PONG") else reply.decode(errors="replace").strip()

    wait_ready(
        pong,
        timeout_s=timeout,
        what=f"redis on {HOST}:{port}",
        errors=(OSError,),
        proc=proc,
        proc_name="redis-server",
    )
