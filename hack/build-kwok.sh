#!/usr/bin/env bash
# Build (once) and cache kwok (sigs.k8s.io/kwok, "Kubernetes WithOut Kubelet"), the controller
# that acts out thousands of fake nodes and their pods against an API server, from Go modules
# with the machine's Go: `go install sigs.k8s.io/kwok/cmd/kwok@VERSION` through the Go module
# proxy, into the per-user cache beside the control plane, with the release's own "fast" Stages
# (node-initialize, pod-ready, pod-delete from its kustomize/stage/) in stages.yaml beside it: the
# kwok binary plays no Stage it is not given. bench/bench_fleet.py and harness/kube/kwok.py run it;
# see docs/scale.md.
#
# Idempotent: the binary lives in a per-user cache outside the repository with a stamp of the
# inputs; a run with the stamp in place returns at once. A lock makes concurrent runs wait for
# each other instead of building twice.
#
# Usage: hack/build-kwok.sh [--print-bin-dir|--check] [VERSION]   (VERSION default below)
#        --check: exit 0 when kwok is built, 1 when not; builds nothing, takes no lock
# Env:   MQBALANCE_CACHE  (default ${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance)
#        MQBALANCE_GO     the go command (default /usr/local/go/bin/go, else go on PATH)
#        MQBALANCE_GO_CACHE  Go module and build caches (default $MQBALANCE_CACHE/go, shared
#                         with hack/build-kubernetes.sh: the k8s.io modules are fetched once)
set -euo pipefail

# The newest kwok release the Go module proxy serves; its go.mod asks for Go 1.26.
DEFAULT_VERSION="v0.8.0"

# shellcheck source=hack/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"

print_only=0
check_only=0
VERSION=""
for arg in "$@"; do
  case "$arg" in
    --print-bin-dir) print_only=1 ;;
    --check) check_only=1 ;;
    v[0-9]*.*.*) VERSION="$arg" ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg'; give a kwok release such as $DEFAULT_VERSION" ;;
  esac
done
VERSION="${VERSION:-$DEFAULT_VERSION}"
[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "VERSION must look like v0.Y.Z, got '$VERSION'"

KWOK_DIR="$CACHE/kwok-$VERSION"
KWOK_BIN="$KWOK_DIR/bin"
KWOK_STAMP="$KWOK_DIR/.stamp"
GO_CACHE="${MQBALANCE_GO_CACHE:-$CACHE/go}"
# Bumping the recipe invalidates the cache.
STAMP_TEXT="kwok=$VERSION from=go-modules cgo=0 what=kwok,stages.yaml(fast)"
STAGES=(node/fast/node-initialize pod/fast/pod-ready pod/fast/pod-delete)

if ((print_only)); then
  echo "$KWOK_BIN"
  exit 0
fi

ready() {
  [[ -f "$KWOK_STAMP" ]] && [[ "$(cat "$KWOK_STAMP")" == "$STAMP_TEXT" ]] && [[ -x "$KWOK_BIN/kwok" ]] &&
    [[ -f "$KWOK_DIR/stages.yaml" ]]
}

if ((check_only)); then
  ready
  exit
fi

build() {
  local go start=$SECONDS work
  go="$(find_go)"
  mkdir -p "$CACHE" "$GO_CACHE"
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
  export GOMODCACHE="$GO_CACHE/mod" GOCACHE="$GO_CACHE/build"
  work="$(mktemp -d "$CACHE/build-kwok-$VERSION.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  log "building sigs.k8s.io/kwok/cmd/kwok@$VERSION with $("$go" env GOVERSION) (a few minutes cold on 2 cores)"
  # What kwok's own Makefile stamps, so `kwok --version` says the release.
  local ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${VERSION#v}"
  GOBIN="$work" "$go" install -trimpath -ldflags "$ldflags" "sigs.k8s.io/kwok/cmd/kwok@$VERSION" \
    >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; die "kwok $VERSION build failed"; }
  local src stage
  src="$(cd "$work" && "$go" mod download -json "sigs.k8s.io/kwok@$VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -d "$src/kustomize/stage" ]] || die "kwok $VERSION's module has no kustomize/stage in the module cache"
  for stage in "${STAGES[@]}"; do
    [[ -f "$src/kustomize/stage/$stage.yaml" ]] || die "kwok $VERSION has no Stage $stage"
    printf -- '---\n# kwok %s kustomize/stage/%s.yaml\n' "$VERSION" "$stage"
    cat "$src/kustomize/stage/$stage.yaml"
  done >"$work/stages.yaml"
  mkdir -p "$KWOK_BIN"
  install -m 0755 "$work/kwok" "$KWOK_BIN/kwok"
  install -m 0644 "$work/stages.yaml" "$KWOK_DIR/stages.yaml"
  echo "$STAMP_TEXT" >"$KWOK_STAMP"
  rm -rf "$work"
  trap - EXIT
  log "built kwok $VERSION in $((SECONDS - start)) s"
}

mkdir -p "$CACHE"
exec 8>"$CACHE/.build-kwok-$VERSION.lock"
flock 8
if ready; then
  log "kwok $VERSION already built"
else
  build
fi
echo "$KWOK_BIN"
