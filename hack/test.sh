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
# Stages can be picked with STAGES="vet test" (default: all).
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

go_test() { # go_test ARGS... -- PACKAGES...
  go build -o "$logdir/testsum" ./hack/testsum || return 1
  go test -json "$@" | "$logdir/testsum" -counts "$counts"
}

plain_tests() {
  local race plain
  race=$(race_pkgs) || return 1
  plain=$(go list ./... | grep -v -F -x -f <(printf '%s\n' $race)) || return 1
  go_test -count=1 -timeout 20m $plain
}

race_tests() {
  local race
  race=$(race_pkgs) || return 1
  go_test -count=1 -race -timeout 20m $race
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
