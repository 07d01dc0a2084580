"""The API's settings: its address, its token, and the bounds on what a request may bring
(docs/security.md); and the rule a token must meet to guard the API. All operational."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, SecretStr

from rsieve.settings.roles import OPERATES

API_TOKEN_MIN_CHARS = 32
_PLACEHOLDERS = ("change", "example", "placeholder", "secret", "token", "password", "xxxx")


def api_token_problem(token: str | None) -> str | None:
    """Why `token` cannot guard the API (None when it can): missing, shorter than
    API_TOKEN_MIN_CHARS, or a placeholder: a few characters repeated, or a word such as
    "changeme" or "example" in a token with fewer distinct characters than a random one
    (32 random characters of base64 hold about 25 distinct ones)."""
    if not token:
        return "no token is set (RSIEVE_API_TOKEN)"
    if len(token) < API_TOKEN_MIN_CHARS:
        return f"the token is shorter than {API_TOKEN_MIN_CHARS} characters"
    lowered = token.lower()
    distinct = len(set(token))
    if distinct <= 4 or (distinct < 20 and any(word in lowered for word in _PLACEHOLDERS)):
        return "the token looks like a placeholder"
    return None


class ApiSettings(BaseModel):
    api_url: Annotated[str, OPERATES] = "http://127.0.0.1:18080"
    # The bearer token every route but /healthz and the review page's HTML needs. The API
    # refuses to start without one of at least API_TOKEN_MIN_CHARS that is no placeholder
    # (`api_token_problem`), unless `api_dev_open` says, explicitly, that this is a laptop.
    api_token: Annotated[SecretStr | None, OPERATES] = None
    # Local development only: the API answers without a token when none is set. Never in a
    # deployment (docs/security.md); the local stack does not need it (it makes a token).
    api_dev_open: Annotated[bool, OPERATES] = False
    # Folders the API may read a pool from when a submission names a path (none by default).
    api_pool_roots: Annotated[list[str], OPERATES] = []
    # Largest body of an upload (POST /runs/upload, a pool archive), and of every other
    # request (JSON). Both are refused with 413 before they are read past the limit.
    api_max_request_bytes: Annotated[int, OPERATES] = Field(2 * 1024**3, ge=1024)
    api_max_json_bytes: Annotated[int, OPERATES] = Field(1024**2, ge=1024)
    # Files an uploaded archive may hold, and their total size once extracted.
    api_max_upload_files: Annotated[int, OPERATES] = Field(200_000, ge=1)
    api_max_extracted_bytes: Annotated[int, OPERATES] = Field(4 * 1024**3, ge=1024)
    # Uploads the API takes at once; one more gets 429 before its body is read. An upload
    # holds at most api_max_request_bytes + api_max_extracted_bytes of temporary space, so
    # the API's temporary folder needs `upload_slots` times that (docs/security.md).
    api_upload_slots: Annotated[int, OPERATES] = Field(2, ge=1)
    # An archive may expand to at most this many times its own size (a pool of images
    # barely compresses; a few KB that inflate to gigabytes are a bomb).
    api_max_expansion_ratio: Annotated[float, OPERATES] = Field(50.0, ge=1.0)
    # Triton's Prometheus endpoint, read by the API's /metrics for in-flight requests.
    triton_metrics_url: Annotated[str | None, OPERATES] = None
