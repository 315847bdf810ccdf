// Package buildinfo says which build of budgetgen is running: the version
// (set with -ldflags at release, else the module version the Go toolchain
// stamps from the VCS tag), the commit and the Go version, for
// `budgetgen version`, `ratelimit --version` and SARIF's tool version.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at build time:
//
//	go build -ldflags "-X github.com/budgetgen/budgetgen/internal/buildinfo.Version=v1.2.3"
//
// Empty means: use the module version the toolchain recorded (a tag such as
// v1.2.3 when built from a tagged checkout, a pseudo-version otherwise).
var Version = ""

// Commit may be set the same way; empty means the vcs.revision the
// toolchain recorded.
var Commit = ""

// Devel is the version of a build that carries none (no -ldflags, no VCS
// information, as in a copied source tree).
const Devel = "devel"

// Info is one build's identity.
type Info struct {
	Version string // never "(devel)"
	Commit  string // "unknown" when not recorded; "+dirty" when modified
	Go      string // runtime.Version() and GOOS/GOARCH
}

// Read returns the running binary's Info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	return from(bi, ok)
}

func from(bi *debug.BuildInfo, ok bool) Info {
	in := Info{Version: Version, Commit: Commit, Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	var rev, modified string
	if ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
	}
	if in.Version == "" {
		in.Version = Devel
	}
	if in.Commit == "" {
		in.Commit = rev
		if in.Commit != "" && modified == "true" {
			in.Commit += "+dirty"
		}
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	return in
}

// String is "NAME VERSION (commit C, GO)".
func (in Info) String(name string) string {
	return fmt.Sprintf("%s %s\ncommit: %s\ngo: %s\n", name, in.Version, in.Commit, in.Go)
}
