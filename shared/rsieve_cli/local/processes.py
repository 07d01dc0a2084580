"""Imperative launchers for the real local services: Redis, SeaweedFS (S3) and Triton.

Used by the local stack and by the integration-test fixtures. Every launcher is a plain
:class:`subprocess.Popen` in its own session (``start_new_session=True``) so that
:func:`stop` can signal the whole process group; stdout and stderr go to a log file the
caller names. Everything listens on 127.0.0.1 only, and every port is chosen explicitly so
that two stacks (a run and the tests) can live side by side on one machine.

Every fact these launchers rely on was found by running the real binaries on Debian 12 and
is stated where it is used; the least obvious ones:

* ``weed mini`` opens master, volume, filer, S3 (each HTTP + gRPC), a metrics port and an
  admin server (HTTP + gRPC) even with ``-admin.ui=false``. Its built-in plugin worker
  dials the admin gRPC port at *admin HTTP port + 10000* whatever ``-admin.port.grpc``
  says, so the admin gRPC port is always chosen as admin port + 10000. WebDAV, the
  Iceberg catalog and the Lance namespace server are switched off; ``-logtostderr`` keeps
  glog from also writing ``weed.*`` log files into ``$TMPDIR``. Weed still leaves a few
  ``/tmp/seaweedfs-*-<port>.sock`` files behind (paths it hard-codes); they do not stop a
  restart on the same ports.
* The Triton Python-backend stub embeds the *system* ``libpython3.11`` (Debian's 3.11.2),
  not the venv's interpreter, and runs it isolated: ``PYTHONPATH`` is ignored. The venv's
  site-packages travel in ``RSIEVE_TRITON_SITE_PACKAGES`` and each rsieve ``model.py``
  puts them first on ``sys.path`` before its third-party imports.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HOST = "127.0.0.1"

__all__ = [
    "HOST",
    "PORT_RANGE_ENV",
    "SITE_PACKAGES_ENV",
    "free_port",
    "port_range",
    "s3_ports",
    "start_redis",
    "start_s3",
    "start_triton",
    "stop",
    "triton_env",
    "triton_paths",
    "wait_redis",
    "wait_s3",
    "wait_triton",
]


# --------------------------------------------------------------------------- ports


def _port_is_free(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:``port`` right now."""
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (Go and Redis set SO_REUSEADDR): a port whose last connections
        # linger in TIME_WAIT after a restart still counts as free; one listened on does not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()

# "LOW-HIGH": the ports a local stack takes, where the kernel's ephemeral choice will not
# do (a firewall's range; the test suite's workers, each in a range of its own below the
# ephemeral range, so that a port picked for one stack cannot be picked meanwhile by
# another stack's start or by any outgoing connection).
PORT_RANGE_ENV = "RSIEVE_LOCAL_PORTS"


def port_range() -> range | None:
    """The range named by RSIEVE_LOCAL_PORTS, or None when it is not set."""
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not spec:
        return None
    low, _, high = spec.partition("-")
    try:
        ports = range(int(low), int(high) + 1)
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected LOW-HIGH, as 20000-20999") from None
    if not 0 < ports.start < ports.stop <= 65536:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected 1 <= LOW <= HIGH <= 65535")
    return ports


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now: one of RSIEVE_LOCAL_PORTS when it is set,
    else the kernel's choice of an ephemeral port.

    Never the same port twice in one process, so ``free_port(), free_port()`` are distinct
    even before anything listens on the first.
    """
    ports = port_range()
    if ports is not None:
        first = random.randrange(len(ports))
        for i in range(len(ports)):
            port = ports[(first + i) % len(ports)]
            if port not in _HANDED_OUT and _port_is_free(port):
                _HANDED_OUT.add(port)
                return port
        raise RuntimeError(f"no free port left in {PORT_RANGE_ENV}={ports.start}-{ports.stop - 1}")
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no fresh free port on {HOST}")


def _free_ports(count: int, *, exclude: Sequence[int] = ()) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``."""
    ports: list[int] = []
    taken = set(exclude)
    while len(ports) < count:
        port = free_port()
        if port not in taken:
            taken.add(port)
            ports.append(port)
    return ports


def _free_port_with_offset(offset: int, *, exclude: Sequence[int] = ()) -> int:
    """A port ``p`` such that both ``p`` and ``p + offset`` are free (and not excluded)."""
    rng = random.Random()
    taken = set(exclude)
    ports = port_range() or range(20000, 65535 - offset)
    for _ in range(1000):
        port = rng.choice(ports)
        if port in taken or port + offset in taken:
            continue
        if port in _HANDED_OUT or port + offset in _HANDED_OUT:
            continue
        if _port_is_free(port) and _port_is_free(port + offset):
            _HANDED_OUT.update((port, port + offset))
            return port
    raise RuntimeError(f"no free port pair (p, p+{offset}) found on {HOST}")


# --------------------------------------------------------------------------- processes


def _popen(
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


def _check_alive(proc: subprocess.Popen[bytes] | None, what: str, log: Path | None) -> None:
    if proc is not None and proc.poll() is not None:
        tail = ""
        if log is not None and Path(log).exists():
            tail = Path(log).read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{what} exited with code {proc.returncode}; log tail:\n{tail}")


# --------------------------------------------------------------------------- redis


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
    return _popen(cmd, log=log, cwd=state_dir)


def wait_redis(
    port: int, timeout: float = 30.0, *, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Return when Redis on 127.0.0.1:``port`` answers PING (not while it loads its AOF)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        _check_alive(proc, "redis-server", None)
        try:
            with socket.create_connection((HOST, port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
            if reply.startswith(b"+PONG"):
                return
            last = reply.decode(errors="replace").strip()
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise TimeoutError(f"redis on {HOST}:{port} not ready after {timeout}s: {last}")


# --------------------------------------------------------------------------- s3 (weed mini)

_WEED_PORTS_FILE = ".rsieve-weed-ports.json"
_WEED_PORT_NAMES = (
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3_grpc",
    "metrics",
)
_WEED_GRPC_OFFSET = 10000


def _weed_binary() -> Path:
    weed = Path(sys.executable).parent / "weed"
    if weed.exists():
        return weed
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise FileNotFoundError(f"weed not found next to {sys.executable} nor on PATH")


def _weed_ports(state_dir: Path, s3_port: int) -> dict[str, int]:
    """The ports ``weed mini`` opens besides S3, kept per ``state_dir``.

    Restarting on the same ``state_dir`` reuses the same ports when they are still free,
    so the master's persisted state keeps pointing at the same addresses.
    """
    path = state_dir / _WEED_PORTS_FILE
    names = (*_WEED_PORT_NAMES, "admin")
    if path.exists():
        try:
            saved = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except (ValueError, TypeError, AttributeError):
            saved = {}
        wanted = [saved.get(n, 0) for n in names]
        if saved.get("admin"):
            wanted.append(saved["admin"] + _WEED_GRPC_OFFSET)
        if (
            all(n in saved for n in names)
            and s3_port not in wanted
            and len(set(wanted)) == len(wanted)
            and all(_port_is_free(p) for p in wanted)
        ):
            return {n: saved[n] for n in names}
    ports = dict(
        zip(_WEED_PORT_NAMES, _free_ports(len(_WEED_PORT_NAMES), exclude=[s3_port]), strict=True)
    )
    ports["admin"] = _free_port_with_offset(_WEED_GRPC_OFFSET, exclude=[s3_port, *ports.values()])
    path.write_text(json.dumps(ports, indent=1, sort_keys=True))
    return ports


def s3_ports(state_dir: Path) -> dict[str, int]:
    """The auxiliary ports the last :func:`start_s3` on ``state_dir`` chose (for debugging)."""
    return {
        k: int(v) for k, v in json.loads((Path(state_dir) / _WEED_PORTS_FILE).read_text()).items()
    }


def start_s3(
    *,
    state_dir: Path,
    port: int,
    bucket: str,
    access_key: str,
    secret_key: str,
    log: Path,
) -> subprocess.Popen[bytes]:
    """Start ``weed mini`` (SeaweedFS master+volume+filer+S3) with S3 on 127.0.0.1:``port``.

    Every other port it opens is chosen here and recorded in
    ``state_dir/.rsieve-weed-ports.json``; WebDAV, Iceberg, Lance, telemetry and the admin UI
    are off. ``bucket`` (3-63 characters, S3 rules) is created at startup. The S3 identity
    comes from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in weed's environment.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    p = _weed_ports(state_dir, port)
    cmd = [
        str(_weed_binary()),
        "-logtostderr",  # glog would otherwise also write weed.* files into $TMPDIR
        "mini",
        f"-dir={state_dir}",
        f"-bucket={bucket}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-admin.ui=false",
        f"-admin.port={p['admin']}",
        f"-admin.port.grpc={p['admin'] + _WEED_GRPC_OFFSET}",
        f"-master.port={p['master']}",
        f"-master.port.grpc={p['master_grpc']}",
        "-master.telemetry=false",
        f"-volume.port={p['volume']}",
        f"-volume.port.grpc={p['volume_grpc']}",
        f"-filer.port={p['filer']}",
        f"-filer.port.grpc={p['filer_grpc']}",
        f"-s3.port={port}",
        f"-s3.port.grpc={p['s3_grpc']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        f"-metricsPort={p['metrics']}",
    ]
    env = dict(os.environ)
    env["AWS_ACCESS_KEY_ID"] = access_key
    env["AWS_SECRET_ACCESS_KEY"] = secret_key
    env.pop("S3_BUCKET", None)
    env.pop("S3_TABLE_BUCKET", None)
    return _popen(cmd, log=log, env=env, cwd=state_dir)


def wait_s3(
    endpoint: str,
    access_key: str,
    secret_key: str,
    bucket: str,
    timeout: float = 60.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Return when boto3 can put and get an object in ``bucket`` at ``endpoint``.

    Creates the bucket if it is missing. Raises :class:`TimeoutError` otherwise.
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            connect_timeout=2,
            read_timeout=5,
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )
    key = f".rsieve-ready/{os.getpid()}-{time.monotonic_ns()}"
    deadline = time.monotonic() + timeout
    last = "no answer"
    try:
        while time.monotonic() < deadline:
            _check_alive(proc, "weed mini", None)
            try:
                try:
                    client.head_bucket(Bucket=bucket)
                except ClientError as exc:
                    code = str(exc.response.get("Error", {}).get("Code", ""))
                    if code in {"404", "NoSuchBucket", "NotFound"}:
                        client.create_bucket(Bucket=bucket)
                    else:
                        raise
                client.put_object(Bucket=bucket, Key=key, Body=b"ready")
                body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
                if body == b"ready":
                    client.delete_object(Bucket=bucket, Key=key)
                    return
                last = f"read back {body!r}"
            except (BotoCoreError, ClientError) as exc:
                last = repr(exc)
            time.sleep(0.2)
    finally:
        client.close()
    raise TimeoutError(f"S3 at {endpoint} (bucket {bucket}) not ready after {timeout}s: {last}")


# --------------------------------------------------------------------------- triton

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
    return _popen(cmd, log=log, env=triton_env(env_extra), cwd=Path(model_repository))


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
            _check_alive(proc, "tritonserver", log)
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


# --------------------------------------------------------------------------- llama.cpp judge


def start_llama_judge(
    *,
    model: Path,
    alias: str,
    port: int,
    api_key: str,
    log: Path,
    parallel: int = 4,
    kv_dir: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start llama.cpp's server (rsieve_cli.local.llama_judge) for the judge GGUF on
    127.0.0.1:``port``, requiring ``api_key`` (passed in the environment, not argv);
    ``kv_dir``: where the slots' warmed-up state is kept between starts."""
    cmd = [
        sys.executable, "-m", "rsieve_cli.local.llama_judge",
        "--model", str(model),
        "--alias", alias,
        "--host", HOST,
        "--port", str(port),
        "--parallel", str(parallel),
    ]  # fmt: skip
    if kv_dir is not None:
        cmd += ["--kv-dir", str(kv_dir)]
    from rsieve_cli.local.llama_judge import API_KEY_ENV

    return _popen(cmd, log=log, env={**os.environ, API_KEY_ENV: api_key})


def wait_llama_judge(
    port: int,
    api_key: str,
    alias: str,
    timeout: float = 60.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Return when the judge server lists ``alias`` at /v1/models (the model is loaded)."""
    import httpx

    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        _check_alive(proc, "the llama.cpp judge server", log)
        try:
            r = httpx.get(
                f"http://{HOST}:{port}/v1/models",
                headers={"Authorization": f"Bearer {api_key}"},
                timeout=2.0,
            )
            if r.status_code == 200 and alias in {m.get("id") for m in r.json().get("data", [])}:
                return
            last = f"HTTP {r.status_code}"
        except (httpx.HTTPError, ValueError) as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise TimeoutError(f"the judge server on {HOST}:{port} not ready after {timeout}s: {last}")
