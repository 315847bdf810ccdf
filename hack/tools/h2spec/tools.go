//go:build tools

// Package tools pins h2spec's dependencies: h2spec has no go.mod, so a plain
// `go install github.com/summerwind/h2spec/cmd/h2spec@VERSION` resolves them
// to whatever is newest on the day. hack/install-deps.sh builds it from this
// module instead, with the versions in go.mod and go.sum.
package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
