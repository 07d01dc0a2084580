"""`make compose-run` and `make compose-test`: the example pool through docker-compose.yml's
cpu profile, on the images `make images` built on this machine (docs/deploy.md).

    python -m scripts.compose_run [--fault] [--expect DIR] [--keep]

1. `docker compose up --wait`: every service healthy (non-root, with its declared limits);
2. examples/pool uploaded through the API with the token (`rsieve_cli.client.upload`);
3. with `--fault`, the generator's process SIGKILLed from the host once it holds a shard of
   the run, as the kernel's OOM killer would: compose restarts the container (restart
   policy), the shard comes back through the heartbeats (delivered a second time), and the
   run finishes;
4. the run waited for, audited from storage (every item in exactly one place), exported to
   out-compose/<dataset>/ and loaded with `datasets`;
5. with `--expect DIR` (a `make run` export), splits and counts compared with it;
6. `docker compose down -v`, unless `--keep`.

Prints what it measured as one JSON object on the last line; exits 1 on any failed check.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsieve import redis_keys

if TYPE_CHECKING:
    from rsieve.settings import Settings

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "deploy" / "docker" / "local"
POOL = REPO / "examples" / "pool"
DATASET = "rsieve-example"
# The services whose containers must all be running for the cpu profile (beat included:
# it sends the sweeps).
SERVICES = (
    "redis",
    "s3",
    "triton-cpu",
    "judge-server",
    "api",
    "cleaner",
    "generator",
    "verifier",
    "judge",
    "compactor",
    "beat",
    "flower",
)


def compose(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """`docker compose ARGS` the way deploy/docker/local/engine.sh calls it."""
    script = f'. "{LOCAL / "engine.sh"}" && compose "$@"'
    return subprocess.run(
        ["bash", "-c", script, "compose", *args],
        cwd=REPO,
        check=True,
        text=True,
        capture_output=capture,
    )


def compose_env() -> dict[str, str]:
    """The local compose variables: compose.env, then this machine's secrets."""
    env: dict[str, str] = {}
    for path in (LOCAL / "compose.env", REPO / "var" / "compose" / "secrets.env"):
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                name, value = line.split("=", 1)
                env[name] = value
    return env


def client_settings(env: dict[str, str]) -> Settings:
    """The settings an operator on this host uses: the API and S3 on their loopback ports."""
    from rsieve.settings import Settings

    return Settings.from_env_map(
        {
            "RSIEVE_API_URL": f"http://127.0.0.1:{env['API_PORT']}",
            "RSIEVE_API_TOKEN": env["API_TOKEN"],
            "RSIEVE_S3_ENDPOINT": f"http://127.0.0.1:{env['S3_PORT']}",
            "RSIEVE_S3_BUCKET": env["S3_BUCKET"],
            "RSIEVE_S3_ACCESS_KEY": env["S3_ACCESS_KEY"],
            "RSIEVE_S3_SECRET_KEY": env["S3_SECRET_KEY"],
        }
    )


def containers() -> dict[str, dict[str, Any]]:
    """`docker inspect` of every container of the project, by service."""
    ids = compose("ps", "-q", capture=True).stdout.split()
    if not ids:
        return {}
    out = subprocess.run(
        ["docker", "inspect", *ids], check=True, text=True, capture_output=True
    ).stdout
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in json.loads(out)}


def hardening_failures(found: dict[str, dict[str, Any]]) -> list[str]:
    """Every container runs as a non-root user, with a memory and a process limit."""
    failures = []
    for name in SERVICES:
        c = found.get(name)
        if c is None or not c["State"]["Running"]:
            failures.append(f"{name}: not running")
            continue
        pid = c["State"]["Pid"]
        uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[1])
        if uid == 0:
            failures.append(f"{name}: its process runs as root")
        host = c["HostConfig"]
        if not host.get("Memory"):
            failures.append(f"{name}: no memory limit")
        if not host.get("PidsLimit"):
            failures.append(f"{name}: no process limit")
    return failures


@cache
def redis_container() -> str:
    """The redis container's id (it is never restarted during a run)."""
    return str(containers()["redis"]["Id"])


def redis_cli(*args: str) -> str:
    """`redis-cli ARGS` inside the redis container (which has the password in its env)."""
    return subprocess.run(
        ["docker", "exec", redis_container(), "redis-cli", *args],
        check=True,
        text=True,
        capture_output=True,
    ).stdout


def generator_holds_a_shard(run: str) -> bool:
    """Whether a generator process has recorded that it runs a shard of `run` (its holding,
    services/liveness.py): killed now, it dies with work in hand."""
    for value in redis_cli("hvals", redis_keys.HOLDINGS).splitlines():
        try:
            holding = json.loads(value)
        except ValueError:
            continue
        if holding.get("task") == "rsieve.generate" and holding.get("kwargs", {}).get("run") == run:
            return True
    return False


def deliveries(stage: str, run: str) -> int:
    """How often the shards of `run` were delivered to `stage` (services/stage.py counts)."""
    keys = redis_cli("--scan", "--pattern", redis_keys.deliveries_pattern(stage, run)).split()
    return sum(int(count) for count in redis_cli("mget", *keys).split()) if keys else 0


def kill_generator() -> int:
    """SIGKILL the generator container's main process from the host (a crash: compose's
    restart policy applies, unlike `docker kill`, which counts as a stop). Returns the
    container's restart count before the kill."""
    c = containers()["generator"]
    subprocess.run(["kill", "-KILL", str(c["State"]["Pid"])], check=True)
    return int(c["RestartCount"])


def splits_and_counts(folder: Path) -> dict[str, Any]:
    """What two exports of the same pool must agree on: rows per split and, per family, the
    report's counts."""
    import datasets

    loaded = datasets.load_dataset(str(folder))
    report = json.loads((folder / "run_report.json").read_text())
    counts = ("in", "accepted", "rejected", "quarantined")
    return {
        "splits": {name: loaded[name].num_rows for name in sorted(loaded)},
        "families": {
            fam: {k: r[k] for k in counts} for fam, r in sorted(report["families"].items())
        },
        "adds_up": report["adds_up"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts.compose_run")
    parser.add_argument("--fault", action="store_true", help="kill the generator mid-run")
    parser.add_argument("--expect", type=Path, help="a `make run` export to compare with")
    parser.add_argument("--out", type=Path, default=REPO / "out-compose")
    parser.add_argument("--keep", action="store_true", help="leave the stack up")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)

    from rsieve.adapters.exports import export_dataset
    from rsieve.adapters.storage import S3Store
    from rsieve.dataset.audit import audit_run
    from rsieve_cli.client import upload, wait_for_run
    from services.worker import bootstrap

    figures: dict[str, Any] = {}
    failures: list[str] = []
    started = time.monotonic()
    try:
        compose("up", "-d", "--wait", "--wait-timeout", "900")
        figures["up_s"] = round(time.monotonic() - started, 1)
        failures += hardening_failures(containers())
        env = compose_env()
        settings = client_settings(env)
        t0 = time.monotonic()
        run_id = upload(settings, POOL, DATASET)
        figures["run"] = run_id
        killed = False
        restarts_before = 0

        def on_status(status: dict[str, Any]) -> None:
            nonlocal killed, restarts_before
            # Once the generator holds a shard of the run: it dies with work in hand.
            if args.fault and not killed and generator_holds_a_shard(run_id):
                restarts_before = kill_generator()
                killed = True
                figures["killed_at_s"] = round(time.monotonic() - t0, 1)

        final = wait_for_run(settings, run_id, timeout=args.timeout, on_status=on_status)
        figures["run_s"] = round(time.monotonic() - t0, 1)
        figures["splits"] = final["manifest"]["splits"]
        figures["generate_deliveries"] = deliveries("generate", run_id)
        if args.fault:
            generator = containers()["generator"]
            figures["generator_restarts"] = int(generator["RestartCount"]) - restarts_before
            if figures["generate_deliveries"] < 2:
                failures.append("the killed generator's shard was never delivered again")
            if not killed:
                failures.append("the run ended before the generator could be killed")
            elif figures["generator_restarts"] < 1 or not generator["State"]["Running"]:
                failures.append("compose did not restart the killed generator")
        store = S3Store(settings)
        index, outputs = bootstrap(settings, store=store).load_run(run_id)
        if index is None:
            failures.append(f"run {run_id} has no index")
        else:
            audit = audit_run(index, outputs).as_dict()
            figures["audit_ok"] = audit.get("ok")
            if not audit.get("ok"):
                failures.append(f"audit: {json.dumps(audit)[:2000]}")
        target = export_dataset(store, DATASET, args.out)
        got = splits_and_counts(target)
        figures["export"] = str(target)
        figures["compose"] = got
        if not got["adds_up"]:
            failures.append("the run report does not add up")
        if args.expect:
            want = splits_and_counts(args.expect / DATASET)
            figures["make_run"] = want
            if {k: got[k] for k in ("splits", "families")} != {
                k: want[k] for k in ("splits", "families")
            }:
                failures.append("the compose export differs from make run's in splits or counts")
    except (subprocess.CalledProcessError, TimeoutError, OSError) as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
        try:
            print(compose("logs", "--tail", "40", capture=True).stdout[-20000:], file=sys.stderr)
        except subprocess.CalledProcessError:
            pass  # no stack to show
    finally:
        if not args.keep:
            compose("down", "-v", "--remove-orphans")
    figures["total_s"] = round(time.monotonic() - started, 1)
    figures["failures"] = failures
    print(json.dumps(figures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
