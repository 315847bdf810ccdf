package assert

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/budgetgen/budgetgen/internal/manifest"
)

// ruleVersion: fields the target Envoy Gateway version ignores or mishandles.
var ruleVersion = &Rule{
	ID:       "BG010",
	Name:     "version-hazards",
	Doc:      "with --envoy-gateway-version, warn where a used feature is broken or missing in that version",
	Severity: Warning,
	Check: func(p *Pass) error {
		if p.Options.EnvoyGatewayVersion == "" {
			return nil
		}
		v, err := ParseVersion(p.Options.EnvoyGatewayVersion)
		if err != nil {
			return err
		}
		for _, pol := range p.Index.Policies {
			for _, r := range pol.Rules {
				shared, _ := manifest.Bool(manifest.Get(r.Node, "shared"))
				if shared && manifest.Get(r.Node, "cost") != nil && v.AtLeast(Version{1, 8, 0}) && !v.AtLeast(Version{1, 8, 2}) {
					p.Report(pol.Obj, manifest.Get(r.Node, "shared"), r.Path()+".shared", "Envoy Gateway %s drops hits_addend on shared rules with a cost (fixed in 1.8.2): every request is charged 1, not its tokens", v)
				}
				if n := manifest.Get(r.Node, "shadowMode"); n != nil && !v.AtLeast(Version{1, 7, 0}) {
					p.Report(pol.Obj, n, r.Path()+".shadowMode", "Envoy Gateway %s has no shadowMode (added in 1.7): the field is dropped and the rule enforces", v)
				}
				if n := manifest.Get(r.Node, "limit", "requests"); n != nil && !v.AtLeast(Version{1, 9, 0}) {
					if req, ok := manifest.Int(n); ok && req == 0 {
						what := "a rule with limit.requests: 0"
						if r.Kind == KillSwitchRule {
							what = "an engaged kill switch (limit.requests: 0)"
						}
						// Not a hazard but a rejection: an error whatever the rule's severity.
						p.ReportSeverity(Error, pol.Obj, n, r.Path()+".limit.requests", "Envoy Gateway %s's CRD requires limit.requests >= 1 (0 is allowed from 1.9): the API server rejects this policy for %s, and every budget of the Gateway goes with it; upgrade to v1.9.0 or later, or leave the kill switch off", v, what)
					}
				}
				if n := manifest.Get(r.Node, "limit", "fromMetadata"); n != nil && !v.AtLeast(Version{1, 9, 0}) {
					p.Report(pol.Obj, n, r.Path()+".limit.fromMetadata", "Envoy Gateway %s has no limit.fromMetadata (added in 1.9): the static limit applies", v)
				}
			}
		}
		return nil
	},
}

// Version is a major.minor.patch release.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports v >= o.
func (v Version) AtLeast(o Version) bool {
	if v.Major != o.Major {
		return v.Major > o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor > o.Minor
	}
	return v.Patch >= o.Patch
}

// ParseVersion reads v1.8.1, 1.8.1 or 1.8 (patch 0). Pre-release suffixes
// (-rc.1) are ignored.
func ParseVersion(s string) (Version, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "v")
	t, _, _ = strings.Cut(t, "-")
	parts := strings.Split(t, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, fmt.Errorf("envoy gateway version %q: want v<major>.<minor>[.<patch>]", s)
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return Version{}, fmt.Errorf("envoy gateway version %q: want v<major>.<minor>[.<patch>]", s)
		}
		n[i] = x
	}
	return Version{n[0], n[1], n[2]}, nil
}
