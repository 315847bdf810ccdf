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
	// Days is the number of days in the window.
	Days int `json:"days"`
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
	// Overrides maps principals with their own cap to it.
	Overrides map[string]uint64 `json:"overrides,omitempty"`
	// Currency is set for a money budget (a daily cost limit): Cap, usage
	// and every amount of this budget count 1/10,000 of the currency.
	Currency string `json:"currency,omitempty"`
	// Rules are the rule ids measured for this budget, sorted.
	Rules []string `json:"rules"`
	// DaysCovered is how many days of the window have any data for this budget.
	DaysCovered int `json:"daysCovered"`
	// Summary aggregates every principal-day of the window.
	Summary Stats `json:"summary"`
	// PerDay has one entry per day of the window, oldest first, including
	// days without data (Principals == 0).
	PerDay []DayStats `json:"perDay"`
	// SuggestedCap is the smallest daily cap that keeps the share of
	// principal-days over it at or under TargetLimitedShare (0 without data).
	SuggestedCap uint64 `json:"suggestedCap"`
	// Distribution lists every principal-day usage of the window, sorted
	// ascending; the HTML chart draws it. Not in the JSON: it grows with the
	// number of principals.
	Distribution []uint64 `json:"-"`
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
	Stats
}
