#!/usr/bin/env bash
# Linters at pinned versions, built by `go run` from the Go module proxy (cached
# after the first run): staticcheck, then golangci-lint with .golangci.yml
# (errcheck, govet, staticcheck, ineffassign, unused), then `goreleaser check`
# of the release config (.goreleaser.yaml; the same pin as hack/release.sh).
# Zero findings, or an annotated //nolint at the line saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOLANGCI=github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
GORELEASER=github.com/goreleaser/goreleaser/v2@v2.17.0
status=0
echo "lint: staticcheck"
go run "$STATICCHECK" ./... || status=1
echo "lint: golangci-lint"
go run "$GOLANGCI" run ./... || status=1
echo "lint: goreleaser check"
go run "$GORELEASER" check || status=1
exit $status
