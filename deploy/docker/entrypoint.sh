#!/bin/sh
# rsieve container entrypoint.
#
#   entrypoint.sh SERVICE        exec `python -m services.SERVICE` (SERVICE below)
#   entrypoint.sh beat [ARG...]  exec `python -m services.cleaner.beat ARG...`: the Celery beat
#                                of continuous ingestion (exactly one per deployment; exits 0
#                                at once when RSIEVE_WATCH_PREFIX is empty)
#   entrypoint.sh judge-server ARG...
#                                exec `python -m rsieve_cli.local.llama_judge ARG...`: the
#                                cpu profile's judge, llama.cpp's server (its own /health
#                                is its health check; the key comes from RSIEVE_LLAMA_API_KEY)
#   entrypoint.sh --healthcheck  exit 0 when this container's rsieve service is healthy
#
# The service runs as PID 1 (exec, no shell in between), so `docker stop` delivers SIGTERM
# straight to Celery, whose warm shutdown finishes the shard in hand (compose gives each
# worker a stop_grace_period longer than a shard; see docker-compose.yml).
#
# Health, without a worker heartbeat: a worker is healthy while its process is alive
# (present, not a zombie, not stopped). `celery inspect ping` is deliberately NOT used: it
# is a broadcast through Redis, so a broker hiccup would mark every worker unhealthy at once
# and an orchestrator would restart them mid-shard; liveness of the broker is Redis's own
# healthcheck, and a task lost with its worker comes back through late acks and the
# visibility timeout (RSIEVE_VISIBILITY_TIMEOUT_S). The API is healthy when it answers
# GET /healthz on the port of RSIEVE_API_URL.
set -eu

# Must equal the folders services/<name>/ that have a __main__.py (tests/unit/test_deploy_files.py).
SERVICES="api cleaner compactor generator judge verifier"

usage() {
    echo "usage: $0 {$(echo "$SERVICES" | tr ' ' '|')} | beat [--schedule FILE] | judge-server ARG... | --healthcheck" >&2
}

healthcheck() {
    # The process to check: PID 1 in the container; HEALTHCHECK_PID for tests.
    pid="${HEALTHCHECK_PID:-1}"
    if [ ! -r "/proc/$pid/cmdline" ] || [ ! -r "/proc/$pid/stat" ]; then
        echo "unhealthy: no process $pid" >&2
        return 1
    fi
    cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline")
    case "$cmdline" in
        *"-m services."*) ;;
        *) echo "unhealthy: process $pid is not an rsieve service: $cmdline" >&2; return 1 ;;
    esac
    # Field 3 of /proc/PID/stat, after the ")" that closes the command name.
    stat=$(cat "/proc/$pid/stat")
    state=${stat##*) }
    state=${state%% *}
    case "$state" in
        Z|X|x|T|t) echo "unhealthy: process $pid is in state $state" >&2; return 1 ;;
    esac
    service=${cmdline##*-m services.}
    service=${service%% *}
    if [ "$service" = "api" ]; then
        # Same address resolution as services/api/__main__.py (RSIEVE_API_URL), on loopback.
        python -c '
import os, sys, urllib.request
from urllib.parse import urlparse
from rsieve.settings import Settings
url = os.environ.get("RSIEVE_API_URL") or Settings.model_fields["api_url"].default
port = urlparse(url).port or 8080
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        ok = reply.status == 200
except OSError as exc:
    print(f"unhealthy: GET /healthz on port {port}: {exc}", file=sys.stderr)
    ok = False
sys.exit(0 if ok else 1)
'
        return $?
    fi
    return 0
}

case "${1:-}" in
    --healthcheck)
        healthcheck
        exit $?
        ;;
    ""|-h|--help)
        usage
        exit 64
        ;;
esac

name=$1
if [ "$name" = "beat" ]; then
    # Not a folder of its own (services/cleaner/beat.py), so not in SERVICES; the only name
    # that takes arguments (--schedule FILE: beat's state file, on a writable volume). The
    # health check above passes it like a worker: PID 1 is `python -m services.cleaner.beat`.
    shift
    cd "$(dirname "$0")/../.."
    exec python -m services.cleaner.beat "$@"
fi
if [ "$name" = "judge-server" ]; then
    shift
    exec python -m rsieve_cli.local.llama_judge "$@"
fi
for service in $SERVICES; do
    if [ "$service" = "$name" ]; then
        # The repository root (/app in the image), so `services` imports from the source.
        cd "$(dirname "$0")/../.."
        exec python -m "services.$name"
    fi
done
echo "unknown service: $name" >&2
usage
exit 64
