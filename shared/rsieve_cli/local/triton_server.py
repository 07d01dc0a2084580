"""Triton: the `tritonserver` binary and backends from the nvidia-pytriton wheel, serving a
model repository on 127.0.0.1 (CPU only), with the Python-backend stub this Python needs.

The Python-backend stub embeds the *system* ``libpython3.11`` (Debian's 3.11.2), not the
venv's interpreter, and runs it isolated: ``PYTHONPATH`` is ignored. The venv's
site-packages travel in ``RSIEVE_TRITON_SITE_PACKAGES`` and each rsieve ``model.py`` puts
them first on ``sys.path`` before its third-party imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rsieve_cli.local.ports import HOST, free_ports
from rsieve_cli.local.processes import popen, stop
from rsieve_cli.local.ready import wait_ready

_STUB_PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def triton_paths() -> tuple[Path, Path, str]:
    """``(tritonserver binary, backend directory, LD_LIBRARY_PATH entry)`` from pytriton.

    Also installs the Python-backend stub for this Python version into
    ``backends/python/`` (idempotent; an atomic rename, so concurrent callers are safe).
    """
    import pytriton

    pkg = Path(pytriton.__file__).resolve().parent
    root = pkg / "tritonserver"
    binary = root / "bin" / "tritonserver"
    backends = root / "backends"
    libs = pkg.parent / "nvidia_pytriton.libs"
    if not binary.exists():
        raise FileNotFoundError(f"tritonserver binary missing: {binary}")
    if not libs.is_dir():
        raise FileNotFoundError(f"pytriton shared libraries missing: {libs}")

    src = root / "python_backend_stubs" / _STUB_PY / "triton_python_backend_stub"
    dst = backends / "python" / "triton_python_backend_stub"
    if not src.exists():
        raise FileNotFoundError(f"no Python-backend stub for Python {_STUB_PY}: {src}")
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        shutil.copy2(src, tmp)
        tmp.chmod(0o755)
        os.replace(tmp, dst)
    return binary, backends, str(libs)


def _venv_site_packages() -> list[str]:
    """This interpreter's site-packages (purelib then platlib, deduplicated)."""
    paths: list[str] = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths()[key]
        if path not in paths and Path(path).is_dir():
            paths.append(path)
    return paths


SITE_PACKAGES_ENV = "RSIEVE_TRITON_SITE_PACKAGES"


def triton_env(env_extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``tritonserver`` (and so its Python stubs) runs with.

    The stub embeds the system ``libpython3.11`` (Debian's 3.11.2, not the venv's
    interpreter) and starts it *isolated* (``sys.flags.isolated == 1``), so ``PYTHONPATH``
    is ignored there. Instead this venv's site-packages are named in
    ``RSIEVE_TRITON_SITE_PACKAGES`` and every rsieve ``model.py`` puts them first on
    ``sys.path`` (with ``site.addsitedir``) before importing numpy<2, Pillow or RapidOCR.
    """
    _, _, libs = triton_paths()
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libs, env.get("LD_LIBRARY_PATH", "")) if p)
    env[SITE_PACKAGES_ENV] = os.pathsep.join(_venv_site_packages())
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    # torch's OpenMP threads (judge-smollm2, the portable HF model) sleep instead of spinning
    # between parallel regions. On a small CPU shared by several stubs and the workers,
    # spinning threads starve the others: measured on 2 cores beside another busy stub, a
    # SmolLM2 verdict took 5-16 s spinning and 2.0-2.5 s passive.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if env_extra:
        env.update(env_extra)
    return env


def start_triton(
    *,
    model_repository: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log: Path,
    env_extra: dict[str, str] | None = None,
    models: Sequence[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``tritonserver`` on 127.0.0.1 serving ``model_repository`` (CPU only).

    ``models``: load only these (``--model-control-mode=explicit`` and one
    ``--load-model=NAME`` each), so a repository may hold models a stack does not want
    (e.g. ``judge-smollm2`` beside ``judge-abstain``); a name the repository lacks makes
    Triton exit. ``None``: every model in the repository. ``env_extra`` is added to the
    server's (and its Python stubs') environment, e.g. ``RSIEVE_REPLAY_FILE``. A port
    already taken makes Triton exit after loading its models, so pick them with
    :func:`free_port`.
    """
    binary, backends, _ = triton_paths()
    if models is not None and not models:
        raise ValueError("start_triton: models is empty (None loads every model)")
    cmd = [
        str(binary),
        f"--model-repository={Path(model_repository).resolve()}",
        f"--backend-directory={backends}",
        f"--http-address={HOST}",
        f"--http-port={http_port}",
        f"--grpc-address={HOST}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={HOST}",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--exit-timeout-secs=10",
        "--log-verbose=0",
    ]
    if models is not None:
        cmd.append("--model-control-mode=explicit")
        cmd.extend(f"--load-model={name}" for name in models)
    return popen(cmd, log=log, env=triton_env(env_extra), cwd=Path(model_repository))


def wait_triton(
    http_port: int,
    models: list[str],
    timeout: float = 120.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Return when Triton on 127.0.0.1:``http_port`` is ready and every model in ``models`` is.

    With ``proc`` given, fail fast (with the log tail when ``log`` is given) if it exits.
    """
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        url=f"{HOST}:{http_port}", connection_timeout=2.0, network_timeout=5.0
    )

    def serving() -> str | None:
        if not client.is_server_ready():
            return "server not ready"
        waiting = [m for m in models if not client.is_model_ready(m)]
        return f"models not ready: {waiting}" if waiting else None

    try:
        wait_ready(
            serving,
            timeout_s=timeout,
            what=f"triton on {HOST}:{http_port}",
            # connection refused, reset, timeouts
            errors=(Exception,),
            proc=proc,
            proc_name="tritonserver",
            log=log,
        )
    finally:
        client.close()


@dataclass(frozen=True)
class RunningTriton:
    """A Triton `triton_on_free_ports` started: its process, ports and log."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path
    ready_s: float  # from the start to every awaited model ready

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"


@contextmanager
def triton_on_free_ports(
    model_repository: Path,
    *,
    log: Path,
    ready: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    env_extra: dict[str, str] | None = None,
    timeout_s: float = 180.0,
    stop_timeout_s: float = 10.0,
) -> Iterator[RunningTriton]:
    """A Triton of its own, as the tests and benchmarks run one beside (or without) a
    stack: ``start_triton`` on three free ports, waited for until ``ready`` (by default
    ``models``) are ready, stopped when the block ends however it ends. ``models``: load
    only these (None: the whole repository). A server that exits or never comes up fails
    with its log's tail."""
    http_port, grpc_port, metrics_port = free_ports(3)
    started = time.monotonic()
    proc = start_triton(
        model_repository=model_repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log=log,
        env_extra=env_extra,
        models=models,
    )
    try:
        awaited = list(ready if ready is not None else models or [])
        wait_triton(http_port, awaited, timeout_s, proc=proc, log=log)
        ready_s = time.monotonic() - started
        yield RunningTriton(proc, http_port, grpc_port, metrics_port, Path(log), ready_s)
    finally:
        stop(proc, stop_timeout_s)
