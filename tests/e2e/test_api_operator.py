"""The operator's API over the real stack (replay model, bearer token): submit by upload,
by a path under a pool root and by S3 URI (one run), metrics moving during the run,
status with progress, report, quarantine paging, calibration, datasets, archive safety,
the body limit, and schemathesis over the OpenAPI document (no 5xx)."""

from __future__ import annotations

import io
import json
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.scenario import Scenario, build

TOKEN = "0b8e2d4f6a1c3e5079b2d4f6a8c0e2f4a6b8c0d2"  # 40 hex: a token the API accepts
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return build(tmp_path_factory.mktemp("roots") / "replay-pool")


MAX_EXTRACTED = 8 * 1024**2  # the stack's api_max_extracted_bytes (uploads: 4 MiB)


@pytest.fixture(scope="module")
def api_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The services' temporary folder (TMPDIR), measured by the bomb test."""
    return tmp_path_factory.mktemp("service-tmp")


@pytest.fixture(scope="module")
def stack(
    start_stack: Any, scenario: Scenario, api_tmp: Path, tmp_path_factory: pytest.TempPathFactory
) -> Stack:
    replay = tmp_path_factory.mktemp("replay") / "replay.json"
    replay.write_text(json.dumps(scenario.replay))
    return start_stack(
        ["replay"],
        triton_env={"RSIEVE_REPLAY_FILE": str(replay)},
        settings_env={
            "RSIEVE_GENERATOR_MODEL": "replay",
            "RSIEVE_JUDGE_MODEL": "replay",
            "RSIEVE_SHARD_SIZE": "2",
            "RSIEVE_MODEL_RETRIES": "1",
            "RSIEVE_API_TOKEN": TOKEN,
            "RSIEVE_API_MAX_REQUEST_BYTES": str(4 * 1024**2),
            "RSIEVE_API_MAX_EXTRACTED_BYTES": str(MAX_EXTRACTED),
            "TMPDIR": str(api_tmp),
            "RSIEVE_API_POOL_ROOTS": json.dumps([str(scenario.folder.parent)]),
        },
    )


def _api(stack: Stack) -> str:
    return stack_settings(stack).api_url


def _tar(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(folder, arcname=folder.name)
    return buf.getvalue()


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def finished(stack: Stack, scenario: Scenario) -> dict[str, Any]:
    """Submit by upload, scrape /metrics while it runs and after; the run id and scrapes."""
    api = _api(stack)
    before = httpx.get(f"{api}/metrics", headers=AUTH, timeout=30).text
    resp = httpx.post(
        f"{api}/runs/upload",
        headers=AUTH,
        timeout=120,
        files={"pool": ("pool.tar.gz", _tar(scenario.folder))},
        data={"dataset": "operator"},
    )
    assert resp.status_code == 202, resp.text
    run = resp.json()["run"]
    during, statuses = [], []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = httpx.get(f"{api}/runs/{run}", headers=AUTH, timeout=30).json()
        statuses.append(status)
        during.append(httpx.get(f"{api}/metrics", headers=AUTH, timeout=30).text)
        if status["done"]:
            break
        time.sleep(0.3)
    assert statuses[-1]["done"], statuses[-1]
    after = httpx.get(f"{api}/metrics", headers=AUTH, timeout=30).text
    return {"run": run, "before": before, "during": during, "after": after, "statuses": statuses}


def test_health_is_open_and_everything_else_needs_the_token(stack: Stack) -> None:
    api = _api(stack)
    assert httpx.get(f"{api}/healthz").status_code == 200
    ready = httpx.get(f"{api}/readyz", headers=AUTH, timeout=30)
    assert ready.status_code == 200 and ready.json()["checks"] == {"redis": True, "s3": True}
    paths = ("/readyz", "/docs", "/openapi.json", "/runs", "/metrics", "/datasets")
    for path in (*paths, "/runs/x-000000000000"):
        assert httpx.get(f"{api}{path}").status_code == 401, path
        assert (
            httpx.get(f"{api}{path}", headers={"Authorization": "Bearer nope"}).status_code == 401
        )
    page = httpx.get(f"{api}/review")
    assert page.status_code == 200  # the page's HTML only: every request it makes needs the token
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "'unsafe-inline'" not in page.headers["content-security-policy"]


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    """The process's resident memory now (VmRSS), or its peak so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_an_unauthenticated_body_is_refused_before_it_is_read(stack: Stack) -> None:
    """200 MB announced, streamed in 1 MB chunks, no token: 401 comes back while the body
    is still being sent, and the API's memory does not grow by the body."""
    import socket
    from urllib.parse import urlparse

    pid = stack.pid("api")
    assert pid is not None
    url = urlparse(_api(stack))
    before = _rss_kib(pid, "VmHWM")
    size, chunk, sent = 200 * 1024**2, b"\0" * 1024**2, 0
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            b"POST /runs/upload HTTP/1.1\r\nHost: api\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\n"
            b"Content-Length: %d\r\n\r\n" % size
        )
        try:
            while sent < size:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server answered and stopped reading: the rest never went in
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert _rss_kib(pid, "VmHWM") - before < 64 * 1024, "the API took the body into memory"


def test_metrics_move_during_and_after_the_run(finished: dict[str, Any]) -> None:
    items = "rsieve_items_total"
    first = _metric(finished["before"], items)
    scrapes = [_metric(t, items) for t in finished["during"]] + [_metric(finished["after"], items)]
    assert scrapes[-1] > first, "the item counters never moved"
    assert scrapes == sorted(scrapes), "a counter went backwards"
    after = finished["after"]
    assert (
        _metric(after, items, stage="judge", family="SynthWords", outcome="accepted_by_judge") >= 1
    )
    assert _metric(after, "rsieve_quarantined_total", reason="invalid_json") >= 1
    assert _metric(after, "rsieve_rejected_total", reason="wrong_answer") >= 1
    assert _metric(after, "rsieve_stage_seconds_count", task="rsieve.generate") >= 1
    assert 'rsieve_queue_depth{queue="generate"}' in after
    assert "rsieve_triton_inflight_requests" in after and "rsieve_unacked_messages" in after


def test_status_has_progress_per_stage_and_family(
    finished: dict[str, Any], scenario: Scenario
) -> None:
    final = finished["statuses"][-1]
    lines = len(scenario.lines)
    shards = (lines + 1) // 2
    assert final["shards"] == shards and final["lines"] == lines
    judge = final["progress"]["judge"]
    assert judge["shards_done"] == judge["shards_total"] == shards and judge["eta_s"] == 0
    assert judge["rate_items_s"] > 0 and set(judge["families"]) >= {"SynthWords", "SynthAmounts"}
    clean = final["progress"]["clean"]
    assert clean["items"] == sum(clean["families"].values()) == lines


def test_same_pool_by_path_and_by_uri_is_the_same_run(
    stack: Stack, scenario: Scenario, finished: dict[str, Any]
) -> None:
    api = _api(stack)
    by_path = httpx.post(
        f"{api}/runs",
        headers=AUTH,
        timeout=60,
        json={"pool_path": str(scenario.folder), "dataset": "operator"},
    )
    assert by_path.status_code == 202, by_path.text
    uri = upload_pool(S3Store(stack_settings(stack)), scenario.folder)
    by_uri = httpx.post(f"{api}/runs", headers=AUTH, json={"pool_uri": uri, "dataset": "operator"})
    assert by_path.json()["run"] == by_uri.json()["run"] == finished["run"]
    outside = httpx.post(
        f"{api}/runs", headers=AUTH, json={"pool_path": "/etc", "dataset": "operator"}
    )
    assert outside.status_code == 403
    listed = httpx.get(f"{api}/runs", headers=AUTH).json()
    assert finished["run"] in [r["run"] for r in listed["data"]]


def test_report_quarantine_calibration_and_datasets(stack: Stack, finished: dict[str, Any]) -> None:
    api, run = _api(stack), finished["run"]
    report = httpx.get(f"{api}/runs/{run}/report", headers=AUTH).json()
    assert report["adds_up"] is True
    page1 = httpx.get(f"{api}/runs/{run}/quarantine", headers=AUTH, params={"limit": 3}).json()
    page2 = httpx.get(
        f"{api}/runs/{run}/quarantine", headers=AUTH, params={"limit": 3, "offset": 3}
    ).json()
    assert page1["count"] == page2["count"] == sum(page1["reasons"].values()) == 8
    assert len(page1["data"]) == 3 and page1["data"][0]["line"] < page2["data"][0]["line"]
    only = httpx.get(
        f"{api}/runs/{run}/quarantine", headers=AUTH, params={"reason": "provenance"}
    ).json()
    assert only["count"] == 2 and {q["reason"] for q in only["data"]} == {"provenance"}
    calibration = httpx.get(f"{api}/runs/{run}/calibration", headers=AUTH)
    assert calibration.status_code in (200, 404)
    if calibration.status_code == 200:
        assert "families" in calibration.json()
    datasets = httpx.get(f"{api}/datasets", headers=AUTH).json()
    assert [d["run"] for d in datasets["data"] if d["dataset"] == "operator"] == [run]
    assert httpx.get(f"{api}/datasets/nope", headers=AUTH).status_code == 404
    assert httpx.get(f"{api}/runs/nope-000000000000/quarantine", headers=AUTH).status_code == 404


def _bad_tar(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = b'{"id": "a"}\n'
        info = tarfile.TarInfo("items.jsonl")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        if kind == "escape":
            evil = tarfile.TarInfo("../../escaped.txt")
            evil.size = 1
            tf.addfile(evil, io.BytesIO(b"x"))
        else:
            link = tarfile.TarInfo("img.png")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tf.addfile(link)
    return buf.getvalue()


def test_unsafe_archives_and_oversized_bodies_are_refused(stack: Stack, tmp_path: Path) -> None:
    api = _api(stack)
    for kind in ("escape", "link"):
        resp = httpx.post(
            f"{api}/runs/upload",
            headers=AUTH,
            data={"dataset": "evil"},
            files={"pool": ("p.tar", _bad_tar(kind))},
        )
        assert resp.status_code == 422, resp.text
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as zf:
        zf.writestr("/abs/items.jsonl", "{}")
    resp = httpx.post(
        f"{api}/runs/upload",
        headers=AUTH,
        data={"dataset": "evil"},
        files={"pool": ("p.zip", zbuf.getvalue())},
    )
    assert resp.status_code == 422 and "leaves the pool folder" in resp.text
    big = httpx.post(
        f"{api}/runs/upload",
        headers=AUTH,
        data={"dataset": "big"},
        files={"pool": ("p.tar", b"\0" * (5 * 1024**2))},
    )
    assert big.status_code == 413
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_openapi_has_no_server_errors(stack: Stack, finished: dict[str, Any]) -> None:
    """schemathesis drives every operation of the live OpenAPI document with generated
    requests (token attached) and finds no 5xx."""
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{_api(stack)}/openapi.json", headers=AUTH)
    failures: list[str] = []
    assert _fuzz(schema, failures) >= 15
    assert failures == []


def _fuzz(schema: Any, failures: list[str]) -> int:
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error

    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=8,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(headers=AUTH, checks=[not_a_server_error], timeout=30)

        try:
            check()
        except Exception as exc:  # noqa: BLE001 - collected, reported together
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:500]}")
    return operations


def test_grafana_dashboard_queries_metrics_the_api_exposes(finished: dict[str, Any]) -> None:
    import re

    from rsieve_cli.local.stack import REPO_ROOT

    dashboard = json.loads((REPO_ROOT / "deploy" / "grafana" / "rsieve.json").read_text())
    names = {
        re.sub(r"_(total|bucket|sum|count)$", "", m)
        for p in dashboard["panels"]
        for t in p["targets"]
        for m in re.findall(r"rsieve_[a-z_]+", t["expr"])
    }
    exposed = {
        re.sub(r"_total$", "", line.split()[2])
        for line in finished["after"].splitlines()
        if line.startswith("# HELP rsieve_")
    }
    assert names and names <= exposed, names - exposed


def _disk_bytes(folder: Path) -> int:
    """Bytes on disk under `folder`; what is removed while it looks is not counted."""
    import os

    total = 0
    for root, _dirs, files in os.walk(folder):  # os.walk skips folders that vanish
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def test_archive_bombs_are_refused_without_taking_memory_or_disk(
    stack: Stack, api_tmp: Path
) -> None:
    """A 200 MB pax header in a few KB of .tar.xz, and a zip that inflates 100 MB from
    about 100 KB: both 422; the API's memory grows by less than 64 MB; its temporary
    folder, sampled while the uploads run, never holds more than one upload may (its body
    and its extraction limit), and nothing is left behind."""
    import lzma
    import threading

    pid = stack.pid("api")
    assert pid is not None
    bomb = tarfile.TarInfo("items.jsonl")
    bomb.pax_headers = {"comment": "x" * (200 * 1024**2)}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(bomb, io.BytesIO(b""))
    tar_xz = lzma.compress(raw.getvalue())
    del raw
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("items.jsonl", b'{"id": "a"}\n')
        for k in range(5):  # each under image_max_bytes: only the ratio can stop them
            zf.writestr(f"zeros{k}.png", b"\0" * (20 * 1024**2))
    assert len(tar_xz) < 200_000 and len(zbuf.getvalue()) < 400_000
    before = _rss_kib(pid, "VmHWM")  # the peak: memory taken and given back counts too
    baseline, peak, stop = _disk_bytes(api_tmp), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _disk_bytes(api_tmp))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for name, data, why in (
        ("p.tar.xz", tar_xz, "extended header"),
        ("p.zip", zbuf.getvalue(), "EXPANSION_RATIO"),
    ):
        resp = httpx.post(
            f"{_api(stack)}/runs/upload",
            headers=AUTH,
            data={"dataset": "bomb"},
            files={"pool": (name, data)},
            timeout=60,
        )
        assert resp.status_code == 422 and why in resp.text, resp.text
    stop.set()
    sampler.join()
    assert _rss_kib(pid, "VmHWM") - before < 64 * 1024, "an archive bomb took the API's memory"
    grown = peak[0] - baseline
    assert grown <= 4 * 1024**2 + MAX_EXTRACTED, f"temporary space grew by {grown} bytes"
    assert grown > 0, "the sampler never saw an upload in the temporary folder"
    assert not list(api_tmp.glob("rsieve-upload-*")), "extraction left behind"
    assert _disk_bytes(api_tmp) <= baseline, "an upload left temporary files behind"
    print(f"API temporary space at the peak: +{grown / 1024**2:.1f} MiB")
