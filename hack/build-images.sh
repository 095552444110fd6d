#!/usr/bin/env bash
# Build (once per content) the container images the real node runs, without any registry:
#
#   localhost/mqbalance-base:<key>   Debian bookworm minbase + python3, made by mmdebstrap from
#                                    Debian's packages and imported with podman
#   localhost/mqbalance:<key>        the repository's Dockerfile on that base (podman build)
#   localhost/mqbalance-pause:<key>  the pod sandbox: the static `pause` that
#                                    `hack/build-control-plane.sh --node` builds (buildah)
#   localhost/mqbalance-replay:<key> the replay on Spark on Kubernetes: pipeline/Dockerfile on a
#                                    second mmdebstrap base with Java 17 and tini, PySpark, pandas and
#                                    pyarrow of the versions in .venv (its spark-submit must match)
#
# Each <key> is a content hash of what goes into the image (the base: its recipe; the
# application image: the base's id, the Dockerfile and every file it copies; pause: the
# binary), so unchanged sources never rebuild. Each image is also saved as an OCI archive
# that the real node imports into its containerd (namespace k8s.io); images.json lists them.
# Both entry points are started once in the built image (read-only root, non-root user).
#
# podman and buildah keep their storage under the cache, not in /var/lib/containers. See
# docs/real-node.md.
#
# Usage: hack/build-images.sh [--print-manifest | --release REF FILE | --release-from TREE REF FILE]
#        --release: also tag the application image REF and save it as the OCI archive FILE;
#        --release-from: only build TREE's Dockerfile (another release's source tree) on the same base as
#        REF, save it as FILE and drop the tag; the images above and images.json stay as they are.
# Env:   MQBALANCE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance)
#        MQBALANCE_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt): the CA bundle RUN
#        steps trust (pip reaches PyPI through it); mounted for the build only, never copied
#        into an image.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$REPO/hack/lib.sh"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
BASE_RECIPE=1  # bump when the base's recipe below changes in a way its inputs do not show
REPLAY_BASE_PACKAGES=python3,python3-venv,ca-certificates,openjdk-17-jre-headless,tini
# The Python whose PySpark, pandas and pyarrow versions the replay image installs.
REPLAY_PYTHON="${MQBALANCE_REPLAY_PYTHON:-$REPO/.venv/bin/python}"

OUT="$CACHE/images"
MANIFEST="$OUT/images.json"
CA_BUNDLE="${MQBALANCE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

APT_PACKAGES=(podman buildah mmdebstrap uidmap fuse-overlayfs)

RELEASE_REF="" RELEASE_FILE="" RELEASE_TREE=""
if [[ "${1:-}" == "--print-manifest" ]]; then
  echo "$MANIFEST"
  exit 0
elif [[ "${1:-}" == "--release" && $# -eq 3 ]]; then
  # --release REF FILE: also tag the application image REF and save it as an OCI archive FILE
  RELEASE_REF="$2" RELEASE_FILE="$3"
elif [[ "${1:-}" == "--release-from" && $# -eq 4 ]]; then
  RELEASE_TREE="$(cd "$2" && pwd)" RELEASE_REF="$3" RELEASE_FILE="$4"
elif [[ $# -gt 0 ]]; then
  die "unknown argument: $1 (usage: $0 [--print-manifest | --release REF FILE | --release-from TREE REF FILE])"
fi

configure_podman() {
  # Private storage, and default ulimits the kernel lets runc set: without CAP_SYS_RESOURCE
  # podman's defaults (nofile 1048576) fail with "error setting rlimit type 7".
  mkdir -p "$OUT/podman"
  local nofile nproc
  nofile="$(ulimit -Hn)"; [[ "$nofile" == unlimited ]] && nofile=1048576
  nproc="$(ulimit -Hu)"; [[ "$nproc" == unlimited ]] && nproc=32768
  ((nofile > 20000)) && nofile=20000
  ((nproc > 32768)) && nproc=32768
  cat >"$OUT/podman/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$OUT/podman/storage"
runroot = "/run/mqbalance-podman"
EOF
  cat >"$OUT/podman/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
EOF
  export CONTAINERS_STORAGE_CONF="$OUT/podman/storage.conf" CONTAINERS_CONF="$OUT/podman/containers.conf"
}

sha() { sha256sum | cut -c1-64; }

mirror_lines() {  # the Debian archives apt already uses, as one-line sources for mmdebstrap
  # shellcheck disable=SC2016  # $(FIELD) is apt's own placeholder syntax
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
    'Created-By: Packages' 'Origin: Debian' 'Component: main' | sort -u |
    while read -r uri release component; do
      [[ "$release" == "$SUITE" || "$release" == "$SUITE"-* ]] && echo "deb ${uri} ${release} ${component}"
    done
}

image_exists() { podman image exists "$1" 2>/dev/null; }

save_archive() {  # save_archive REF FILE: an OCI archive of REF, written atomically
  [[ -s "$2" ]] && return
  podman save --quiet --format oci-archive -o "$2.tmp" "$1" >/dev/null
  mv "$2.tmp" "$2"
}

build_base() {  # build_base [NAME PACKAGES] -> prints the base image reference
  local name="${1:-mqbalance-base}" packages="${2:-$BASE_PACKAGES}" mirrors key ref
  mirrors="$(mirror_lines)"
  [[ -n "$mirrors" ]] || die "apt knows no Debian $SUITE archive; run apt-get update"
  key="$(printf '%s\n' "$SUITE" "$packages" "$BASE_RECIPE" "$mirrors" | sha | cut -c1-12)"
  ref="localhost/$name:$key"
  if image_exists "$ref"; then
    log "base image $ref present"
    echo "$ref"
    return
  fi
  local start=$SECONDS tar="$OUT/base-$key.tar"
  log "making the base image $ref with mmdebstrap ($SUITE minbase + $packages)"
  local args=() hooks=()
  while read -r line; do args+=("$line"); done <<<"$mirrors"
  # OpenJDK's postinst links its man pages with update-alternatives, which fails where
  # /usr/share/man/man1 is missing (it is left out below): the directory is made first.
  [[ "$packages" == *openjdk* ]] && hooks+=(--essential-hook='mkdir -p "$1/usr/share/man/man1"')
  # Documentation and translations are dropped: nothing in the image reads them.
  mmdebstrap --quiet --variant=minbase --include="$packages" "${hooks[@]}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    "$SUITE" "$tar" "${args[@]}" >&2 || die "mmdebstrap failed"
  # An imported tarball has no config: give it the PATH and command a Debian image has.
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' "$tar" "$ref" >/dev/null || die "podman import of $tar failed"
  rm -f "$tar"
  log "base image built in $((SECONDS - start)) s"
  echo "$ref"
}

smoke_test() {  # both entry points start: non-root, read-only root, no network
  local ref="$1" cmd
  for cmd in operator sidecar; do
    podman run --rm --read-only --network none --user 10001:10001 "$ref" "$cmd" --help >/dev/null ||
      die "'mqbalance $cmd --help' did not run in $ref"
  done
}

app_inputs() {  # every file the Dockerfile copies, plus the Dockerfile and .dockerignore
  (
    cd "$REPO"
    printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md
    find mqbalance -name __pycache__ -prune -o -type f ! -name '*.pyc' -print
  ) | LC_ALL=C sort
}

build_app() {  # build_app BASE_REF -> prints the image reference
  local base="$1" base_id key ref
  base_id="$(podman image inspect --format '{{.Id}}' "$base")"
  key="$(
    {
      echo "base=$base_id"
      app_inputs | while read -r f; do echo "$f $(sha <"$REPO/$f")"; done
    } | sha | cut -c1-12
  )"
  ref="localhost/mqbalance:$key"
  if image_exists "$ref"; then
    log "application image $ref present (sources unchanged)"
    echo "$ref"
    return
  fi
  [[ -r "$CA_BUNDLE" ]] || die "no CA bundle at $CA_BUNDLE (set MQBALANCE_CA_BUNDLE)"
  local start=$SECONDS
  log "building $ref from the Dockerfile on $base"
  # Host network for RUN steps: no bridge, no NAT rules, nothing to clean up afterwards.
  podman build --quiet --network host --pull=never \
    --build-arg "PYTHON_IMAGE=$base" \
    --volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" \
    --tag "$ref" "$REPO" >/dev/null || die "podman build failed"
  smoke_test "$ref"
  log "application image built in $((SECONDS - start)) s; both entry points start in it"
  echo "$ref"
}

replay_versions() {  # "pyspark pandas pyarrow" versions of $REPLAY_PYTHON, or nothing
  [[ -x "$REPLAY_PYTHON" ]] || return 0
  "$REPLAY_PYTHON" -c 'import importlib.metadata as m
print(*(m.version(p) for p in ("pyspark", "pandas", "pyarrow")))' 2>/dev/null || true
}

replay_smoke_test() {  # the replay runs in the image: Java, spark-submit, the single-process replay
  local ref="$1"
  podman run --rm --network none --user 185 "$ref" bash -c '
    java -version 2>&1 | grep -q "version \"17" && spark-submit --version >/dev/null 2>&1 &&
    mqbalance replay --synthetic --groups 2 --events-per-group 3 --single-process --out /tmp/r >/dev/null 2>&1 &&
    test -s /tmp/r/summary.json' || die "the replay does not run in $ref"
}

replay_deps_ref() {  # replay_deps_ref BASE_REF PYSPARK PANDAS PYARROW: the dependencies' stage
  echo "localhost/mqbalance-replay-deps:$(echo "$(podman image inspect --format '{{.Id}}' "$1") $2 $3 $4" | sha | cut -c1-12)"
}

build_replay() {  # build_replay BASE_REF PYSPARK PANDAS PYARROW -> prints the image reference
  local base="$1" pyspark="$2" pandas="$3" pyarrow="$4" base_id key ref ctx deps
  base_id="$(podman image inspect --format '{{.Id}}' "$base")"
  deps="$(replay_deps_ref "$@")"
  key="$(
    {
      echo "base=$base_id pyspark=$pyspark pandas=$pandas pyarrow=$pyarrow"
      for f in pipeline/Dockerfile pipeline/spark-entrypoint.sh; do echo "$f $(sha <"$REPO/$f")"; done
      app_inputs | grep -v -x -e Dockerfile -e .dockerignore | while read -r f; do echo "$f $(sha <"$REPO/$f")"; done
    } | sha | cut -c1-12
  )"
  ref="localhost/mqbalance-replay:$key"
  if image_exists "$ref"; then
    log "replay image $ref present (sources unchanged)"
    echo "$ref"
    return
  fi
  [[ -r "$CA_BUNDLE" ]] || die "no CA bundle at $CA_BUNDLE (set MQBALANCE_CA_BUNDLE)"
  local start=$SECONDS
  log "building $ref from pipeline/Dockerfile on $base (PySpark $pyspark)"
  # A context of exactly what the image takes; the repository's .dockerignore is the product image's.
  ctx="$(mktemp -d)"
  cp "$REPO/pipeline/Dockerfile" "$REPO/pyproject.toml" "$REPO/README.md" "$ctx/"
  install -m 0755 "$REPO/pipeline/spark-entrypoint.sh" "$ctx/spark-entrypoint.sh"
  (cd "$REPO" && find mqbalance -name __pycache__ -prune -o -type f ! -name '*.pyc' -print0 |
    tar --null -T - -cf -) | tar -xf - -C "$ctx"
  local args=(--quiet --layers --network host --pull=never
    --build-arg "BASE_IMAGE=$base" --build-arg "PYSPARK_VERSION=$pyspark"
    --build-arg "PANDAS_VERSION=$pandas" --build-arg "PYARROW_VERSION=$pyarrow"
    --volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
  # The dependencies' stage, tagged so that prune keeps its layers: a change to mqbalance/ then
  # rebuilds only the last stage (podman's layer cache), not PySpark's download.
  podman build "${args[@]}" --target deps --tag "$deps" "$ctx" >/dev/null &&
    podman build "${args[@]}" --tag "$ref" "$ctx" >/dev/null ||
    { rm -rf "$ctx"; die "podman build of the replay image failed"; }
  rm -rf "$ctx"
  replay_smoke_test "$ref"
  log "replay image built in $((SECONDS - start)) s; the replay runs in it"
  echo "$ref"
}

build_pause() {  # prints the image reference
  local bin key ref c
  bin="$(bash "$REPO/hack/build-control-plane.sh" --print-bin-dir)/pause"
  [[ -x "$bin" ]] || die "no pause binary at $bin: run hack/build-control-plane.sh --node"
  key="$(sha <"$bin" | cut -c1-12)"
  ref="localhost/mqbalance-pause:$key"
  if image_exists "$ref"; then
    log "pause image $ref present"
    echo "$ref"
    return
  fi
  log "building $ref"
  c="$(buildah from scratch)"
  buildah copy --quiet "$c" "$bin" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --quiet "$c" "$ref" >/dev/null
  buildah rm "$c" >/dev/null
  echo "$ref"
}

prune() {  # prune REF... ARCHIVE...: keep only these; older tags and archives would pile up
  local keep=" $* " ref f
  for ref in $(podman images --format '{{.Repository}}:{{.Tag}}' |
    grep -E '^localhost/mqbalance(-base|-pause|-replay|-replay-base|-replay-deps)?:' || true); do
    [[ "$keep" == *" $ref "* ]] || podman rmi --force "$ref" >/dev/null 2>&1 || true
  done
  for f in "$OUT"/*.oci.tar; do
    [[ -e "$f" && "$keep" != *" $f "* ]] && rm -f "$f"
  done
  return 0
}

archive_of() { echo "$OUT/$(basename "${1//:/_}").oci.tar"; }

build_tree() {  # build_tree BASE_REF: RELEASE_TREE's image as RELEASE_REF, saved as RELEASE_FILE, untagged
  local base="$1" start=$SECONDS
  [[ -r "$CA_BUNDLE" ]] || die "no CA bundle at $CA_BUNDLE (set MQBALANCE_CA_BUNDLE)"
  log "building $RELEASE_REF from $RELEASE_TREE on $base"
  podman build --quiet --network host --pull=never \
    --build-arg "PYTHON_IMAGE=$base" \
    --volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" \
    --tag "$RELEASE_REF" "$RELEASE_TREE" >/dev/null || die "podman build of $RELEASE_TREE failed"
  smoke_test "$RELEASE_REF"
  rm -f "$RELEASE_FILE"
  save_archive "$RELEASE_REF" "$RELEASE_FILE"
  # The archive is what is kept: an image of another tree would only pile up in the storage.
  podman rmi --force "$RELEASE_REF" >/dev/null 2>&1 || true
  log "$RELEASE_REF built in $((SECONDS - start)) s, saved as $RELEASE_FILE"
}

main() {
  mkdir -p "$OUT"
  exec 9>"$OUT/.build.lock"
  flock 9
  apt_install_missing "${APT_PACKAGES[@]}"
  configure_podman
  if [[ -n "$RELEASE_TREE" ]]; then
    build_tree "$(build_base)"
    return
  fi
  local start=$SECONDS base app pause
  base="$(build_base)"
  app="$(build_app "$base")"
  pause="$(build_pause)"
  local app_tar pause_tar
  app_tar="$(archive_of "$app")"
  pause_tar="$(archive_of "$pause")"
  save_archive "$app" "$app_tar"
  save_archive "$pause" "$pause_tar"
  # The replay image needs the versions of the .venv's PySpark (make venv), whose spark-submit
  # submits to it; without them it is left out and the manifest says nothing of it.
  local versions replay_base="" replay_deps="" replay="" replay_tar="" replay_json=""
  versions="$(replay_versions)"
  if [[ -n "$versions" ]]; then
    replay_base="$(build_base mqbalance-replay-base "$REPLAY_BASE_PACKAGES")"
    # shellcheck disable=SC2086  # three words: the versions
    replay="$(build_replay "$replay_base" $versions)"
    # shellcheck disable=SC2086
    replay_deps="$(replay_deps_ref "$replay_base" $versions)"
    replay_tar="$(archive_of "$replay")"
    save_archive "$replay" "$replay_tar"
    replay_json=",
  \"replay\": {\"image\": \"$replay\", \"archive\": \"$replay_tar\", \"pyspark\": \"${versions%% *}\"}"
  else
    log "no PySpark at $REPLAY_PYTHON (make venv): the replay image is not built"
  fi
  # shellcheck disable=SC2086  # the replay's words vanish when it is not built
  prune "$base" "$app" "$pause" "$app_tar" "$pause_tar" $replay_base $replay_deps $replay $replay_tar
  cat >"$MANIFEST.tmp" <<EOF
{
  "mqbalance": {"image": "$app", "archive": "$app_tar"},
  "pause": {"image": "$pause", "archive": "$pause_tar"},
  "base": {"image": "$base"}$replay_json
}
EOF
  mv "$MANIFEST.tmp" "$MANIFEST"
  log "images ready in $((SECONDS - start)) s: $app, $pause${replay:+, $replay}"
  if [[ -n "$RELEASE_REF" ]]; then
    podman tag "$app" "$RELEASE_REF"
    rm -f "$RELEASE_FILE"
    save_archive "$RELEASE_REF" "$RELEASE_FILE"
    log "$RELEASE_REF saved as $RELEASE_FILE"
  fi
  echo "$MANIFEST"
}

main "$@"
