// Package report turns a week (or any number of days) of shadow measurements
// read from the ledger into per-budget statistics - percentiles of daily usage
// per principal, principal-days over the cap, would-be 429s, tokens above the
// cap and a suggested cap - and writes them as text, JSON, Markdown or HTML.
//
// The JSON form is also the evidence `budgetgen promote --evidence` reads, so
// its field names are a stable contract (FormatVersion).
package report

import "time"

// FormatVersion is written into every JSON report. Bump it when a field's
// meaning changes; promote refuses evidence of another version.
const FormatVersion = "budgetgen.dev/report/v1"

// DateLayout is how UTC days are written everywhere in reports.
const DateLayout = "2006-01-02"

// Report is the whole result of one `budgetgen report` run.
type Report struct {
	Version string `json:"version"`
	// GeneratedAt is the injected clock's time when the report was built.
	GeneratedAt time.Time `json:"generatedAt"`
	// From and To are the first and last UTC day of the window (inclusive).
	// The window is made of completed days only: it ends the day before
	// GeneratedAt's day.
	From string `json:"from"`
	To   string `json:"to"`
	// Days is the number of completed days in the window.
	Days int `json:"days"`
	// PartialDay is set with --include-today: the current UTC day, so far.
	// It is the last entry of every PerDay, marked Partial, and counts in the
	// summaries; it never counts as a covered day (promote skips it).
	PartialDay string `json:"partialDay,omitempty"`
	// Headroom is the factor applied to an observed peak when a suggestion
	// is based on it (shared buckets, few principals).
	Headroom float64 `json:"headroom"`
	// TopN bounds each budget's OverCapPrincipals.
	TopN int `json:"topN"`
	// NoData says why the report has no measurements at all (empty when it
	// has some).
	NoData string `json:"noData,omitempty"`
	// TargetLimitedShare is the share of principal-days allowed to be over
	// the suggested cap (default 0.01).
	TargetLimitedShare float64 `json:"targetLimitedShare"`
	// Budgets are sorted by name.
	Budgets []Budget `json:"budgets"`
	// Warnings are data problems that did not stop the report (fewer days
	// than asked, rules with no known budget), sorted.
	Warnings []string `json:"warnings,omitempty"`
}

// Budget holds one budget's numbers over the window. Only its token rules
// count; kill-switch rules carry no usage.
type Budget struct {
	Name string `json:"name"`
	// Mode is the budget's mode in the spec when known (shadow or enforce).
	Mode string `json:"mode,omitempty"`
	// Cap is the budget's default daily cap in tokens (0 when unknown).
	Cap uint64 `json:"cap"`
	// Shared is true for a budget with one bucket for everyone (group,
	// frontier): its one "principal" is the whole group.
	Shared bool `json:"shared,omitempty"`
	// Overrides maps principals with their own cap to it.
	Overrides map[string]uint64 `json:"overrides,omitempty"`
	// Currency is set for a money budget (a daily cost limit): Cap, usage
	// and every amount of this budget count 1/10,000 of the currency.
	Currency string `json:"currency,omitempty"`
	// Rules are the rule ids measured for this budget, sorted.
	Rules []string `json:"rules"`
	// DaysCovered is how many completed days of the window have any data for
	// the principals under the default rule (the partial day never counts).
	DaysCovered int `json:"daysCovered"`
	// Summary aggregates every principal-day of the window of the principals
	// under the default rule (override principals are in Overridden, judged
	// against their own caps).
	Summary Stats `json:"summary"`
	// PerDay has one entry per day of the window, oldest first, including
	// days without data (Principals == 0).
	PerDay []DayStats `json:"perDay"`
	// SuggestedCap is the smallest daily cap that keeps the share of
	// principal-days over it at or under TargetLimitedShare (0 without data).
	SuggestedCap uint64 `json:"suggestedCap"`
	// SuggestionBasis says what SuggestedCap is computed from (a percentile
	// of how many principal-days, or a peak times the headroom and why).
	SuggestionBasis string `json:"suggestionBasis,omitempty"`
	// NoData says why there is no suggestion (no measurements in the window).
	NoData string `json:"noData,omitempty"`
	// OverCapPrincipals are the principals under the default rule that went
	// over the cap, most tokens above it first, at most Report.TopN.
	OverCapPrincipals []PrincipalOver `json:"overCapPrincipals,omitempty"`
	// OverCapPrincipalsTotal counts all of them (OverCapPrincipals may be cut).
	OverCapPrincipalsTotal int `json:"overCapPrincipalsTotal"`
	// Overridden has one entry per override principal with data or in the
	// spec, sorted by principal: each its own population with its own cap.
	Overridden []Override `json:"overridden,omitempty"`
	// Distribution lists every principal-day usage of the window, sorted
	// ascending; the HTML chart draws it. Not in the JSON: it grows with the
	// number of principals.
	Distribution []uint64 `json:"-"`
	// PrincipalPeaks is each principal's largest day in the window, sorted
	// ascending; the chart uses it to see a principal 10x the rest.
	PrincipalPeaks []uint64 `json:"-"`
}

// Override is one override principal's numbers against its own cap.
type Override struct {
	Principal       string     `json:"principal"`
	Cap             uint64     `json:"cap"`
	DaysCovered     int        `json:"daysCovered"`
	Summary         Stats      `json:"summary"`
	PerDay          []DayStats `json:"perDay"`
	SuggestedCap    uint64     `json:"suggestedCap"`
	SuggestionBasis string     `json:"suggestionBasis,omitempty"`
	NoData          string     `json:"noData,omitempty"`
}

// PrincipalOver is one principal that went over its cap in the window.
type PrincipalOver struct {
	Principal string `json:"principal"`
	Cap       uint64 `json:"cap"`
	// DaysOver lists the days (DateLayout) its usage went above the cap.
	DaysOver []string `json:"daysOver"`
	// TokensAboveCap sums usage - cap over those days; MaxDay is its
	// largest day.
	TokensAboveCap uint64 `json:"tokensAboveCap"`
	MaxDay         uint64 `json:"maxDay"`
	// Would429 are the would-be 429s of its rule on the days it was the only
	// principal over the cap (the ledger counts denials per rule and day, not
	// per principal). Would429Exact is false when some of its days over were
	// shared with other principals over the cap: those days' denials are not
	// in Would429.
	Would429      uint64 `json:"would429"`
	Would429Exact bool   `json:"would429Exact"`
}

// Stats are the numbers reported for a set of principal-days.
type Stats struct {
	// PrincipalDays is the number of (principal, day) pairs with usage.
	PrincipalDays int `json:"principalDays"`
	// Principals is the number of distinct principals seen.
	Principals int    `json:"principals"`
	P50        uint64 `json:"p50"`
	P95        uint64 `json:"p95"`
	P99        uint64 `json:"p99"`
	Max        uint64 `json:"max"`
	// TotalTokens is the sum of all usage.
	TotalTokens uint64 `json:"totalTokens"`
	// OverCap is the number of principal-days whose usage went above the cap
	// that applies to the principal.
	OverCap int `json:"overCap"`
	// LimitedShare is OverCap / PrincipalDays (0 when there is no data).
	LimitedShare float64 `json:"limitedShare"`
	// TokensAboveCap sums, over principal-days over the cap, usage - cap.
	TokensAboveCap uint64 `json:"tokensAboveCap"`
	// Would429 is the number of requests the service answered over limit in
	// shadow mode (would-be 429s); Denied those it really denied (enforce).
	Would429 uint64 `json:"would429"`
	Denied   uint64 `json:"denied"`
}

// DayStats is Stats for one UTC day.
type DayStats struct {
	Date string `json:"date"`
	// Partial marks today's day so far (--include-today).
	Partial bool `json:"partial,omitempty"`
	Stats
}
