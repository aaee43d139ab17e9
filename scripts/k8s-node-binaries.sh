#!/usr/bin/env bash
# Build (once) and cache what a real Kubernetes node needs on top of the control plane
# of scripts/k8s-test-binaries.sh: kubelet, kube-scheduler and kubectl (Kubernetes
# v1.30.14, like the API server), kind (sigs.k8s.io/kind, for the kind test's fixture)
# and a static `pause` binary (the pod sandbox's process; no image can be pulled here,
# so scripts/image-build.sh turns it into the sandbox image). Prints the directory
# holding them as the LAST line of stdout.
#
#   node_bin="$(scripts/k8s-node-binaries.sh | tail -n1)"
#
# Same approach as scripts/k8s-test-binaries.sh: k8s.io/kubernetes is built from a
# wrapper module that replaces its ./staging modules with their published v0.Y.Z;
# kind's go.mod has no replace directives and installs directly.
#
# Cached by content hash: the directory is named after the sha256 of this script (which
# holds every version and flag), so a changed recipe builds anew and an unchanged one
# costs nothing. Go's module and build caches are shared with the other build scripts.
#
# Environment:
#   AIRUNTIME_CACHE  cache root (default: $HOME/.cache/airuntime)
#   GO               Go binary (default: `go` on PATH, else /usr/local/go/bin/go)
set -euo pipefail

K8S_VERSION=1.30.14
KIND_VERSION=v0.30.0
CACHE_ROOT="${AIRUNTIME_CACHE:-$HOME/.cache/airuntime}"
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
HASH="$(sha256sum "$SELF" | cut -c1-16)"
NODE_DIR="$CACHE_ROOT/k8s-node/$HASH"
BIN_DIR="$NODE_DIR/bin"
BINARIES=(kubelet kube-scheduler kubectl kind pause)
GO_BIN="${GO:-}"

log() { printf '[k8s-node-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

have_all() {
    local b
    for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

# Fast path: cached, no lock, no Go needed.
if have_all; then
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

find_go() {
    [[ -n "$GO_BIN" ]] && return
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
    export GOTOOLCHAIN=local
    mkdir -p "$GOMODCACHE" "$GOCACHE"
}

build_kubernetes() {
    local minor patch staging_version work kube_mod m b
    IFS=. read -r _ minor patch <<<"$K8S_VERSION"
    staging_version="v0.$minor.$patch"
    work="$NODE_DIR/build-k8s"
    rm -rf "$work" && mkdir -p "$work/out"
    kube_mod="$(cd "$work" && "$GO_BIN" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$kube_mod" ]] || die "could not download k8s.io/kubernetes@v$K8S_VERSION"
    local -a staging
    mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*$|\1|p' "$kube_mod" | sort -u)
    ((${#staging[@]} > 0)) || die "no staging modules found in $kube_mod"
    {
        printf 'module airuntime.local/k8s-node-binaries\n\ngo 1.22.0\n\n'
        printf 'require k8s.io/kubernetes v%s\n\nreplace (\n' "$K8S_VERSION"
        for m in "${staging[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"; done
        printf ')\n'
    } >"$work/go.mod"
    (cd "$work" && "$GO_BIN" get \
        "k8s.io/kubernetes/cmd/kubelet@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kubectl@v$K8S_VERSION") >&2
    local ldflags="-s -w" build_date p
    build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
    done
    log "building kubelet, kube-scheduler and kubectl v$K8S_VERSION (slow the first time)"
    (cd "$work" && "$GO_BIN" build -ldflags "$ldflags" -o "$work/out/" \
        k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kubectl) >&2
    for b in kubelet kube-scheduler kubectl; do mv -f "$work/out/$b" "$BIN_DIR/$b"; done
    rm -rf "$work"
}

build_kind() {
    local work="$NODE_DIR/build-kind"
    rm -rf "$work" && mkdir -p "$work"
    log "building kind $KIND_VERSION"
    (cd "$work" && GOBIN="$work" "$GO_BIN" install -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION") >&2
    mv -f "$work/kind" "$BIN_DIR/kind"
    rm -rf "$work"
}

# The pod sandbox's process: sleeps until SIGINT/SIGTERM, reaps zombies (what
# Kubernetes' build/pause/linux/pause.c does), statically linked.
build_pause() {
    local work="$NODE_DIR/build-pause"
    rm -rf "$work" && mkdir -p "$work"
    cat >"$work/main.go" <<'EOF'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("Warning: pause should be the first process\n")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		switch s {
		case syscall.SIGCHLD:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		default:
			os.Exit(0)
		}
	}
}
EOF
    printf 'module airuntime.local/pause\n\ngo 1.22.0\n' >"$work/go.mod"
    (cd "$work" && "$GO_BIN" build -ldflags "-s -w" -o "$work/pause" .) >&2
    mv -f "$work/pause" "$BIN_DIR/pause"
    rm -rf "$work"
}

main() {
    mkdir -p "$BIN_DIR"
    exec 9>"$NODE_DIR/.lock"
    if ! flock -n 9; then
        log "another build holds $NODE_DIR/.lock; waiting"
        flock 9
    fi
    local started=$SECONDS
    if ! have_all; then
        find_go
        setup_go_env
        [[ -x "$BIN_DIR/pause" ]] || build_pause
        [[ -x "$BIN_DIR/kind" ]] || build_kind
        [[ -x "$BIN_DIR/kubelet" && -x "$BIN_DIR/kube-scheduler" && -x "$BIN_DIR/kubectl" ]] \
            || build_kubernetes
    fi
    have_all || die "missing binaries in $BIN_DIR"
    log "ready in $((SECONDS - started)) s: $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
}

main "$@"
