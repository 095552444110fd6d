#!/usr/bin/env bash
# Build (once) and cache a current Kubernetes release from Go modules: kube-apiserver,
# kube-controller-manager and kubectl of k8s.io/kubernetes VERSION, plus the etcd server that
# release is tested with, all with the machine's Go toolchain; with --node also a real node's
# kube-scheduler, kubelet and kube-proxy (built later, they reuse the Go build cache of the
# first build). See docs/local-cluster.md.
#
# `go install k8s.io/kubernetes/cmd/...@VERSION` is refused: the module's go.mod replaces its
# k8s.io/* staging modules with ./staging paths. So a scratch module requires
# k8s.io/kubernetes VERSION and replaces every staging module with its published v0.Y.Z twin,
# generated from that go.mod's own replace block.
#
# Idempotent: the binaries live in a per-user cache outside the repository, with a stamp of
# the inputs; a run with the stamp in place returns at once. A per-version lock makes
# concurrent runs wait for each other instead of building twice.
#
# Usage: hack/build-kubernetes.sh [--print-bin-dir|--check] [--node|--demo] [VERSION]   (VERSION default below)
#        --check: exit 0 when everything asked for is built, 1 when not; builds nothing, takes no lock
#        --demo:  only what the demo starts (DEMO_BINARIES), unless the whole control plane is built
# Env:   MQBALANCE_CACHE  (default ${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance)
#        MQBALANCE_GO     the go command (default /usr/local/go/bin/go, else go on PATH)
#        MQBALANCE_GO_CACHE  Go module and build caches (default $MQBALANCE_CACHE/go)
set -euo pipefail

# The newest release the Go module proxy serves that builds with Go 1.26.
DEFAULT_VERSION="v1.37.2"
# What the control plane (tests) needs, what only a real node needs, and the part of the control
# plane the demo starts (a first `make demo` compiles 13% fewer packages than the whole of it).
CONTROL_PLANE_BINARIES=(kube-apiserver kube-controller-manager kubectl etcd)
NODE_BINARIES=(kube-scheduler kubelet kube-proxy)
DEMO_BINARIES=(kube-apiserver kubectl etcd)

# shellcheck source=hack/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"

print_only=0
check_only=0
node=0
demo=0
VERSION=""
for arg in "$@"; do
  case "$arg" in
    --print-bin-dir) print_only=1 ;;
    --check) check_only=1 ;;
    --node) node=1 ;;
    --demo) demo=1 ;;
    v[0-9]*.*.*) VERSION="$arg" ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg'; give a release such as $DEFAULT_VERSION" ;;
  esac
done
VERSION="${VERSION:-$DEFAULT_VERSION}"
[[ "$VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "VERSION must look like v1.Y.Z, got '$VERSION'"
MINOR="${BASH_REMATCH[1]}"
STAGING_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
((MINOR >= 34)) || die "$VERSION is older than 1.34; use hack/build-control-plane.sh --k8s 1.20 for the old one"

K8S_DIR="$CACHE/k8s-$VERSION"
K8S_BIN="$K8S_DIR/bin"
K8S_STAMP="$K8S_DIR/.stamp"
NODE_BIN_STAMP="$K8S_DIR/.stamp-node-bin"
DEMO_STAMP="$K8S_DIR/.stamp-demo"
GO_CACHE="${MQBALANCE_GO_CACHE:-$CACHE/go}"
# Bumping the recipe invalidates the cache.
RECIPE="kubernetes=$VERSION staging=$STAGING_VERSION from=go-modules cgo=0"
STAMP_TEXT="$RECIPE what=${CONTROL_PLANE_BINARIES[*]}"
NODE_BIN_STAMP_TEXT="$RECIPE what=${NODE_BINARIES[*]}"
DEMO_STAMP_TEXT="$RECIPE what=${DEMO_BINARIES[*]}"

if ((print_only)); then
  echo "$K8S_BIN"
  exit 0
fi

set_ready() {  # set_ready STAMP TEXT BINARY...: the stamp says TEXT and every binary is there
  local stamp="$1" text="$2" b
  shift 2
  [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$text" ]] &&
    for b in "$@"; do [[ -x "$K8S_BIN/$b" ]] || return 1; done
}

control_plane_ready() { set_ready "$K8S_STAMP" "$STAMP_TEXT" "${CONTROL_PLANE_BINARIES[@]}"; }
node_binaries_ready() { set_ready "$NODE_BIN_STAMP" "$NODE_BIN_STAMP_TEXT" "${NODE_BINARIES[@]}"; }
demo_ready() { control_plane_ready || set_ready "$DEMO_STAMP" "$DEMO_STAMP_TEXT" "${DEMO_BINARIES[@]}"; }

if ((check_only)); then
  if ((demo)); then demo_ready; else control_plane_ready; fi && { ((!node)) || node_binaries_ready; }
  exit
fi

version_ge() {  # version_ge A B: A >= B for dotted versions (1.26.8 >= 1.26.0)
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

go_line() {  # go_line GOMOD KEYWORD: the value of the first 'KEYWORD x' line
  awk -v k="$2" '$1 == k { print $2; exit }' "$1"
}

write_scratch_module() {  # write_scratch_module DIR UPSTREAM_GOMOD
  local dir="$1" upstream="$2" go_version
  go_version="$(go_line "$upstream" go)"
  {
    echo "module mqbalance.invalid/kubernetes-build"
    echo
    echo "go $go_version"
    # The main module's godebug settings decide runtime defaults: keep upstream's.
    grep -E '^godebug ' "$upstream" || true
    echo
    echo "require k8s.io/kubernetes $VERSION"
    echo
    echo "replace ("
    # Upstream: 'k8s.io/api => ./staging/src/k8s.io/api'; here: the published module.
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/k8s\.io/[a-z0-9.-]*[[:space:]]*$#\t\1 => \1 '"$STAGING_VERSION"'#p' \
      "$upstream"
    echo ")"
  } >"$dir/go.mod"
  grep -q "k8s.io/apiserver => k8s.io/apiserver $STAGING_VERSION" "$dir/go.mod" ||
    die "could not read the staging replacements from $upstream"

  # Imports that make `go mod tidy` record every module the binaries need.
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    local b
    for b in "${CONTROL_PLANE_BINARIES[@]}" "${NODE_BINARIES[@]}"; do
      [[ "$b" == etcd ]] || echo "	_ \"k8s.io/kubernetes/cmd/$b\""
    done
    echo "	_ \"go.etcd.io/etcd/server/v3/etcdmain\""
    echo ")"
  } >"$dir/tools.go"

  # etcd: the server module's own entry point, at the version this release requires.
  mkdir -p "$dir/etcd"
  cat >"$dir/etcd/main.go" <<'EOF'
// Command etcd is the etcd server, as go.etcd.io/etcd/v3's main.go starts it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
}

build() {  # build BINARY...: those of CONTROL_PLANE_BINARIES and NODE_BINARIES given
  local go work upstream need have start ldflags date
  start=$SECONDS
  go="$(find_go)"
  mkdir -p "$CACHE" "$GO_CACHE"
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
  export GOMODCACHE="$GO_CACHE/mod" GOCACHE="$GO_CACHE/build"
  work="$(mktemp -d "$CACHE/build-$VERSION.XXXXXX")"
  trap 'rm -rf "$work"' EXIT

  log "resolving k8s.io/kubernetes@$VERSION through the Go module proxy"
  upstream="$(cd "$work" && "$go" mod download -json "k8s.io/kubernetes@$VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$upstream" ]] || die "the Go module proxy did not serve k8s.io/kubernetes@$VERSION"
  need="$(go_line "$upstream" go)"
  have="$("$go" env GOVERSION)"
  have="${have#go}"
  version_ge "$have" "$need" ||
    die "Kubernetes $VERSION needs Go >= $need, $go is $have: install a newer Go, set MQBALANCE_GO, or pick an older release"
  date="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$(dirname "$upstream")/$VERSION.info" 2>/dev/null || true)"

  write_scratch_module "$work" "$upstream"
  log "fetching modules (go mod tidy)"
  (cd "$work" && "$go" mod tidy >"$work/tidy.log" 2>&1) ||
    { tail -n 40 "$work/tidy.log" >&2; die "go mod tidy failed for kubernetes $VERSION"; }

  # What upstream's hack/lib/version.sh stamps, so --version and /version say the release.
  ldflags="-s -w"
  local pkg key value
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    for key in "gitVersion=$VERSION" "gitMajor=1" "gitMinor=$MINOR" "gitTreeState=clean" \
      "buildDate=${date:-1970-01-01T00:00:00Z}"; do
      value="${key#*=}"
      ldflags+=" -X '$pkg.${key%%=*}=$value'"
    done
  done

  local targets=() etcd=() b total
  for b in "$@"; do
    if [[ "$b" == etcd ]]; then etcd=(./etcd); else targets+=("k8s.io/kubernetes/cmd/$b"); fi
  done
  # Upstream's release tags: selinux, no test hooks, no x/net/trace in gRPC.
  local tags=selinux,notest,grpcnotrace
  total="$(cd "$work" && "$go" list -tags "$tags" -deps "${targets[@]}" "${etcd[@]}" 2>/dev/null | wc -l)"
  log "building $* $VERSION with $("$go" env GOVERSION): $total packages, those not in the Go build cache compiled (about 9 minutes cold on an idle 2-core machine)"
  mkdir -p "$work/out"
  (
    cd "$work"
    # -v names each package as it is compiled: the progress lines below count them.
    "$go" build -v -trimpath -tags "$tags" -ldflags "$ldflags" -o "$work/out/" "${targets[@]}" &&
      if ((${#etcd[@]})); then "$go" build -v -trimpath -ldflags "-s -w" -o "$work/out/etcd" ./etcd; fi
  ) >"$work/build.log" 2>&1 &
  local pid=$! rc=0 next=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)); then
      log "  $((SECONDS - start)) s: $(grep -c '^[a-z]' "$work/build.log" || true) packages compiled so far"
      next=$((SECONDS + 30))
    fi
  done
  wait "$pid" || rc=$?
  ((rc == 0)) || { tail -n 40 "$work/build.log" >&2; die "kubernetes $VERSION build failed"; }

  if [[ -x "$work/out/kube-apiserver" ]]; then
    "$work/out/kube-apiserver" --version | grep -qx "Kubernetes $VERSION" ||
      die "kube-apiserver reports '$("$work/out/kube-apiserver" --version 2>&1)', expected Kubernetes $VERSION"
  fi
  mkdir -p "$K8S_BIN"
  for b in "$@"; do
    install -m 0755 "$work/out/$b" "$K8S_BIN/$b"
  done
  if printf '%s\n' "$@" | grep -qx kube-controller-manager; then
    echo "$STAMP_TEXT" >"$K8S_STAMP"
  elif printf '%s\n' "$@" | grep -qx kube-apiserver; then
    echo "$DEMO_STAMP_TEXT" >"$DEMO_STAMP"
  fi
  if printf '%s\n' "$@" | grep -qx kubelet; then echo "$NODE_BIN_STAMP_TEXT" >"$NODE_BIN_STAMP"; fi
  rm -rf "$work"
  trap - EXIT
  log "built $* $VERSION in $((SECONDS - start)) s"
}

main() {
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.build-k8s-$VERSION.lock"
  flock 8
  local want=()
  if ((demo)) && demo_ready; then
    log "kubernetes $VERSION: what the demo starts is already built"
  elif control_plane_ready; then
    log "kubernetes $VERSION control plane already built"
  elif ((demo)); then
    want+=("${DEMO_BINARIES[@]}")
  else
    want+=("${CONTROL_PLANE_BINARIES[@]}")
  fi
  if ((node)); then
    if node_binaries_ready; then
      log "kubernetes $VERSION node binaries already built"
    else
      want+=("${NODE_BINARIES[@]}")
    fi
  fi
  # One go build for everything missing: the packages they share compile once.
  ((${#want[@]} == 0)) || build "${want[@]}"
  echo "$K8S_BIN"
}

main
