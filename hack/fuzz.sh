#!/usr/bin/env bash
# Runs every native Go fuzz target (func FuzzXxx(f *testing.F) in a _test.go
# file) for a bounded time. The seed corpora already run as unit tests in
# `go test`; this explores beyond them. A crasher fails the run and is left
# under the package's testdata/fuzz for `go test` to replay.
#
# Time: FUZZ_BUDGET seconds of fuzzing in all (default 126) are shared evenly
# by the targets found, at least FUZZ_MIN seconds each (default 3); FUZZTIME
# (a go test -fuzztime value such as 30s or 10000x) overrides the share.
# Measured on this 2-core machine with a warm build cache (2026-11-30): 14
# targets at 9 s each = 126 s of fuzzing, plus 0.3-6 s per target to link the
# instrumented test binary and replay its corpus (FuzzAssert and FuzzRender,
# which link Kubernetes and Envoy Gateway, are the slowest): 155 s in all.
# A cold cache first compiles the dependency tree with coverage
# instrumentation, a one-time cost on top. Each package's instrumented test
# binary is linked once (`go test -c -fuzz`) and run once per target in the
# package's directory, as go test runs it (testdata/fuzz and the same fuzz
# cache): `go test -fuzz` per target linked it again for every target
# (2026-12-02, 30 targets in 20 packages, warm cache, load average 4-6:
# 198 s against 223 s the old way, run back to back).
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${FUZZ_BUDGET:-126}
floor=${FUZZ_MIN:-3}

targets=()
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for t in $(grep -hoE '^func (Fuzz[A-Za-z0-9_]+)\(f \*testing\.F\)' "$dir"/*_test.go 2>/dev/null |
    sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/' | sort -u); do
    targets+=("$pkg $t")
  done
done
n=${#targets[@]}
if [ "$n" -eq 0 ]; then
  echo "no fuzz targets"
  exit 0
fi
if [ -n "${FUZZTIME:-}" ]; then
  fuzztime=$FUZZTIME
else
  share=$((budget / n))
  [ "$share" -lt "$floor" ] && share=$floor
  fuzztime=${share}s
fi
echo "fuzz: $n targets, $fuzztime each"

# shellcheck source=hack/fuzzlib.sh
. "$(dirname "$0")/fuzzlib.sh"

status=0
start=$SECONDS
log="${TMPDIR:-/tmp}/fuzz-$$.log"
bins=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$bins"' EXIT
cache="$(go env GOCACHE)/fuzz"

# fuzz_run PKG TARGET FUZZTIME: one target of PKG's binary (linked on first
# use), in PKG's directory, its corpus cached where go test keeps it.
fuzz_run() {
  local pkg=$1 t=$2 ft=$3 bin dir
  bin="$bins/$(printf '%s' "$pkg" | tr '/.' '__').test"
  dir=$(go list -f '{{.Dir}}' "$pkg") || return 1
  if [ ! -x "$bin" ]; then
    go test -c -fuzz . -o "$bin" "$pkg" || return 1
  fi
  (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${t}\$" -test.fuzztime "$ft" \
    -test.fuzzcachedir "$cache/$pkg")
}

for entry in "${targets[@]}"; do
  read -r pkg t <<<"$entry"
  t0=$SECONDS
  if fuzz_run "$pkg" "$t" "$fuzztime" >"$log" 2>&1; then
    echo "-- ok   $pkg $t ($((SECONDS - t0))s)"
    continue
  fi
  if coordinator_race "$log"; then
    # Not a finding, but not a pass either: the time ran out before the
    # coordinator could say so. Run the same amount of fuzzing again, bounded
    # by a count instead of a clock (a count has no deadline to race), so the
    # target is still explored and a real crash still fails the stage.
    execs=$(execs_seen "$log")
    if [ -z "$execs" ] || [ "$execs" -lt 1000 ]; then execs=1000; fi
    echo "-- race $pkg $t: go.dev/issue/75804 at the deadline, no input written; again for ${execs}x"
    if fuzz_run "$pkg" "$t" "${execs}x" >"$log" 2>&1; then
      echo "-- ok   $pkg $t ($((SECONDS - t0))s)"
      continue
    fi
  fi
  status=1
  echo "-- FAIL $pkg $t ($((SECONDS - t0))s)"
  cat "$log"
done
echo "fuzz: $n targets in $((SECONDS - start))s"
exit $status
