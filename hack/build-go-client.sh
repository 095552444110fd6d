#!/usr/bin/env bash
# Build clients/go, the Go helper for apache/rocketmq-client-go v2 consumers, with the machine's Go:
# its modules from the Go module proxy into the per-user cache (shared with the control plane's
# build), `go vet`, and the end-to-end benchmark's Go consumer (clients/go/e2e/consumer), which
# harness/e2e.py runs as members of mixed Java and Go groups. Go's build cache makes a second run
# take a second or two.
#
# Usage: hack/build-go-client.sh [--test] [--harness-test]   prints the e2e consumer's path on stdout;
#        --test also runs the module's unit tests (go test; go vet compiles its README's quick start);
#        --harness-test its handover test against harness.javaenv (the repository's .venv, a real
#        RocketMQ, API server and sidecars; go test -tags harness).
# Env:   MQBALANCE_CACHE, MQBALANCE_GO, MQBALANCE_GO_CACHE as hack/build-kwok.sh.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
MODULE="$(cd "$(dirname "$0")/../clients/go" && pwd)"
GO_CACHE="${MQBALANCE_GO_CACHE:-$CACHE/go}"
OUT="$CACHE/go-client/bin"

run_tests=0 harness_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) run_tests=1 ;;
    --harness-test) harness_tests=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg'" ;;
  esac
done

go="$(find_go)"
mkdir -p "$GO_CACHE" "$OUT"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
export GOMODCACHE="$GO_CACHE/mod" GOCACHE="$GO_CACHE/build"
cd "$MODULE"
# One build at a time: pytest workers and make java-test may ask at once.
exec 9>"$OUT/.lock"
flock 9
"$go" mod download >&2 || die "could not fetch clients/go's modules"
"$go" vet ./... >&2 || die "go vet clients/go failed"
"$go" build -trimpath -o "$OUT/e2e-consumer.tmp" ./e2e/consumer >&2 || die "building clients/go failed"
mv "$OUT/e2e-consumer.tmp" "$OUT/e2e-consumer"
if ((run_tests)); then
  "$go" test -count=1 ./... >&2 || die "clients/go's tests failed"
fi
if ((harness_tests)); then
  flock -u 9  # the harness test's own builds need no lock; others may build meanwhile
  "$go" test -count=1 -tags harness -run 'Handover' -timeout 20m -v . 2>&1 |
    grep -E '^(=== RUN|--- |ok|FAIL|PASS)|_test.go' >&2 || die "clients/go's handover test failed"
fi
echo "$OUT/e2e-consumer"
