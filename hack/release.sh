#!/usr/bin/env bash
# Writes the release artifacts of the project's one version (pyproject.toml) into dist/:
#   mqbalance-V-py3-none-any.whl, mqbalance-V.tar.gz   the Python package (wheel, sdist)
#   mqbalance-V.tgz                                     the Helm chart (helm package)
#   mqbalance-image-V.oci.tar                           the image, docker.io/mqbalance/mqbalance:V
#   mqbalance-rocketmq-V{,-sources,-javadoc}.jar, .pom  the Java module
#   mqbalance-V.cdx.json, mqbalance-rocketmq-V.cdx.json CycloneDX SBOMs: the image's Python
#                                                       environment, the Java module's dependencies
#   SHA256SUMS
# Usage: hack/release.sh [--no-image]   (--no-image: everything but the image, no root needed)
# Env:   MQBALANCE_DIST (default dist/): where the artifacts go; it is emptied first.
# Needs: make venv (build, cyclonedx-bom), make control-plane (helm), Java 17 + Maven; the image
# step builds what `make images` builds (root).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$REPO/hack/lib.sh"
PY="$REPO/.venv/bin/python"
DIST="${MQBALANCE_DIST:-$REPO/dist}"

image=1
case "${1:-}" in
  "") ;;
  --no-image) image=0 ;;
  *) die "unknown argument: $1 (usage: $0 [--no-image])" ;;
esac

[[ -x "$PY" ]] || die "no virtual environment: run make venv"
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
HELM="$(bash "$REPO/hack/build-control-plane.sh" --print-bin-dir)/helm"
[[ -x "$HELM" ]] || die "no helm: run make control-plane"

cd "$REPO"
rm -rf "$DIST"
mkdir -p "$DIST"
start=$SECONDS

log "the Python package $VERSION (wheel, sdist)"
quietly() {  # quietly COMMAND...: its output only if it fails
  local out
  out="$("$@" 2>&1)" || { printf '%s\n' "$out" >&2; die "failed: $*"; }
}

quietly "$PY" -m build --outdir "$DIST" .

log "the Python SBOM (the image's environment: the wheel with the extras the Dockerfile installs)"
env_dir="$(mktemp -d)"
trap 'rm -rf "$env_dir"' EXIT
"$PY" -m venv "$env_dir"
quietly "$env_dir/bin/pip" install --disable-pip-version-check \
  "$DIST/mqbalance-$VERSION-py3-none-any.whl[operator,sidecar,injector]"
quietly "$REPO/.venv/bin/cyclonedx-py" environment --pyproject pyproject.toml --output-reproducible \
  -o "$DIST/mqbalance-$VERSION.cdx.json" "$env_dir/bin/python"

log "the Helm chart"
quietly "$HELM" package charts/mqbalance --version "$VERSION" --app-version "$VERSION" -d "$DIST"

log "the Java module (jar, sources, javadoc, SBOM)"
quietly mvn -B -ntp -f clients/java/pom.xml -DskipTests package \
  org.cyclonedx:cyclonedx-maven-plugin:2.9.1:makeBom -DoutputFormat=json -DoutputName=bom
for suffix in "" -sources -javadoc; do
  cp "clients/java/target/mqbalance-rocketmq-$VERSION$suffix.jar" "$DIST/"
done
cp clients/java/pom.xml "$DIST/mqbalance-rocketmq-$VERSION.pom"
cp clients/java/target/bom.json "$DIST/mqbalance-rocketmq-$VERSION.cdx.json"

if ((image)); then
  log "the image docker.io/mqbalance/mqbalance:$VERSION"
  bash hack/build-images.sh --release "docker.io/mqbalance/mqbalance:$VERSION" \
    "$DIST/mqbalance-image-$VERSION.oci.tar" >/dev/null  # its progress goes to stderr
fi

(cd "$DIST" && sha256sum -- * >SHA256SUMS)
log "dist/ written in $((SECONDS - start)) s:"
(cd "$DIST" && ls -l --block-size=K) >&2
