"""A run's identity: every settings field is declared DECIDING or OPERATIONAL (once), the
run id follows every DECIDING field and no OPERATIONAL one, and no secret is part of it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from rsieve.run.submission import run_id
from rsieve.settings import DECIDING, OPERATIONAL, SINCE_FIRST_IDS, Role, Settings
from rsieve.verify import protocol_versions

POOL = hashlib.sha256(b"a pool").hexdigest()


def _rid(settings: Settings) -> str:
    return run_id(POOL, "ds", settings.fingerprint(), protocol_versions())


def _another_value(name: str) -> Any:
    """A valid value for the field other than its default."""
    default = Settings.model_fields[name].get_default(call_default_factory=True)
    if isinstance(default, bool):
        candidates: list[Any] = [not default]
    elif isinstance(default, int):
        candidates = [default + 1, max(default - 1, 0), 1]
    elif isinstance(default, float):
        candidates = [default / 2 if default else 0.5, default + 0.01, 1.0]
    elif isinstance(default, list):
        candidates = [["/elsewhere"], ["other-bucket"], default[:1]]
    elif isinstance(default, dict):
        candidates = [{"Fam": ["other"]}, {"anls": "benchmark"}, {"Fam": "benchmark"}]
    elif isinstance(default, str):
        candidates = [
            "lenient",
            "other-model",
            "vllm",
            "test",
            "image_and_question",
            "stand-in",
            "distinct",
            "sample",  # judge_calibration_stop
            "0" * 64,  # a sha256 (judge_weights_sha256)
            default + "-other",
        ]
    else:  # None: an optional URL or token
        candidates = ["http://127.0.0.1:9/metrics", "x" * 40]
    for value in candidates:
        try:
            settings = Settings(**{name: value})
        except ValidationError:
            continue
        if getattr(settings, name) != getattr(Settings(), name):
            return value
    raise AssertionError(f"no other valid value found for {name}")


def test_every_field_is_declared_once() -> None:
    fields = set(Settings.model_fields)
    assert not DECIDING & OPERATIONAL, sorted(DECIDING & OPERATIONAL)
    undeclared = sorted(fields - DECIDING - OPERATIONAL)
    assert not undeclared, (
        f"declare {undeclared} in rsieve.settings with a Role: DECIDES if a different value "
        "can change what a run decides, else OPERATES"
    )
    assert not (DECIDING | OPERATIONAL) - fields, sorted((DECIDING | OPERATIONAL) - fields)
    # The role is declared on the field itself, exactly once.
    for name, info in Settings.model_fields.items():
        roles = [m for m in info.metadata if isinstance(m, Role)]
        assert len(roles) == 1, (name, roles)
    assert SINCE_FIRST_IDS <= DECIDING


def test_no_secret_is_part_of_a_runs_identity() -> None:
    for name in DECIDING:
        assert Settings.model_fields[name].annotation not in (SecretStr, SecretStr | None), name
    assert set(Settings().fingerprint()) == DECIDING
    json.dumps(Settings().fingerprint())  # stored in run.json and run_spec.json


@pytest.mark.parametrize("name", sorted(DECIDING))
def test_every_deciding_field_changes_the_run_id(name: str) -> None:
    if name == "samples":  # several samples need a temperature above 0
        warm = Settings(temperature=0.5)
        assert _rid(Settings(samples=2, temperature=0.5)) != _rid(warm)
        return
    if name == "circular":  # one rotation per sample
        assert _rid(Settings(samples=4, circular=True)) != _rid(
            Settings(samples=4, temperature=0.5)
        )
        assert _rid(Settings(samples=4, circular=True)) != _rid(Settings())
        return
    if name == "blind_policy":  # a policy needs the blind pass
        blind = Settings(blind_pass=True)
        for policy in ("nothink", "drop"):
            assert _rid(Settings(blind_pass=True, blind_policy=policy)) != _rid(blind)
        return
    if name in ("enough", "sample_round"):  # adaptive sampling needs several samples
        several: dict[str, Any] = {"samples": 4, "temperature": 0.5}
        for value in (0, 2) if name == "enough" else (1, 2):
            chosen: dict[str, Any] = {**several, name: value}
            changed = Settings(**chosen)
            assert _rid(changed) != _rid(Settings(**several)), (name, value)
        return
    if name == "judge_pair_rejections":  # judging the refused of passed items needs several
        best_of_4: dict[str, Any] = {"samples": 4, "temperature": 0.5}
        paired = Settings(judge_pair_rejections=True, **best_of_4)
        assert _rid(paired) != _rid(Settings(**best_of_4))
        return
    if name == "pass_rate_window":  # a window needs several samples
        sampled: dict[str, Any] = {"samples": 4, "temperature": 0.5}
        windowed = Settings(pass_rate_window=[0.2, 0.8], **sampled)
        assert _rid(windowed) != _rid(Settings(**sampled))
        return
    assert _rid(Settings(**{name: _another_value(name)})) != _rid(Settings()), name


def test_fields_added_since_the_first_ids_keep_the_ids_at_their_defaults() -> None:
    """A pool submitted with the defaults keeps its run id across the fields added later:
    the id is what it was from the fingerprint without them."""
    assert SINCE_FIRST_IDS <= DECIDING
    full = Settings().fingerprint()
    before = {k: v for k, v in full.items() if k not in SINCE_FIRST_IDS}
    assert run_id(POOL, "ds", full, protocol_versions()) == run_id(
        POOL, "ds", before, protocol_versions()
    )
    # ... while the run spec records them all.
    assert SINCE_FIRST_IDS <= set(full)


def test_several_samples_at_temperature_0_are_refused() -> None:
    with pytest.raises(ValidationError, match="RSIEVE_TEMPERATURE"):
        Settings(samples=4)


@pytest.mark.parametrize(
    "name", sorted(n for n in OPERATIONAL if n not in {"s3_access_key", "s3_secret_key"})
)
def test_no_operational_field_changes_the_run_id(name: str) -> None:
    value = _another_value(name)
    assert _rid(Settings(**{name: value})) == _rid(Settings()), name


def test_text_max_chars_changes_the_run_id() -> None:
    """Once left out: resubmitting after changing it silently returned the old run."""
    assert _rid(Settings(text_max_chars=1000)) != _rid(Settings())
    assert _rid(Settings(image_max_bytes=1 << 20)) != _rid(Settings())
