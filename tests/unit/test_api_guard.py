"""The API's guard (services/api/asgi.py, create_app): no start without a token that can
guard it, the token checked before any route and before any body is read, body limits,
security headers. The app runs in process on fakes (tests/fakes.py); tests/e2e has the
same against the real API."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import httpx
import pytest

from rsieve.settings import Settings, api_token_problem
from services.api.main import create_app
from services.worker import bootstrap
from tests.fakes import MemoryStore, Sent

TOKEN = "5d1e9b3f7a2c4e6081b3d5f7092a4c6e8b0d2f41"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class InProcess:
    """Requests to the ASGI app in process (httpx's ASGI transport)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(go())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


def app_with(**settings: Any) -> Any:
    settings.setdefault("api_max_json_bytes", 2048)
    ctx = bootstrap(
        Settings(**settings), store=MemoryStore(), redis_client=fakeredis.FakeRedis(), send=Sent()
    )
    return create_app(ctx, max_request_bytes=4096)


@pytest.mark.parametrize(
    "token", [None, "", "short-token", "changeme-changeme-changeme-changeme", "a" * 48]
)
def test_the_api_does_not_start_with_a_token_that_cannot_guard_it(token: str | None) -> None:
    with pytest.raises(RuntimeError, match="will not start"):
        app_with(api_token=token)
    assert api_token_problem(token) is not None


def test_only_the_explicit_dev_mode_opens_it_and_never_with_a_weak_token() -> None:
    client = InProcess(app_with(api_dev_open=True))
    assert client.get("/datasets").status_code == 200
    with pytest.raises(RuntimeError, match="shorter than 32"):
        app_with(api_dev_open=True, api_token="short-token")


@pytest.fixture
def client() -> InProcess:
    return InProcess(app_with(api_token=TOKEN))


@pytest.mark.parametrize(
    "path",
    [
        "/readyz",
        "/docs",
        "/openapi.json",
        "/runs",
        "/datasets",
        "/metrics",
        "/runs/x-000000000000/review/items",
    ],
)
def test_every_path_but_health_and_the_page_needs_the_token(client: InProcess, path: str) -> None:
    refused = client.get(path)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert (
        client.get(path, headers={"Authorization": "Bearer " + TOKEN[:-1] + "0"}).status_code == 401
    )
    assert client.get(path, headers=AUTH).status_code != 401


def test_health_and_the_review_page_are_open_with_security_headers(client: InProcess) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    page = client.get("/review")
    assert page.status_code == 200 and "<script>" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'sha256-" in csp and "'unsafe-inline'" not in csp
    for response in (page, client.get("/runs")):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"


def test_an_unauthenticated_body_is_never_read(client: InProcess) -> None:
    """The ASGI app answers 401 without calling receive(): no byte of the body is read."""
    app = client.app
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body was read before the token was checked")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/runs/upload",
        "raw_path": b"/runs/upload",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "http_version": "1.1",
        "headers": [(b"content-length", str(200 * 1024**2).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 401


def test_a_body_over_its_routes_limit_is_413_once_authorised(client: InProcess) -> None:
    """JSON routes take api_max_json_bytes (2048 here), the upload route its own (4096)."""
    resp = client.post("/runs", content=b"x" * 3000, headers=AUTH)
    assert resp.status_code == 413 and "2048" in resp.text
    assert client.post("/runs", content=b"x" * 3000).status_code == 401  # the token first
    upload = client.post("/runs/upload", content=b"x" * 3000, headers=AUTH)
    assert upload.status_code == 422  # read, and refused as no form: under its limit
    resp = client.post("/runs/upload", content=b"x" * 5000, headers=AUTH)
    assert resp.status_code == 413 and "4096" in resp.text


def test_an_upload_beyond_the_free_slots_is_429_before_its_body_is_read() -> None:
    """With one slot, a second upload while the first is still sending gets 429 and
    Retry-After, its body unread; once the first is done, the slot is free again."""
    app = app_with(api_token=TOKEN, api_upload_slots=1)

    def scope() -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/runs/upload",
            "raw_path": b"/runs/upload",
            "query_string": b"",
            "headers": [
                (b"authorization", AUTH["Authorization"].encode()),
                (b"content-type", b"multipart/form-data; boundary=x"),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
        release, reading = asyncio.Event(), asyncio.Event()
        first_sent: list[dict[str, Any]] = []
        second_sent: list[dict[str, Any]] = []
        second_reads = 0

        async def slow_body() -> dict[str, Any]:
            reading.set()  # the slot is taken before the body is read
            await release.wait()
            return {"type": "http.request", "body": b"", "more_body": False}

        async def second_body() -> dict[str, Any]:
            nonlocal second_reads
            second_reads += 1
            return {"type": "http.request", "body": b"", "more_body": False}

        async def record(into: list[dict[str, Any]], message: dict[str, Any]) -> None:
            into.append(message)

        first = asyncio.create_task(app(scope(), slow_body, lambda m: record(first_sent, m)))
        await asyncio.wait_for(reading.wait(), 10)  # the first holds the slot, reading
        await app(scope(), second_body, lambda m: record(second_sent, m))
        release.set()
        await first
        third: list[dict[str, Any]] = []
        await app(scope(), second_body, lambda m: record(third, m))
        return second_sent, third, second_reads, first_sent[0]["status"]

    second, third, reads, first_status = asyncio.run(go())
    assert second[0]["status"] == 429 and (b"retry-after", b"30") in second[0]["headers"]
    assert reads == 1  # only the third request read its (empty) body
    assert first_status == 422 and third[0]["status"] == 422  # no form: refused, not 429


@pytest.mark.parametrize("token", ["", "short-token", "changeme-changeme-changeme-changeme"])
def test_the_api_process_exits_at_start_with_a_weak_token(token: str) -> None:
    """`python -m services.api` (what every deployment runs) stops before it listens."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RSIEVE_API_TOKEN": token, "RSIEVE_API_URL": "http://127.0.0.1:1"}
    env.pop("RSIEVE_API_DEV_OPEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "services.api"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "the API will not start" in done.stderr
    assert token not in done.stderr or not token  # the refused token is never printed
