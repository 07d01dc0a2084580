"""SeaweedFS, the local S3 server: `weed mini` (master, volume, filer and S3 in one
process, from the seaweedfs wheel) with every port it opens chosen here.

``weed mini`` opens master, volume, filer, S3 (each HTTP + gRPC), a metrics port and an
admin server (HTTP + gRPC) even with ``-admin.ui=false``. Its built-in plugin worker dials
the admin gRPC port at *admin HTTP port + 10000* whatever ``-admin.port.grpc`` says, so
the admin gRPC port is always chosen as admin port + 10000. WebDAV, the Iceberg catalog
and the Lance namespace server are switched off; ``-logtostderr`` keeps glog from also
writing ``weed.*`` log files into ``$TMPDIR``. Weed still leaves a few
``/tmp/seaweedfs-*-<port>.sock`` files behind (paths it hard-codes); they do not stop a
restart on the same ports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rsieve_cli.local.ports import HOST, free_port_with_offset, free_ports, port_is_free
from rsieve_cli.local.processes import popen
from rsieve_cli.local.ready import wait_ready

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
            and all(port_is_free(p) for p in wanted)
        ):
            return {n: saved[n] for n in names}
    ports = dict(
        zip(_WEED_PORT_NAMES, free_ports(len(_WEED_PORT_NAMES), exclude=[s3_port]), strict=True)
    )
    ports["admin"] = free_port_with_offset(_WEED_GRPC_OFFSET, exclude=[s3_port, *ports.values()])
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
    return popen(cmd, log=log, env=env, cwd=state_dir)


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

    def round_trip() -> str | None:
        try:
            client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in {"404", "NoSuchBucket", "NotFound"}:
                raise
            client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key=key, Body=b"ready")
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        if body != b"ready":
            return f"read back {body!r}"
        client.delete_object(Bucket=bucket, Key=key)
        return None

    try:
        wait_ready(
            round_trip,
            timeout_s=timeout,
            what=f"S3 at {endpoint} (bucket {bucket})",
            errors=(BotoCoreError, ClientError),
            proc=proc,
            proc_name="weed mini",
        )
    finally:
        client.close()
