#!/usr/bin/env bash
# Release builds with GoReleaser at a pinned version, built by `go run` from the
# Go module proxy (cached after the first run); .goreleaser.yaml is the config.
#   hack/release.sh check                          # validate the config
#   hack/release.sh release --snapshot --clean     # build dist/ locally (no publish)
#   hack/release.sh release --clean                # on a tag, in CI (needs GITHUB_TOKEN)
# v2.17.0 is the newest GoReleaser whose go.mod the machine's Go (1.26) builds
# (v2.18 needs Go 1.27); internal/cli/release_test.go reads this pin.
set -euo pipefail
cd "$(dirname "$0")/.."
GORELEASER=github.com/goreleaser/goreleaser/v2@v2.17.0
exec go run "$GORELEASER" "$@"
