#!/usr/bin/env bash
# Build (once) and cache a pinned Helm v3 binary for the chart tests, and print
# its path as the LAST line of stdout.
#
#   helm="$(scripts/helm-binary.sh | tail -n1)"
#
# Why build from source: no prebuilt binaries can be downloaded here, only Go
# modules from the Go module proxy. helm.sh/helm/v3 is a Go module whose go.mod
# has no replace directives, so `go install helm.sh/helm/v3/cmd/helm@vX` builds
# it directly. The ldflags are the ones of Helm's own Makefile: the version that
# `helm version` prints, and the Kubernetes version (from the client-go that Helm
# requires) used as .Capabilities.KubeVersion by `helm template` and `helm lint`.
#
# Environment:
#   AIRUNTIME_CACHE         cache root (default: $HOME/.cache/airuntime)
#   AIRUNTIME_HELM_VERSION  Helm version (default: v3.22.0, the newest v3 on the proxy
#                           when this was written; it needs Go >= 1.26)
#   GO                      Go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#
# Layout: $AIRUNTIME_CACHE/helm/<version>/bin/helm; Go's module and build caches are
# $AIRUNTIME_CACHE/go/{mod,build} (shared with scripts/k8s-test-binaries.sh).
#
# Idempotent: when the cached binary exists nothing is built and no Go is needed.
# Concurrent runs are serialised with flock. Progress goes to stderr.
set -euo pipefail

HELM_VERSION="${AIRUNTIME_HELM_VERSION:-v3.22.0}"
HELM_VERSION="v${HELM_VERSION#v}"
CACHE_ROOT="${AIRUNTIME_CACHE:-$HOME/.cache/airuntime}"

HELM_DIR="$CACHE_ROOT/helm/$HELM_VERSION"
BIN_DIR="$HELM_DIR/bin"
HELM_BIN="$BIN_DIR/helm"
GO_BIN="${GO:-}"

log() { printf '[helm-binary] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "$HELM_VERSION" in
    v3.*) ;;
    *) die "AIRUNTIME_HELM_VERSION must be a Helm v3 version such as v3.22.0 (got '$HELM_VERSION')" ;;
esac

# Fast path: cached, no lock, no Go needed.
if [[ -x "$HELM_BIN" ]]; then
    printf '%s\n' "$HELM_BIN"
    exit 0
fi

find_go() {
    if [[ -n "$GO_BIN" ]]; then
        return
    fi
    if command -v go >/dev/null 2>&1; then
        GO_BIN="$(command -v go)"
    elif [[ -x /usr/local/go/bin/go ]]; then
        GO_BIN=/usr/local/go/bin/go
    else
        die "Go toolchain not found (set GO=/path/to/go)"
    fi
}

setup_go_env() {
    export GOMODCACHE="$CACHE_ROOT/go/mod"
    export GOCACHE="$CACHE_ROOT/go/build"
    export GOFLAGS="-trimpath -buildvcs=false -modcacherw"
    export CGO_ENABLED=0
    # Build with the local toolchain; never try to download another one.
    export GOTOOLCHAIN=local
    mkdir -p "$GOMODCACHE" "$GOCACHE"
}

build_helm() {
    local started work mod k8s minor ldflags
    started=$SECONDS
    work="$HELM_DIR/build"
    rm -rf "$work"
    mkdir -p "$work"

    log "downloading helm.sh/helm/v3@$HELM_VERSION"
    mod="$(cd "$work" && "$GO_BIN" mod download -json "helm.sh/helm/v3@$HELM_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$mod" ]] || die "could not download helm.sh/helm/v3@$HELM_VERSION from the Go module proxy"

    # Kubernetes minor version of the client-go Helm is built with (v0.35.1 -> 35).
    k8s="$(sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*$/\1/p' "$mod" | head -n1)"
    minor="${k8s:-20}"

    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    local p
    for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
    done

    log "building helm $HELM_VERSION (Kubernetes 1.$minor capabilities; slow the first time)"
    (cd "$work" && GOBIN="$work/out" "$GO_BIN" install -ldflags "$ldflags" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") >&2

    mkdir -p "$BIN_DIR"
    # Install atomically: the fast path only checks that the file exists.
    mv -f "$work/out/helm" "$HELM_BIN.tmp"
    mv -f "$HELM_BIN.tmp" "$HELM_BIN"
    rm -rf "$work"
    log "built helm $HELM_VERSION in $((SECONDS - started)) s"
}

main() {
    mkdir -p "$HELM_DIR"
    exec 9>"$HELM_DIR/.lock"
    if ! flock -n 9; then
        log "another build holds $HELM_DIR/.lock; waiting"
        flock 9
    fi
    # Another run may have finished the build while this one waited.
    if [[ ! -x "$HELM_BIN" ]]; then
        find_go
        setup_go_env
        build_helm
    fi
    "$HELM_BIN" version --short >/dev/null 2>&1 || die "$HELM_BIN does not run"
    printf '%s\n' "$HELM_BIN"
}

main "$@"
