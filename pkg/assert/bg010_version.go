package assert

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleVersion: fields the target Envoy Gateway version ignores or
// mishandles, from a table of hazards by version range.
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
				for _, h := range versionHazards {
					if !v.AtLeast(h.from) || v.AtLeast(h.fixed) {
						continue
					}
					if n, path, what := h.match(r); n != nil {
						p.ReportSeverity(h.severity, pol.Obj, n, r.Path()+path, h.message, v, what)
					}
				}
			}
		}
		return nil
	},
}

// versionHazard is a feature broken or missing in Envoy Gateway versions
// [from, fixed).
type versionHazard struct {
	from, fixed Version
	severity    Severity
	// match returns the node at fault in rule r (nil: the rule is not
	// affected), its path relative to the rule, and a word for the message.
	match func(r *RateRule) (n *yaml.Node, path, what string)
	// message has two verbs: the version and match's word.
	message string
}

// versionHazards is BG010's table.
var versionHazards = []versionHazard{
	{
		// https://github.com/envoyproxy/gateway/issues/9244 (fixed by
		// https://github.com/envoyproxy/gateway/pull/9245): since 1.8.0 a
		// shared rule is emitted on the route's rate_limits, where the cost's
		// hits_addend does not reach the rate limit service.
		from: Version{1, 8, 0}, fixed: Version{1, 8, 2}, severity: Warning,
		match: func(r *RateRule) (*yaml.Node, string, string) {
			shared, _ := manifest.Bool(manifest.Get(r.Node, "shared"))
			if !shared || manifest.Get(r.Node, "cost") == nil {
				return nil, "", ""
			}
			return manifest.Get(r.Node, "shared"), ".shared", ""
		},
		message: "Envoy Gateway %s drops hits_addend on shared rules with a cost (https://github.com/envoyproxy/gateway/issues/9244, fixed in 1.8.2)%s: every request is charged 1, not its tokens; upgrade to v1.8.2 or later",
	},
	{
		from: Version{0, 0, 0}, fixed: Version{1, 7, 0}, severity: Warning,
		match: func(r *RateRule) (*yaml.Node, string, string) {
			return manifest.Get(r.Node, "shadowMode"), ".shadowMode", ""
		},
		message: "Envoy Gateway %s has no shadowMode (added in 1.7)%s: the field is dropped and the rule enforces",
	},
	{
		// Not a hazard but a rejection: an error whatever the rule's severity.
		from: Version{0, 0, 0}, fixed: Version{1, 9, 0}, severity: Error,
		match: func(r *RateRule) (*yaml.Node, string, string) {
			n := manifest.Get(r.Node, "limit", "requests")
			if req, ok := manifest.Int(n); !ok || req != 0 {
				return nil, "", ""
			}
			if r.Kind == KillSwitchRule {
				return n, ".limit.requests", " for an engaged kill switch (limit.requests: 0)"
			}
			return n, ".limit.requests", " for a rule with limit.requests: 0"
		},
		message: "Envoy Gateway %s's CRD requires limit.requests >= 1 (0 is allowed from 1.9): the API server rejects this policy%s, and every budget of the Gateway goes with it; upgrade to v1.9.0 or later, or leave the kill switch off",
	},
	{
		from: Version{0, 0, 0}, fixed: Version{1, 9, 0}, severity: Warning,
		match: func(r *RateRule) (*yaml.Node, string, string) {
			return manifest.Get(r.Node, "limit", "fromMetadata"), ".limit.fromMetadata", ""
		},
		message: "Envoy Gateway %s has no limit.fromMetadata (added in 1.9)%s: the static limit applies",
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
