# Functions hack/fuzz.sh uses to read a failed `go test -fuzz` log; sourced,
# and tested by hack/fuzzlib_test.go against logs Go really printed.

# coordinator_race reports whether a failed run is Go's fuzz-coordinator
# race at the -fuzztime deadline (go.dev/issue/75804, fixed in Go 1.27, not
# in any 1.26.x): the target fails with a bare "context deadline exceeded"
# and no failing input is written. A real crash or hang always writes one.
coordinator_race() {
  local log=$1
  grep -qx '    context deadline exceeded' "$log" &&
    ! grep -q 'Failing input written to' "$log" &&
    ! grep -q -- '--- FAIL: .*/' "$log"
}

# execs_seen prints the last execution count the coordinator reported.
execs_seen() {
  grep -oE 'execs: [0-9]+' "$1" | tail -1 | grep -oE '[0-9]+' || true
}
