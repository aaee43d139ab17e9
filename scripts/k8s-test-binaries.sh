#!/usr/bin/env bash
# Build (once) and cache the binaries of a real Kubernetes control plane for
# the operator's integration tests: kube-apiserver, kube-controller-manager and
# etcd, all in one directory, whose path is printed as the LAST line of stdout.
#
#   bin_dir="$(scripts/k8s-test-binaries.sh | tail -n1)"
#
# Why build from source: no prebuilt Kubernetes binaries can be downloaded
# here, only Go modules from the Go module proxy. k8s.io/kubernetes is a Go
# module, but its go.mod requires its staging modules (k8s.io/api,
# k8s.io/client-go, ...) at v0.0.0 and `replace`s them with ./staging paths,
# which are ignored when it is used as a dependency. So we build from a small
# wrapper module that requires k8s.io/kubernetes vX.Y.Z and replaces each
# staging module with its published v0.Y.Z.
#
# Kubernetes is pinned to 1.30.x because Debian bookworm's etcd is 3.4.x,
# which kube-apiserver 1.31+ no longer supports.
#
# etcd: Debian's etcd-server (/usr/bin/etcd) when present and >= 3.4
# (installed with apt-get when missing and running as root); otherwise, or
# with AIRUNTIME_ETCD_SOURCE=build, etcd is built from the Go module proxy.
#
# Environment:
#   AIRUNTIME_CACHE        cache root (default: $HOME/.cache/airuntime)
#   AIRUNTIME_K8S_VERSION  Kubernetes version (default: 1.30.14)
#   AIRUNTIME_ETCD_VERSION etcd version used when building etcd (default: 3.5.35)
#   AIRUNTIME_ETCD_SOURCE  auto (default) | debian | build
#
# Idempotent: when the cached binaries exist nothing is rebuilt. Concurrent
# runs are serialised with flock. Progress goes to stderr.
set -euo pipefail

K8S_VERSION="${AIRUNTIME_K8S_VERSION:-1.30.14}"
K8S_VERSION="${K8S_VERSION#v}"
ETCD_VERSION="${AIRUNTIME_ETCD_VERSION:-3.5.35}"
ETCD_VERSION="${ETCD_VERSION#v}"
ETCD_SOURCE="${AIRUNTIME_ETCD_SOURCE:-auto}"
CACHE_ROOT="${AIRUNTIME_CACHE:-$HOME/.cache/airuntime}"

K8S_DIR="$CACHE_ROOT/k8s/v$K8S_VERSION"
BIN_DIR="$K8S_DIR/bin"
GO_BIN="${GO:-}"

log() { printf '[k8s-test-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

have_k8s_binaries() {
    [[ -x "$BIN_DIR/kube-apiserver" && -x "$BIN_DIR/kube-controller-manager" ]]
}

have_etcd() {
    # -x follows symlinks, so a dangling link to a removed /usr/bin/etcd fails.
    [[ -x "$BIN_DIR/etcd" ]]
}

# Fast path: everything cached, no lock, no Go needed.
if have_k8s_binaries && have_etcd; then
    printf '%s\n' "$BIN_DIR"
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

# Build kube-apiserver and kube-controller-manager into $BIN_DIR.
build_k8s() {
    local minor patch staging_version work kube_mod started
    IFS=. read -r _ minor patch <<<"$K8S_VERSION"
    staging_version="v0.$minor.$patch"
    started=$SECONDS

    work="$K8S_DIR/build"
    rm -rf "$work"
    mkdir -p "$work"

    log "downloading k8s.io/kubernetes@v$K8S_VERSION go.mod"
    kube_mod="$(cd "$work" && "$GO_BIN" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$kube_mod" ]] || die "could not download k8s.io/kubernetes@v$K8S_VERSION"

    # Every module that k8s.io/kubernetes replaces with a ./staging path.
    local -a staging
    mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*$|\1|p' "$kube_mod" | sort -u)
    ((${#staging[@]} > 0)) || die "no staging modules found in $kube_mod"
    log "replacing ${#staging[@]} staging modules with $staging_version"

    {
        printf 'module airuntime.local/k8s-test-binaries\n\n'
        printf 'go 1.22.0\n\n'
        printf 'require k8s.io/kubernetes v%s\n\n' "$K8S_VERSION"
        printf 'replace (\n'
        local m
        for m in "${staging[@]}"; do
            printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"
        done
        printf ')\n'
    } >"$work/go.mod"

    log "resolving dependencies"
    (cd "$work" && "$GO_BIN" get \
        "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION") >&2

    local ldflags="-s -w"
    local v=k8s.io/component-base/version
    local cv=k8s.io/client-go/pkg/version
    local build_date
    build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    for p in "$v" "$cv"; do
        ldflags+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
    done

    log "building kube-apiserver and kube-controller-manager v$K8S_VERSION (slow the first time)"
    mkdir -p "$work/out"
    (cd "$work" && "$GO_BIN" build -ldflags "$ldflags" -o "$work/out/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager) >&2

    mkdir -p "$BIN_DIR"
    # Install atomically: the fast path only checks that the files exist.
    local b
    for b in kube-apiserver kube-controller-manager; do
        mv -f "$work/out/$b" "$BIN_DIR/$b.tmp"
        mv -f "$BIN_DIR/$b.tmp" "$BIN_DIR/$b"
    done
    rm -rf "$work"
    log "built Kubernetes v$K8S_VERSION in $((SECONDS - started)) s"
}

# Prints the version of an etcd binary (e.g. 3.4.23), or nothing.
etcd_version_of() {
    "$1" --version 2>/dev/null | sed -n 's/^etcd Version: \([0-9.]*\).*$/\1/p' | head -n1
}

# True when version $1 >= 3.4.
etcd_version_ok() {
    local major minor
    IFS=. read -r major minor _ <<<"$1"
    [[ -n "$major" && -n "$minor" ]] || return 1
    ((major > 3 || (major == 3 && minor >= 4)))
}

try_debian_etcd() {
    local etcd=/usr/bin/etcd ver
    if [[ ! -x "$etcd" ]]; then
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "installing Debian etcd-server with apt-get"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2 \
                || { log "apt-get install etcd-server failed"; return 1; }
        else
            log "/usr/bin/etcd missing and not root: cannot apt-get install etcd-server"
            return 1
        fi
    fi
    [[ -x "$etcd" ]] || return 1
    ver="$(etcd_version_of "$etcd")"
    if ! etcd_version_ok "$ver"; then
        log "Debian etcd version '$ver' is older than 3.4"
        return 1
    fi
    mkdir -p "$BIN_DIR"
    ln -sfn "$etcd" "$BIN_DIR/etcd"
    log "using Debian etcd $ver ($etcd)"
}

build_etcd() {
    local work started
    started=$SECONDS
    work="$K8S_DIR/build-etcd"
    rm -rf "$work"
    mkdir -p "$work"
    # etcd's own go.mod replaces its sibling modules with ../ paths too; a
    # wrapper module requiring the server module sidesteps that as well.
    printf 'module airuntime.local/etcd-test-binary\n\ngo 1.22.0\n' >"$work/go.mod"
    log "building etcd v$ETCD_VERSION from the Go module proxy"
    (cd "$work" && "$GO_BIN" get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION") >&2
    (cd "$work" && "$GO_BIN" build -ldflags "-s -w" -o "$work/etcd" go.etcd.io/etcd/server/v3) >&2
    mkdir -p "$BIN_DIR"
    rm -f "$BIN_DIR/etcd"
    mv -f "$work/etcd" "$BIN_DIR/etcd"
    rm -rf "$work"
    log "built etcd v$ETCD_VERSION in $((SECONDS - started)) s"
}

main() {
    mkdir -p "$K8S_DIR"
    exec 9>"$K8S_DIR/.lock"
    if ! flock -n 9; then
        log "another build holds $K8S_DIR/.lock; waiting"
        flock 9
    fi

    local started=$SECONDS
    if ! have_k8s_binaries; then
        find_go
        setup_go_env
        build_k8s
    fi

    if ! have_etcd; then
        case "$ETCD_SOURCE" in
            debian) try_debian_etcd || die "Debian etcd is not usable" ;;
            build) find_go; setup_go_env; build_etcd ;;
            auto) try_debian_etcd || { find_go; setup_go_env; build_etcd; } ;;
            *) die "AIRUNTIME_ETCD_SOURCE must be auto, debian or build (got '$ETCD_SOURCE')" ;;
        esac
    fi

    log "ready in $((SECONDS - started)) s: $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
}

main "$@"
