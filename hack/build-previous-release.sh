#!/usr/bin/env bash
# Builds (once per commit, cached) the dist/ of the release before this one, named in
# hack/previous-release ("VERSION COMMIT"): the upgrade test installs it and upgrades to this tree's
# dist/ (tests/node/test_dist_install_upgrade.py, docs/deploy.md "Upgrading").
#
# The commit's tree is extracted with `git archive` and its own hack/release.sh writes everything but
# the image (--no-image); the image is that tree's Dockerfile built by this tree's build-images.sh
# (--release-from), which leaves the current images and images.json alone: the old tree's image step
# would prune them and point images.json at its own build.
#
# Usage: hack/build-previous-release.sh [--print-dir]
#        --print-dir: print where the previous dist/ is (built or not) and exit
# Env:   MQBALANCE_CACHE: the cache; the result is $MQBALANCE_CACHE/releases/<commit>/dist
# Exit:  0 built or found; 3 the commit is not in this clone's history (a shallow clone): nothing built
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$REPO/hack/lib.sh"

read -r VERSION COMMIT < <(grep -v '^#' "$REPO/hack/previous-release")
[[ "$COMMIT" =~ ^[0-9a-f]{40}$ ]] || die "hack/previous-release: no full commit id in '$VERSION $COMMIT'"
DIR="$CACHE/releases/$COMMIT"
DIST="$DIR/dist"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$DIST"
  exit 0
elif [[ $# -gt 0 ]]; then
  die "unknown argument: $1 (usage: $0 [--print-dir])"
fi

if [[ -f "$DIST/SHA256SUMS" ]] && (cd "$DIST" && sha256sum --quiet -c SHA256SUMS); then
  log "release $VERSION ($COMMIT) already built: $DIST"
  echo "$DIST"
  exit 0
fi
if ! git -C "$REPO" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  log "commit $COMMIT of release $VERSION is not in this clone (shallow?): run" \
    "git fetch --unshallow (or git fetch origin $COMMIT); the upgrade test skips until then"
  exit 3
fi

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
start=$SECONDS
tree="$DIR/tree"
rm -rf "$tree" "$DIST" "$DIST.tmp"
mkdir -p "$tree"
git -C "$REPO" archive "$COMMIT" | tar -x -C "$tree"
# Its release.sh runs the tools of its own .venv (python -m build, cyclonedx-py): this tree's serve.
ln -s "$REPO/.venv" "$tree/.venv"
log "release $VERSION from $COMMIT: its hack/release.sh --no-image"
# From inside its tree: a release.sh may read pyproject.toml before it changes directory.
(cd "$tree" && MQBALANCE_DIST="$DIST.tmp" bash hack/release.sh --no-image)
log "release $VERSION: its image"
bash "$REPO/hack/build-images.sh" --release-from "$tree" "docker.io/mqbalance/mqbalance:$VERSION" \
  "$DIST.tmp/mqbalance-image-$VERSION.oci.tar" >/dev/null
(cd "$DIST.tmp" && sha256sum -- mqbalance* >SHA256SUMS)
printf 'version %s\ncommit %s\n' "$VERSION" "$COMMIT" >"$DIR/release"
mv "$DIST.tmp" "$DIST"
rm -rf "$tree"  # the dist is what is kept; the tree is one `git archive` away
log "release $VERSION built in $((SECONDS - start)) s: $DIST"
echo "$DIST"
