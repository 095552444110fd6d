#!/usr/bin/env bash
# Writes the release artifacts of the project's one version (pyproject.toml) into dist/:
#   mqbalance-V-py3-none-any.whl, mqbalance-V.tar.gz   the Python package (wheel, sdist)
#   mqbalance-V.tgz                                     the Helm chart (helm package)
#   mqbalance-image-V.oci.tar                           the image, docker.io/mqbalance/mqbalance:V
#   mqbalance-rocketmq-V{,-sources,-javadoc}.jar, .pom  the Java module
#   mqbalance-rocketmq-spring-boot-starter-V{,-sources,-javadoc}.jar, .pom
#                                                       its Spring Boot starter
#   mqbalance-V.cdx.json, mqbalance-rocketmq-V.cdx.json, mqbalance-rocketmq-spring-boot-starter-V.cdx.json
#                                                       CycloneDX SBOMs: the image's Python environment,
#                                                       the Java modules' dependencies
#   RELEASE                                             the version, the commit and the source id
#                                                       (below) the artifacts were made from
#   SHA256SUMS
# Usage: hack/release.sh [--no-image]   (--no-image: everything but the image, no root needed)
#        hack/release.sh --print-source-id: a hash of the files the artifacts are made of, as they are
#        now (committed or not), to tell whether a dist/ is the tree's
# Env:   MQBALANCE_DIST (default dist/): where the artifacts go; it is emptied first.
# Needs: make venv (build, cyclonedx-bom), make control-plane (helm), Java 17 + Maven; the image
# step builds what `make images` builds (root).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$REPO/hack/lib.sh"
PY="$REPO/.venv/bin/python"
DIST="${MQBALANCE_DIST:-$REPO/dist}"

# What the artifacts are made of (every file of these, tracked or new, not ignored).
SOURCES=(mqbalance charts crds clients/pom.xml clients/java clients/java-spring-boot examples/spring-boot-consumer
  Dockerfile .dockerignore pyproject.toml README.md LICENSE hack/release.sh)

source_files() {  # the files of SOURCES as they are now, one per line, sorted
  git -C "$REPO" ls-files -c -o --exclude-standard -- "${SOURCES[@]}" | LC_ALL=C sort -u |
    while IFS= read -r f; do if [[ -f "$REPO/$f" ]]; then echo "$f"; fi; done
}

source_id() {  # source_id DIR: a hash of the files source_files lists, read in DIR
  source_files | while IFS= read -r f; do printf '%s  %s\n' "$(sha256sum <"$1/$f" | cut -c1-64)" "$f"; done |
    sha256sum | cut -c1-64
}

image=1
case "${1:-}" in
  "") ;;
  --no-image) image=0 ;;
  --print-source-id) source_id "$REPO"; exit 0 ;;
  *) die "unknown argument: $1 (usage: $0 [--no-image | --print-source-id])" ;;
esac

[[ -x "$PY" ]] || die "no virtual environment: run make venv"
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
HELM="$(bash "$REPO/hack/build-control-plane.sh" --print-bin-dir)/helm"
[[ -x "$HELM" ]] || die "no helm: run make control-plane"

cd "$REPO"
rm -rf "$DIST"
mkdir -p "$DIST"
start=$SECONDS
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A snapshot of the sources: the artifacts agree with one another and with RELEASE's source id
# while the tree changes, and builds (egg-info, build/, clients/java/target) stay out of the tree.
src="$work/src"
mkdir -p "$src"
source_files | tar -C "$REPO" -T - -cf - | tar -C "$src" -xf -

log "the Python package $VERSION (wheel, sdist)"
quietly() {  # quietly COMMAND...: its output only if it fails
  local out
  out="$("$@" 2>&1)" || { printf '%s\n' "$out" >&2; die "failed: $*"; }
}

quietly "$PY" -m build --outdir "$DIST" "$src"

log "the Python SBOM (the image's environment: the wheel with the extras the Dockerfile installs)"
env_dir="$work/env"
"$PY" -m venv "$env_dir"
quietly "$env_dir/bin/pip" install --disable-pip-version-check \
  "$DIST/mqbalance-$VERSION-py3-none-any.whl[operator,sidecar,injector]"
quietly "$REPO/.venv/bin/cyclonedx-py" environment --pyproject pyproject.toml --output-reproducible \
  -o "$DIST/mqbalance-$VERSION.cdx.json" "$env_dir/bin/python"

log "the Helm chart"
quietly "$HELM" package "$src/charts/mqbalance" --version "$VERSION" --app-version "$VERSION" -d "$DIST"

log "the Java module and its Spring Boot starter (jars, sources, javadoc, SBOMs)"
# One reactor (clients/pom.xml): the starter depends on the module as built here.
quietly mvn -B -ntp -f "$src/clients/pom.xml" -DskipTests package \
  org.cyclonedx:cyclonedx-maven-plugin:2.9.1:makeBom -DoutputFormat=json -DoutputName=bom
for module in java:mqbalance-rocketmq java-spring-boot:mqbalance-rocketmq-spring-boot-starter; do
  dir="$src/clients/${module%%:*}" artifact="${module#*:}"
  for suffix in "" -sources -javadoc; do
    cp "$dir/target/$artifact-$VERSION$suffix.jar" "$DIST/"
  done
  cp "$dir/pom.xml" "$DIST/$artifact-$VERSION.pom"
  cp "$dir/target/bom.json" "$DIST/$artifact-$VERSION.cdx.json"
done

if ((image)); then
  log "the image docker.io/mqbalance/mqbalance:$VERSION"
  bash hack/build-images.sh --release "docker.io/mqbalance/mqbalance:$VERSION" \
    "$DIST/mqbalance-image-$VERSION.oci.tar" >/dev/null  # its progress goes to stderr
fi

commit="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)"
printf 'version %s\ncommit %s\nsource %s\n' "$VERSION" "$commit" "$(source_id "$src")" >"$DIST/RELEASE"
(cd "$DIST" && sha256sum -- * >SHA256SUMS)
log "dist/ written in $((SECONDS - start)) s:"
(cd "$DIST" && ls -l --block-size=K) >&2
