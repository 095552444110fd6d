# Shared by the hack/build-*.sh scripts (sourced): messages, the cache directory, root and
# Debian packages. Messages go to standard error: some scripts print their results on stdout.

# The per-user cache of everything the scripts build or fetch, outside the repository.
CACHE="${MQBALANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance}"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

package_installed() {  # package_installed PACKAGE
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

apt_install() {  # apt_install PACKAGE...: install them from Debian (none given: nothing to do)
  (($#)) || return 0
  log "installing Debian packages: $*"
  # apt-get fails at once when another apt-get holds its lock: builds that run side by side
  # (.ci/run starts later steps' builds in the background) take turns on a lock of our own.
  mkdir -p "$CACHE"
  as_root flock "$CACHE/.apt.lock" apt-get update -qq >&2
  as_root flock "$CACHE/.apt.lock" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

apt_install_missing() {  # apt_install_missing PACKAGE...: those of them not installed yet
  local missing=() p
  for p in "$@"; do
    package_installed "$p" || missing+=("$p")
  done
  apt_install "${missing[@]}"
}

find_go() {  # the go command: $MQBALANCE_GO, else /usr/local/go/bin/go, else go on PATH
  local go="${MQBALANCE_GO:-}"
  if [[ -z "$go" ]]; then
    if [[ -x /usr/local/go/bin/go ]]; then
      go=/usr/local/go/bin/go
    else
      go="$(command -v go || true)"
    fi
  fi
  [[ -n "$go" && -x "$go" ]] ||
    die "no Go toolchain: install Go (the go.mod of what is built names the minimum) or set MQBALANCE_GO"
  echo "$go"
}
