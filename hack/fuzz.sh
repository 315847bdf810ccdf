#!/usr/bin/env bash
# Runs every native Go fuzz target for a short, bounded time (FUZZTIME each,
# default 10s). The seed corpora already run as unit tests in `go test`; this
# explores beyond them. A crasher fails the run and is left under testdata/fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
status=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  targets=$(grep -hoE '^func (Fuzz[A-Za-z0-9_]+)\(f \*testing\.F\)' "$dir"/*_test.go 2>/dev/null | sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/' | sort -u || true)
  for t in $targets; do
    echo "-- fuzz $pkg $t ($fuzztime)"
    if ! go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg"; then
      status=1
    fi
  done
done
exit $status
