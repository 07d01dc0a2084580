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
from collections.abc import Mapping, Sequence
from pathlib import Path

from rsieve_cli.local.ports import HOST
from rsieve_cli.local.processes import check_alive, popen

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
    deadline = time.monotonic() + timeout
    last = "no answer"
    try:
        while time.monotonic() < deadline:
            check_alive(proc, "tritonserver", log)
            try:
                if client.is_server_ready():
                    waiting = [m for m in models if not client.is_model_ready(m)]
                    if not waiting:
                        return
                    last = f"models not ready: {waiting}"
                else:
                    last = "server not ready"
            except Exception as exc:  # noqa: BLE001 - connection refused, reset, timeouts
                last = repr(exc)
            time.sleep(0.25)
    finally:
        client.close()
    raise TimeoutError(f"triton on {HOST}:{http_port} not ready after {timeout}s: {last}")
