"""The one settings class. Every tunable of rsieve is one field of `Settings` (env prefix
RSIEVE_), declared with its role (rsieve.settings.roles) in the module of its concern:
work (queues, workers, shards), storage, models, sampling, cleaning, training, api.

Built lazily by `get_settings()`, never at import, so tests and services construct their
own with explicit values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any, Literal, get_origin

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rsieve.settings.api import API_TOKEN_MIN_CHARS, ApiSettings, api_token_problem
from rsieve.settings.cleaning import CleaningSettings
from rsieve.settings.models import ModelSettings
from rsieve.settings.roles import DECIDES, OPERATES, SINCE_FIRST_ID, Role
from rsieve.settings.sampling import SAMPLING, SamplingSettings
from rsieve.settings.storage import DEV_ACCESS_KEY, DEV_SECRET_KEY, StorageSettings
from rsieve.settings.training import TRAINING, TrainingSettings
from rsieve.settings.work import WorkSettings

__all__ = [
    "API_TOKEN_MIN_CHARS",
    "DECIDING",
    "OPERATIONAL",
    "SAMPLING",
    "SINCE_FIRST_IDS",
    "TRAINING",
    "Settings",
    "api_token_problem",
    "get_settings",
    "identity",
]


class Settings(
    WorkSettings,
    StorageSettings,
    ModelSettings,
    SamplingSettings,
    CleaningSettings,
    TrainingSettings,
    ApiSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(env_prefix="RSIEVE_", extra="ignore")

    environment: Annotated[Literal["local", "test", "production"], OPERATES] = "local"

    @model_validator(mode="after")
    def _no_dev_secrets_in_production(self) -> Settings:
        if self.environment == "production" and (
            self.s3_access_key.get_secret_value() == DEV_ACCESS_KEY
            or self.s3_secret_key.get_secret_value() == DEV_SECRET_KEY
        ):
            raise ValueError("production needs real S3 credentials (RSIEVE_S3_ACCESS_KEY/..)")
        return self

    def for_run(self, sampling: Mapping[str, Any] | None) -> Settings:
        """These settings with a run's own sampling (SAMPLING fields only: what a
        submission may choose), validated as any settings are."""
        if not sampling:
            return self
        unknown = sorted(set(sampling) - set(SAMPLING))
        if unknown:
            raise ValueError(f"a run may choose only {list(SAMPLING)}, not {unknown}")
        return type(self)(**{**self.model_dump(), **sampling})

    @classmethod
    def from_env_map(cls, env: dict[str, str]) -> Settings:
        """Settings from RSIEVE_* variables given as a mapping (a stack's environment),
        decoded as pydantic-settings decodes the process environment."""
        values: dict[str, object] = {}
        for key, raw in env.items():
            name = key.removeprefix("RSIEVE_").lower()
            field = cls.model_fields.get(name)
            if field is None:
                continue
            complex_ = get_origin(field.annotation) in (list, dict) or field.annotation in (
                list,
                dict,
            )
            values[name] = json.loads(raw) if complex_ else raw
        return cls(**values)  # type: ignore[arg-type]

    def fingerprint(self) -> dict[str, object]:
        """The settings that change what a run decides (DECIDING): part of the run's id,
        and exported whole in the dataset's run_spec.json. A field in neither DECIDING nor
        OPERATIONAL fails tests/unit/test_run_identity.py."""
        return {name: _plain(getattr(self, name)) for name in sorted(DECIDING)}


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _fields_with(*roles: Role) -> frozenset[str]:
    """The fields whose declared role (their Annotated metadata) is one of `roles`."""
    return frozenset(
        name
        for name, info in Settings.model_fields.items()
        if any(m in roles for m in info.metadata if isinstance(m, Role))
    )


# Derived from the fields' own declarations (Role): never listed twice.
DECIDING = _fields_with(DECIDES, SINCE_FIRST_ID)
OPERATIONAL = _fields_with(OPERATES)
# DECIDING fields added after run ids were first given out. Each enters a run's id only
# when set to something other than its default, so a pool submitted with the defaults keeps
# the id it had before the field existed (run_spec.json records every field).
SINCE_FIRST_IDS = _fields_with(SINCE_FIRST_ID)


def identity(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What of a fingerprint names the run: every field but those of SINCE_FIRST_IDS left
    at their default."""
    return {
        name: value
        for name, value in fingerprint.items()
        if name not in SINCE_FIRST_IDS
        or value != _plain(Settings.model_fields[name].get_default(call_default_factory=True))
    }


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
