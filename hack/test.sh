#!/usr/bin/env bash
# The project's test command (the README points here, and .ci/run calls it).
# Installs what a fresh machine lacks, then runs every stage: gofmt, go vet,
# the linters, the tests (plain, then the concurrency-heavy packages under
# the race detector) against real Valkey servers that the tests start on
# loopback ports, and bounded fuzzing. Every stage runs even when an earlier
# one failed; each prints a summary line, and the last line counts every test
# (and every failed non-test stage as one failure): "total: N passed, N failed".
# Exit status is 1 when anything failed.
#
# Stages can be picked with STAGES="vet test" (default: all). With
# TEST_JSON_DIR set, the go test -json events of the test and race stages are
# kept there (test.json, race.json), e.g. to re-measure the slow packages below.
set -uo pipefail
cd "$(dirname "$0")/.."

STAGES=${STAGES:-"deps gofmt vet lint test race fuzz"}
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
counts="$logdir/counts"
: >"$counts"
failed_stages=()
summary=()

want() { [[ " $STAGES " == *" $1 "* ]]; }

# stage NAME CMD...: runs CMD, records ok/FAIL and the time taken.
stage() {
  local name=$1; shift
  want "$name" || return 0
  echo "== $name"
  local t0=$SECONDS
  if "$@"; then
    summary+=("stage $name: ok ($((SECONDS - t0))s)")
  else
    summary+=("stage $name: FAIL ($((SECONDS - t0))s)")
    failed_stages+=("$name")
  fi
}

gofmt_check() {
  local unformatted
  unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
  if [ -n "$unformatted" ]; then
    echo "gofmt would change:"; echo "$unformatted"; return 1
  fi
}

# Concurrency-heavy packages run under the race detector; the rest run plain
# so the Kubernetes-sized dependency tree is not compiled twice on 2 cores.
race_pkgs() { go list ./internal/store/... ./internal/ratelimit/...; }

# The packages whose tests take longest, slowest first (the "elapsed" of
# their pass events in go test -json, 2-core VM). go test starts packages in
# the order named, GOMAXPROCS at a time, so these go first: the long ones no
# longer start last and run alone at the end of a stage. Other packages follow
# in go list's order; a package missing here is only started later, never
# skipped. Re-measure with TEST_JSON_DIR:
#   jq -r 'select(.Action=="pass" and .Test==null) | "\(.Elapsed) \(.Package)"' "$TEST_JSON_DIR"/test.json | sort -rn
slow_plain=(test/reliability test/e2e internal/cli test/install internal/valkeytest internal/ledgerpg
  deploy/monitoring deploy test/week internal/report pkg/assert internal/pgtest)
slow_race=(internal/ratelimit/server internal/store/valkey internal/ratelimit/service
  internal/ratelimit/window internal/ratelimit/unarygrpc internal/ratelimit/engine
  internal/store/memory internal/ratelimit/key)

# slow_first DIR...: the packages on stdin, those in the module directories
# DIR first (in that order), then the rest in their own order.
slow_first() {
  local mod pkgs d
  mod=$(go list -m) || return 1
  pkgs=$(cat)
  for d in "$@"; do
    grep -F -x -- "$mod/$d" <<<"$pkgs" || true # not a package (any more): nothing to order
  done
  grep -v -F -x -f <(printf "$mod/%s\n" "$@") <<<"$pkgs" || true # all of them were slow
}

go_test() { # go_test NAME ARGS... -- PACKAGES...
  local name=$1; shift
  go build -o "$logdir/testsum" ./hack/testsum || return 1
  if [ -n "${TEST_JSON_DIR:-}" ]; then
    mkdir -p "$TEST_JSON_DIR" || return 1
    go test -json "$@" | tee "$TEST_JSON_DIR/$name.json" | "$logdir/testsum" -counts "$counts"
  else
    go test -json "$@" | "$logdir/testsum" -counts "$counts"
  fi
}

plain_tests() {
  local race plain
  race=$(race_pkgs) || return 1
  plain=$(go list ./... | grep -v -F -x -f <(printf '%s\n' $race) | slow_first "${slow_plain[@]}") || return 1
  go_test test -count=1 -timeout 20m $plain
}

race_tests() {
  local race
  race=$(race_pkgs | slow_first "${slow_race[@]}") || return 1
  go_test race -count=1 -race -timeout 20m $race
}

fuzz() {
  [ -x hack/fuzz.sh ] || { echo "hack/fuzz.sh missing"; return 1; }
  bash hack/fuzz.sh | tee "$logdir/fuzz.log"
  local rc=${PIPESTATUS[0]}
  local ok bad
  ok=$(grep -c '^-- ok ' "$logdir/fuzz.log")
  bad=$(grep -c '^-- FAIL ' "$logdir/fuzz.log")
  echo "$ok $bad 0" >>"$counts"
  return "$rc"
}

lint() {
  if [ -x hack/lint.sh ]; then bash hack/lint.sh; else echo "no hack/lint.sh"; fi
}

stage deps bash hack/install-deps.sh
stage gofmt gofmt_check
stage vet go vet ./...
stage lint lint
stage test plain_tests
stage race race_tests
stage fuzz fuzz

passed=0; failed=0
while read -r p f _; do passed=$((passed + p)); failed=$((failed + f)); done <"$counts"
# A failed stage whose failures are not counted as tests (gofmt, vet, lint,
# a build error) still counts once, so the total never reads 0 failed then.
for s in "${failed_stages[@]}"; do
  case $s in test|race|fuzz) ;; *) failed=$((failed + 1)) ;; esac
done
echo
printf '%s\n' "${summary[@]}"
echo "total: $passed passed, $failed failed"
[ ${#failed_stages[@]} -eq 0 ]
