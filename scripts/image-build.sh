#!/usr/bin/env bash
# Build (or reuse) the airuntime container image from the repository's Dockerfile with
# podman, daemonless: no docker engine and no image pulls are available here. Prints a
# JSON summary as the LAST line of stdout:
#
#   {"image": "localhost/airuntime:<hash>", "archive": ".../airuntime-<hash>.docker.tar",
#    "base": "localhost/airuntime-python-base:<hash>", "size_bytes": N, ...}
#
# 1. Tools: podman, runc and debootstrap (Debian packages; installed when missing and
#    running as root).
# 2. Base image (what `python:3.11-slim` is for a docker user): a Debian bookworm
#    minbase made with debootstrap, with python3, venv (its ensurepip brings pip into
#    a virtualenv) and CA certificates,
#    `python` -> python3, and without the EXTERNALLY-MANAGED marker (the image's pip
#    installs into the system interpreter, as in the official Python images). Cached as
#    a rootfs tarball named after the sha256 of the recipe (the lines between the
#    BASE RECIPE markers below); imported into podman when podman lacks it.
# 3. The image: `podman build --build-arg PYTHON_IMAGE=<base>` of the unchanged
#    Dockerfile (users build the same file with `docker build`). Cached by the sha256
#    of the build context (Dockerfile, .dockerignore and every file the Dockerfile
#    copies) and of the base: a tag `localhost/airuntime:<hash>` and an OCI archive in
#    the cache (docker-archive format: what `podman load` and `ctr images import` read). Unchanged sources rebuild nothing.
#
# Sandbox notes (measured on the CI machines): `--isolation chroot` builds without an
# OCI runtime; `--network host` and the host's CA bundle mounted read-only at its own
# path let pip reach the package index through the TLS proxy that only that bundle
# trusts; running containers needs `--runtime runc` (crun fails on the hybrid cgroup
# layout) and explicit nproc/nofile ulimits (the defaults exceed the hard limits).
#
# Environment:
#   AIRUNTIME_CACHE       cache root (default: $HOME/.cache/airuntime)
#   AIRUNTIME_CA_BUNDLE   host CA bundle mounted into build steps
#                         (default: /etc/ssl/certs/ca-certificates.crt when it exists)
#   DEBIAN_MIRROR         debootstrap mirror (default: the host's apt mirror, else
#                         http://deb.debian.org/debian)
#
# Idempotent; concurrent runs are serialised with flock. Progress goes to stderr.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_ROOT="${AIRUNTIME_CACHE:-$HOME/.cache/airuntime}"
IMAGE_DIR="$CACHE_ROOT/image"
CA_BUNDLE="${AIRUNTIME_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

log() { printf '[image-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

host_mirror() {
    local uri
    uri="$(sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*debian\)[[:space:]]*$/\1/p' \
        /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)"
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}
MIRROR="${DEBIAN_MIRROR:-$(host_mirror)}"

# --- BASE RECIPE (its sha256 names the cached base) ---
BASE_SUITE=bookworm
BASE_VARIANT=minbase
BASE_INCLUDE=python3,python3-venv,python-is-python3,ca-certificates
BASE_REMOVE="/usr/lib/python3.11/EXTERNALLY-MANAGED /usr/share/locale /usr/share/doc /usr/share/man /usr/share/info"
# --- END BASE RECIPE ---

ensure_tools() {
    local need=()
    command -v podman >/dev/null || need+=(podman)
    command -v runc >/dev/null || need+=(runc)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    ((${#need[@]} == 0)) && return
    [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
        || die "missing ${need[*]} (install them, or run as root on Debian)"
    log "apt-get install ${need[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
}

base_hash() {
    sed -n '/^# --- BASE RECIPE/,/^# --- END BASE RECIPE/p' "$0" | sha256sum | cut -c1-16
}

# Every file of the build context: what .dockerignore lets through (an allow-list) and
# the Dockerfile itself, hashed by path and content, without interpreter leftovers.
context_hash() {
    (
        cd "$REPO"
        {
            printf '%s\n' Dockerfile .dockerignore
            sed -n 's|^!\(.*\)$|\1|p' .dockerignore | while read -r path; do
                find "${path%/}" -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' \
                    ! -path '*.egg-info/*' ! -path '*/.mypy_cache/*' ! -path '*/.ruff_cache/*' \
                    ! -path '*/.pytest_cache/*'
            done
        } | LC_ALL=C sort -u | while read -r f; do
            printf '%s\0' "$f"
            sha256sum <"$f"
        done
    ) | sha256sum | cut -c1-16
}

have_image() { podman image exists "$1" 2>/dev/null; }

build_base() {
    local ref=$1 tarball=$2 root
    if [[ ! -f "$tarball" ]]; then
        local started=$SECONDS
        root="$(mktemp -d "$IMAGE_DIR/rootfs.XXXXXX")"
        log "debootstrap $BASE_SUITE ($BASE_VARIANT + $BASE_INCLUDE) from $MIRROR (~2 min)"
        debootstrap --variant="$BASE_VARIANT" --include="$BASE_INCLUDE" \
            "$BASE_SUITE" "$root" "$MIRROR" >"$IMAGE_DIR/debootstrap.log" 2>&1 \
            || { tail -n 30 "$IMAGE_DIR/debootstrap.log" >&2; rm -rf "$root"; die "debootstrap failed"; }
        local path
        for path in $BASE_REMOVE; do rm -rf "${root:?}$path"; done
        rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb \
            "$root"/var/cache/apt/*.bin "$root"/var/log/*.log "$root"/tmp/*
        tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
        mv -f "$tarball.tmp" "$tarball"
        rm -rf "$root"
        log "base rootfs built in $((SECONDS - started)) s"
    fi
    log "podman import $tarball -> $ref"
    podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        "$tarball" "$ref" >/dev/null
}

build_image() {
    local ref=$1 base=$2 archive=$3 started=$SECONDS version
    local -a mounts=()
    [[ -f "$CA_BUNDLE" ]] && mounts+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
    version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml" | head -n1)"
    log "podman build $ref (FROM $base)"
    podman build --isolation chroot --network host "${mounts[@]}" \
        --build-arg "PYTHON_IMAGE=$base" \
        --build-arg "AIRUNTIME_VERSION=$version" \
        --layers --tag "$ref" --file "$REPO/Dockerfile" "$REPO" >&2
    log "image built in $((SECONDS - started)) s"
    rm -f "$archive.tmp"
    podman save --format docker-archive --output "$archive.tmp" "$ref" >&2
    mv -f "$archive.tmp" "$archive"
}

main() {
    mkdir -p "$IMAGE_DIR"
    exec 9>"$IMAGE_DIR/.lock"
    if ! flock -n 9; then
        log "another build holds $IMAGE_DIR/.lock; waiting"
        flock 9
    fi
    local started=$SECONDS
    ensure_tools
    local bhash chash base base_tar image archive
    bhash="$(base_hash)"
    base="localhost/airuntime-python-base:$bhash"
    base_tar="$IMAGE_DIR/python-base-$bhash.rootfs.tar"
    have_image "$base" || build_base "$base" "$base_tar"

    chash="$(printf '%s %s\n' "$(context_hash)" "$bhash" | sha256sum | cut -c1-16)"
    image="localhost/airuntime:$chash"
    archive="$IMAGE_DIR/airuntime-$chash.docker.tar"
    if have_image "$image" && [[ -f "$archive" ]]; then
        log "cached: $image"
    elif [[ -f "$archive" ]]; then
        log "podman load $archive"
        podman load --input "$archive" >&2 || true
        have_image "$image" || build_image "$image" "$base" "$archive"
    else
        build_image "$image" "$base" "$archive"
    fi
    # Old archives of other contexts are not needed any more.
    find "$IMAGE_DIR" -maxdepth 1 -name 'airuntime-*.docker.tar' ! -name "airuntime-$chash.docker.tar" -delete

    local size
    size="$(podman image inspect --format '{{.Size}}' "$image")"
    log "ready in $((SECONDS - started)) s: $image ($((size / 1000000)) MB)"
    printf '{"image": "%s", "archive": "%s", "base": "%s", "size_bytes": %s, "context_hash": "%s"}\n' \
        "$image" "$archive" "$base" "$size" "$chash"
}

main "$@"
