#!/usr/bin/env bash
# Build (once) and cache the Java oracle the producer's differential tests run: RocketMQ's own
# producer classes (rocketmq-client from Maven Central, one classpath per version) driven by
# tests/oracle/java/Oracle.java. See docs/producer.md ("Checked against RocketMQ").
#
# Idempotent: the compiled driver is cached under a hash of its sources, each version's classpath
# under the version; both are rebuilt only when missing. Concurrent runs wait on a lock.
#
# Usage: hack/build-java-oracle.sh VERSION...   prints "VERSION<TAB>CLASSPATH" per version and
#        "classes<TAB>DIR" for the driver, on stdout.
# Env:   MQBALANCE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/mqbalance)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=hack/lib.sh
source "$ROOT/hack/lib.sh"
SRC="$ROOT/tests/oracle/java"
ORACLE_DIR="$CACHE/java-oracle"

[[ $# -gt 0 ]] || die "usage: $0 VERSION..."

ensure_tools() {
  if command -v javac >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then
    return
  fi
  apt_install openjdk-17-jdk-headless maven
}

mkdir -p "$ORACLE_DIR"
exec 9>"$ORACLE_DIR/.lock"
flock 9

ensure_tools

hash="$(cat "$SRC"/*.java "$SRC/pom.xml" | sha256sum | cut -c1-16)"
classes="$ORACLE_DIR/classes-$hash"
if [[ ! -f "$classes/Oracle.class" ]]; then
  log "compiling the oracle driver"
  rm -rf "$classes.tmp"
  mkdir -p "$classes.tmp"
  javac --release 11 -Xlint:-options -d "$classes.tmp" "$SRC"/*.java >&2
  mv "$classes.tmp" "$classes"
fi
printf 'classes\t%s\n' "$classes"

for version in "$@"; do
  [[ "$version" =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "not a RocketMQ version: $version"
  cp_file="$ORACLE_DIR/rocketmq-client-$version.classpath"
  if [[ ! -s "$cp_file" ]] || ! tr ':' '\n' <"$cp_file" | while read -r jar; do [[ -f "$jar" ]] || exit 1; done; then
    log "resolving rocketmq-client $version from Maven Central"
    mvn -q -B -f "$SRC/pom.xml" dependency:build-classpath \
      -Drocketmq.version="$version" -Dmdep.outputFile="$cp_file.tmp" >&2 \
      || die "could not resolve rocketmq-client $version (see Maven's output above)"
    mv "$cp_file.tmp" "$cp_file"
  fi
  printf '%s\t%s\n' "$version" "$(cat "$cp_file")"
done
