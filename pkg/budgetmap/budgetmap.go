// Package budgetmap is the budget map: a small versioned YAML file, written by
// `budgetgen render --budget-map FILE`, that says which rate limit domain and
// rule descriptor implements which budget, on which Gateway, with which
// principal, cap, window and mode. The ratelimit service reads it
// (BUDGET_MAP_PATH, --budget-map) to count a budget's principal in one counter
// whatever Gateway the call came through; budgetgen report reads the same
// bucket names, so a budget is reported once.
package budgetmap

import (
	"slices"
	"strconv"
	"strings"
)

// APIVersion and Kind identify a budget map document.
const (
	APIVersion = "budgetgen.dev/v1alpha1"
	Kind       = "BudgetMap"
)

// Rule kinds: of a map entry, and of a rule in pkg/render's rule-budgets
// annotation (so of the gate's and the report's view of a rule).
const (
	// KindTokens is a token budget rule: counted in its bucket.
	KindTokens = "tokens"
	// KindKillSwitch is the frontier kill switch (requests: 0): it denies
	// without counting anything worth sharing, so it keeps its own counter.
	KindKillSwitch = "killswitch"
)

// RuleDescriptor is the generic_key Envoy Gateway gives rule i of a policy
// whose domain is <ns>/<policy>: <ns>/<policy>/rule/<i> (its irRuleName,
// the rule's index within the policy), which is also the descriptor's value.
func RuleDescriptor(domain string, i int) string {
	return domain + "/rule/" + strconv.Itoa(i)
}

// Gateway kinds, as in the spec.
const (
	GatewayEnvoy        = "envoy"
	GatewayAgentgateway = "agentgateway"
)

// WindowDay is the only window budgets have today: a UTC calendar day.
const WindowDay = "day"

// Modes of an entry.
const (
	ModeShadow  = "shadow"
	ModeEnforce = "enforce"
)

// Map is one budget map file.
type Map struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// BudgetSet is the metadata.name of the spec the map was rendered from.
	BudgetSet string  `yaml:"budgetSet"`
	Entries   []Entry `yaml:"entries"`
}

// Entry maps one configured limit (a domain and the descriptor path leading
// to it) to its budget.
type Entry struct {
	// Domain is the rate limit domain: <namespace>/<policy> for both gateways.
	Domain string `yaml:"domain"`
	// Descriptor is the config path that identifies the rule: for Envoy
	// Gateway its first level (<ns>/<policy>/rule/<i> as key and value); for
	// agentgateway the full path (budget=<name>, then principal or group). An
	// empty value is a bare key (any request value). The longest listed
	// prefix of a limit's path names its entry.
	Descriptor []DescriptorEntry `yaml:"descriptor"`
	// Gateway is the Gateway whose policy holds the rule.
	Gateway Gateway `yaml:"gateway"`
	// Budget is the budget's name ("frontier" for the frontier cap).
	Budget string `yaml:"budget"`
	// Bucket names the counter scope: "<set>/<budget>" when the budget's
	// Gateways share it (the default), "<set>/<budget>@<ns>/<gateway>" when each
	// Gateway has its own. Counters key on (bucket, principal, window).
	Bucket string `yaml:"bucket"`
	// Kind is KindTokens or KindKillSwitch.
	Kind string `yaml:"kind"`
	// Principal says where a per-principal budget's principal comes from;
	// empty for group budgets and the frontier cap (one shared bucket).
	Principal Principal `yaml:"principal,omitempty"`
	// OverridePrincipal is set on an override's own rule: the principal the
	// rule counts, which the request descriptor does not carry as a value.
	OverridePrincipal string `yaml:"overridePrincipal,omitempty"`
	// TokensPerDay is the rule's cap (0 for the kill switch).
	TokensPerDay int64 `yaml:"tokensPerDay"`
	// Window is WindowDay.
	Window string `yaml:"window"`
	// Mode is ModeShadow or ModeEnforce.
	Mode string `yaml:"mode"`
	// Measure is what the rule's limit counts when not tokens: "ktokens"
	// (thousands of tokens) or "cost" (1/10,000 of the pricing currency).
	Measure string `yaml:"measure,omitempty"`
	// Reserve, when set, is what a check on this rule holds for each
	// admitted, unfinished request, in the unit the rule counts (the spec's
	// reserve and reserveInitial, converted).
	Reserve *Reserve `yaml:"reserve,omitempty"`
}

// ReserveAuto is the spec's `reserve: auto`.
const ReserveAuto = "auto"

// Reserve is a rule's reservation: Tokens (in the rule's unit) held per
// admitted request, or Auto (learned by the service from the rule's recent
// charges; Initial until it has seen enough of them).
type Reserve struct {
	Tokens  int64 `yaml:"tokens,omitempty"`
	Auto    bool  `yaml:"auto,omitempty"`
	Initial int64 `yaml:"initial,omitempty"`
}

// DescriptorEntry is one level of a descriptor path.
type DescriptorEntry struct {
	Key   string `yaml:"key"`
	Value string `yaml:"value,omitempty"`
}

// Gateway names a Gateway and its implementation.
type Gateway struct {
	Kind      string `yaml:"kind"`
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

// Principal is where the principal of a rule comes from: a header set by the
// gateway from a verified credential (Envoy Gateway) or a CEL expression over
// the verified credential (agentgateway). At most one is set.
type Principal struct {
	Header     string `yaml:"header,omitempty"`
	Expression string `yaml:"expression,omitempty"`
}

// IsZero lets omitempty drop an empty principal.
func (p Principal) IsZero() bool { return p.Header == "" && p.Expression == "" }

// BucketName is the bucket of a budget: shared across Gateways unless gateway
// is set (the perGateway option), then "<set>/<budget>@<gateway>".
func BucketName(set, budget, gateway string) string {
	b := set + "/" + budget
	if gateway != "" {
		b += "@" + gateway
	}
	return b
}

// Measures a bucket may count other than tokens (pkg/render's rule measures):
// such a rule's bucket is the budget's with "#<measure>" appended, so a
// budget's money cap and token cap of one window never share a counter.
const (
	MeasureKiloTokens = "ktokens"
	MeasureCost       = "cost"
)

// MeasureBucket is the bucket of a rule of measure m ("" for tokens).
func MeasureBucket(bucket, m string) string {
	if m == "" {
		return bucket
	}
	return bucket + "#" + m
}

// ParseBucket splits a bucket name into the budget set, the budget, the
// Gateway of a perGateway bucket ("" when shared) and the measure suffix
// ("" for tokens, MeasureKiloTokens, MeasureCost, or "killswitch"). ok is
// false for a name BucketName did not make.
func ParseBucket(bucket string) (set, budget, gateway, measure string, ok bool) {
	rest, measure, _ := strings.Cut(bucket, "#")
	rest, gateway, _ = strings.Cut(rest, "@")
	set, budget, ok = strings.Cut(rest, "/")
	if !ok || set == "" || budget == "" || strings.Contains(budget, "/") {
		return "", "", "", "", false
	}
	return set, budget, gateway, measure, true
}

// Sort orders entries by domain, then descriptor path, so the file is
// deterministic whatever order they were added in.
func (m *Map) Sort() {
	slices.SortStableFunc(m.Entries, func(a, b Entry) int {
		if c := strings.Compare(a.Domain, b.Domain); c != 0 {
			return c
		}
		return slices.CompareFunc(a.Descriptor, b.Descriptor, func(x, y DescriptorEntry) int {
			if c := strings.Compare(x.Key, y.Key); c != 0 {
				return c
			}
			return strings.Compare(x.Value, y.Value)
		})
	})
}

// Index finds the entry of a configured limit. Build it once per map.
type Index struct {
	byDomain map[string][]*Entry
}

// NewIndex indexes a validated map.
func NewIndex(m *Map) *Index {
	ix := &Index{byDomain: map[string][]*Entry{}}
	if m == nil {
		return ix
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		ix.byDomain[e.Domain] = append(ix.byDomain[e.Domain], e)
	}
	return ix
}

// Lookup returns the entry whose descriptor is the longest prefix of path in
// domain, or nil. path lists the config levels leading to a limit (an empty
// value is a bare key).
func (ix *Index) Lookup(domain string, path []DescriptorEntry) *Entry {
	if ix == nil {
		return nil
	}
	var best *Entry
	for _, e := range ix.byDomain[domain] {
		if len(e.Descriptor) > len(path) || (best != nil && len(e.Descriptor) <= len(best.Descriptor)) {
			continue
		}
		if slices.Equal(e.Descriptor, path[:len(e.Descriptor)]) {
			best = e
		}
	}
	return best
}
