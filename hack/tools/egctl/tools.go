//go:build tools

// Package tools pins Envoy Gateway's egctl, built by hack/install-deps.sh
// into .tools/bin for test/e2e's TestEnvoyGatewayTranslatesLikeRlsconfig:
// `go build github.com/envoyproxy/gateway/cmd/egctl` from this module, whose
// go.mod requires github.com/envoyproxy/gateway at the version budgetgen's own
// go.mod uses, and go.sum pins what that version's go.mod resolves to. EG's
// go.mod has no replace directives, so nothing else is needed; egctl cannot be
// built from budgetgen's module itself, whose dependency graph lacks egctl's
// (helm, troubleshoot and more).
//
// The module path lies under github.com/envoyproxy/gateway on purpose: Go
// allows an import of a package below an "internal" directory only from a
// package whose import path shares the prefix before "internal"
// (https://go.dev/doc/go1.4#internalpackages; the go command checks import
// paths in module mode). egrlsconfig, this module's other command, imports
// EG's internal translator packages that way. The module is never published.
package tools

import _ "github.com/envoyproxy/gateway/cmd/egctl"
