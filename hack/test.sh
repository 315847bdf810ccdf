#!/usr/bin/env bash
# The project's test command (the README points here, and .ci/run calls it).
# Installs what a fresh machine lacks, then vets and runs every test against
# real Valkey servers that the tests start themselves on loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/install-deps.sh

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...

echo "== go test"
# Concurrency-heavy packages run under the race detector; the rest run plain so
# the Kubernetes-sized dependency tree is not compiled twice on 2-core machines.
race_pkgs=$(go list ./internal/store/... ./internal/ratelimit/...)
plain_pkgs=$(go list ./... | grep -v -F -x -f <(printf '%s\n' $race_pkgs) || true)
go test -count=1 -timeout 20m $plain_pkgs
if [ -n "$race_pkgs" ]; then
  go test -count=1 -race -timeout 20m $race_pkgs
fi

if [ -x hack/fuzz.sh ]; then
  echo "== fuzz (bounded)"
  bash hack/fuzz.sh
fi
