"""The one settings class. Every tunable of rsieve is one field here (env prefix RSIEVE_).

Built lazily by `get_settings()`, never at import, so tests and services construct their
own with explicit values.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]

_DEV_ACCESS_KEY = "rsieve-local"
_DEV_SECRET_KEY = "rsieve-local-secret"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RSIEVE_", extra="ignore")

    environment: Literal["local", "test", "production"] = "local"

    # Queues (Celery on Redis).
    redis_url: str = "redis://127.0.0.1:16379/0"
    # Seconds before a message delivered to a worker that died is redelivered. Must exceed
    # the longest shard; ENVIRONMENT.md measured redelivery at timeout + restore sweep.
    visibility_timeout_s: int = 3600

    # Object storage (any S3 endpoint; SeaweedFS locally).
    s3_endpoint: str = "http://127.0.0.1:18333"
    s3_bucket: str = "rsieve"
    s3_region: str = "us-east-1"
    s3_access_key: SecretStr = SecretStr(_DEV_ACCESS_KEY)
    s3_secret_key: SecretStr = SecretStr(_DEV_SECRET_KEY)

    # Models behind Triton (the rsieve text-generation interface; deploy/triton/README.md).
    triton_grpc_url: str = "127.0.0.1:18001"
    generator_model: str = "rapidocr"
    judge_model: str = "judge-abstain"
    max_inflight: int = Field(16, ge=1, description="Triton requests in flight per worker")
    model_timeout_s: float = 120.0
    model_retries: int = Field(3, ge=0)
    max_new_tokens: int = 1024
    temperature: float = 0.0

    # Workers.
    worker_concurrency: int = Field(1, ge=1, description="Celery prefork children per worker")

    # Work units and limits.
    shard_size: int = Field(32, ge=1, description="pool lines per shard message")
    image_max_pixels: int = 40_000_000
    image_max_bytes: int = 32 * 1024 * 1024
    text_max_chars: int = 16_384
    provenance_policy: Literal["strict", "lenient"] = "strict"

    # API.
    api_url: str = "http://127.0.0.1:18080"
    api_token: SecretStr | None = None

    @model_validator(mode="after")
    def _no_dev_secrets_in_production(self) -> Settings:
        if self.environment == "production" and (
            self.s3_access_key.get_secret_value() == _DEV_ACCESS_KEY
            or self.s3_secret_key.get_secret_value() == _DEV_SECRET_KEY
        ):
            raise ValueError("production needs real S3 credentials (RSIEVE_S3_ACCESS_KEY/..)")
        return self

    def fingerprint(self) -> dict[str, object]:
        """The settings that change decisions: part of a run's identity."""
        return {
            "generator_model": self.generator_model,
            "judge_model": self.judge_model,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "provenance_policy": self.provenance_policy,
            "image_max_pixels": self.image_max_pixels,
        }


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
