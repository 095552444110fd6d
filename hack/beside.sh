#!/usr/bin/env bash
# beside.sh LOG BACKGROUND -- FOREGROUND...
#
# Runs the shell command BACKGROUND with its output in LOG while FOREGROUND runs in the terminal,
# then prints BACKGROUND's summary (its last 150 lines when it failed). Fails when either failed.
# `make test` runs the Java and Go modules' tests this way beside pytest: both mostly wait on events
# (RocketMQ, API servers, sidecars), so on two cores they take little more than the longer one.
set -uo pipefail
log="$1" background="$2"
shift 2
[[ "${1:-}" == "--" ]] && shift
mkdir -p "$(dirname "$log")"
echo "beside.sh: '$background' runs beside this, its output in $log"
setsid bash -c "$background" >"$log" 2>&1 </dev/null &
pid=$!
trap 'kill -- -"$pid" 2>/dev/null' EXIT  # its own process group: Maven, the JVM and their children
"$@"
fg=$?
began=$SECONDS
wait "$pid"
bg=$?
trap - EXIT
echo "=== $background: exit $bg (waited $((SECONDS - began)) s after the foreground; log $log) ==="
if ((bg == 0)); then
  grep -E '^\[(INFO|WARNING|ERROR)\] (Tests run:|BUILD|Total time)|^(ok|FAIL)[[:space:]]' "$log" | grep -v ' -- in ' ||
    tail -n 20 "$log"
else
  tail -n 150 "$log"
fi
((fg == 0 && bg == 0))
