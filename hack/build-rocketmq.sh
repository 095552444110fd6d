#!/usr/bin/env bash
# Fetch (once) and cache Apache RocketMQ's NameServer, Broker and admin tools for tests, the
# demo and benchmarks: the release's own jars from Maven Central, copied by Maven from
# hack/rocketmq/pom.xml. See docs/local-cluster.md.
#
# Idempotent: the jars are kept in a per-user cache directory outside the repository and
# fetched again only when missing or when the pinned version changes. Two sessions never
# fetch the same version at once (flock).
#
# Usage: hack/build-rocketmq.sh [--print-dir] [VERSION...]   (default: the pinned 5.x release)
# Env:   MQBALANCE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance)
set -euo pipefail

DEFAULT_VERSION="5.3.3"
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=hack/lib.sh
source "$HERE/lib.sh"
POM="$HERE/rocketmq/pom.xml"

APT_PACKAGES=(
  openjdk-17-jdk-headless  # RocketMQ's servers, and the Java client module (javac)
  maven                    # fetches the jars from Maven Central
)

install_tools() {
  # A machine may bring its own JDK and Maven; only install Debian's when a command is missing.
  local missing=()
  command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || missing+=("${APT_PACKAGES[0]}")
  command -v mvn >/dev/null 2>&1 || missing+=("${APT_PACKAGES[1]}")
  apt_install "${missing[@]}"
}

stamp_text() {  # stamp_text VERSION
  echo "rocketmq=$1 artifacts=rocketmq-namesrv,rocketmq-broker,rocketmq-tools pom=$(sha256sum "$POM" | cut -c1-16)"
}

ready() {  # ready VERSION
  local dir="$CACHE/rocketmq-$1"
  [[ -f "$dir/.stamp" ]] && [[ "$(cat "$dir/.stamp")" == "$(stamp_text "$1")" ]] &&
    compgen -G "$dir/lib/rocketmq-broker-$1.jar" >/dev/null &&
    compgen -G "$dir/lib/rocketmq-namesrv-$1.jar" >/dev/null
}

fetch() {  # fetch VERSION
  local version="$1" dir="$CACHE/rocketmq-$1" work start=$SECONDS
  work="$(mktemp -d "$CACHE/rocketmq-fetch.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  log "fetching Apache RocketMQ $version (namesrv, broker, tools) from Maven Central"
  # -B: no progress bars in CI logs; the local repository (~/.m2) is shared with the Java client
  # module, so its build finds the client jars already there.
  mvn -B -q -f "$POM" -Drocketmq.version="$version" \
    dependency:copy-dependencies -DoutputDirectory="$work/lib" -DincludeScope=runtime >"$work/mvn.log" 2>&1 ||
    { tail -n 30 "$work/mvn.log" >&2; die "maven could not fetch RocketMQ $version"; }
  [[ -f "$work/lib/rocketmq-broker-$version.jar" ]] || die "rocketmq-broker-$version.jar missing after fetch"
  rm -rf "$dir"
  mkdir -p "$dir"
  mv "$work/lib" "$dir/lib"
  stamp_text "$version" >"$dir/.stamp"
  rm -rf "$work"
  trap - EXIT
  log "fetched RocketMQ $version in $((SECONDS - start)) s ($(du -sh "$dir/lib" | cut -f1))"
}

main() {
  local print_only=0 versions=() v
  for v in "$@"; do
    case "$v" in
      --print-dir) print_only=1 ;;
      -*) die "unknown option $v (usage: $0 [--print-dir] [VERSION...])" ;;
      *) versions+=("$v") ;;
    esac
  done
  ((${#versions[@]})) || versions=("$DEFAULT_VERSION")
  if ((print_only)); then
    for v in "${versions[@]}"; do echo "$CACHE/rocketmq-$v"; done
    return
  fi
  mkdir -p "$CACHE"
  install_tools
  for v in "${versions[@]}"; do
    # One lock per version: a control-plane build does not hold up a RocketMQ fetch.
    exec 9>"$CACHE/.rocketmq-$v.lock"
    flock 9
    if ready "$v"; then
      log "RocketMQ $v already fetched"
    else
      fetch "$v"
    fi
    flock -u 9
    echo "$CACHE/rocketmq-$v"
  done
}

main "$@"
