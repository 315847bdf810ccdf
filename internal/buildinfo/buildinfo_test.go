package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	t.Cleanup(func() { Version, Commit = "", "" })
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}
	for name, c := range map[string]struct {
		ldVersion   string
		main        string
		settings    []debug.BuildSetting
		wantVersion string
		wantCommit  string
	}{
		"tagged checkout": {main: "v1.2.3", settings: vcs[:1], wantVersion: "v1.2.3", wantCommit: "abc123"},
		"ldflags win":     {ldVersion: "v9.9.9", main: "v1.2.3", wantVersion: "v9.9.9", wantCommit: "unknown"},
		"no information":  {main: "(devel)", wantVersion: Devel, wantCommit: "unknown"},
		"modified tree":   {main: "v0.0.0-20261201-abc123+dirty", settings: vcs, wantVersion: "v0.0.0-20261201-abc123+dirty", wantCommit: "abc123+dirty"},
	} {
		Version = c.ldVersion
		in := from(&debug.BuildInfo{Main: debug.Module{Version: c.main}, Settings: c.settings}, true)
		if in.Version != c.wantVersion || in.Commit != c.wantCommit || !strings.HasPrefix(in.Go, "go") {
			t.Errorf("%s: %+v", name, in)
		}
		if in.Version == "(devel)" {
			t.Errorf("%s: (devel)", name)
		}
	}
	if s := (Info{Version: "v1", Commit: "c", Go: "go1.26 linux/amd64"}).String("budgetgen"); s != "budgetgen v1\ncommit: c\ngo: go1.26 linux/amd64\n" {
		t.Errorf("%q", s)
	}
}
