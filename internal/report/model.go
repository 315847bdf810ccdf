// Package report turns the ledger's measurements into a decision: per budget
// and per cap (each window and measure of the budget: tokens per hour, day,
// ISO week or month, money per window), percentiles of each principal's usage
// per window, principal-windows over the cap, would-be 429s, usage above the
// cap, a suggested cap and a verdict (ready to promote, not yet and why). Each
// cap is judged on its own window: an hour cap on the hours of the report's
// days, a day cap on its days, a week or month cap on the last complete week
// or month, or, when none has been measured in full, on a projection of the
// measured part, marked as such. Writes text, JSON, Markdown or HTML.
//
// The JSON form is also the evidence `budgetgen promote --evidence` reads, so
// its field names are a stable contract (FormatVersion).
package report

import "time"

// FormatVersion is written into every JSON report. Bump it when a field's
// meaning changes; promote refuses evidence of another version.
const FormatVersion = "budgetgen.dev/report/v2"

// DateLayout is how days are written everywhere in reports.
const DateLayout = "2006-01-02"

// Measures of a cap.
const (
	// MeasureTokens: the cap and usage count tokens (a kilotoken rule's
	// units are multiplied back into tokens).
	MeasureTokens = "tokens"
	// MeasureCost: the cap and usage count 1/10,000 of Cap.Currency.
	MeasureCost = "cost"
)

// Verdict statuses.
const (
	VerdictReady    = "ready"
	VerdictNotYet   = "not-yet"
	VerdictEnforced = "enforced"
)

// Report is the whole result of one `budgetgen report` run.
type Report struct {
	Version string `json:"version"`
	// GeneratedAt is the injected clock's time when the report was built.
	GeneratedAt time.Time `json:"generatedAt"`
	// TimeZone names the zone of the windows (the service's RESET_TIME_ZONE).
	TimeZone string `json:"timeZone"`
	// From and To are the first and last day of the report (inclusive): the
	// Days completed days before GeneratedAt's day.
	From string `json:"from"`
	To   string `json:"to"`
	Days int    `json:"days"`
	// PartialDay is set with --include-today: today so far, marked partial
	// wherever it appears; it never counts as a covered day.
	PartialDay string `json:"partialDay,omitempty"`
	// Headroom multiplies an observed peak when a suggestion is based on it.
	Headroom float64 `json:"headroom"`
	// TopN bounds each cap's OverCapPrincipals and Outliers.
	TopN int `json:"topN"`
	// TargetLimitedShare is the share of principal-windows a suggested cap
	// may leave over it; MaxLimitedShare the share a cap must stay under to
	// be ready to promote; RequiredDays the full days of measurement a
	// promotion needs.
	TargetLimitedShare float64 `json:"targetLimitedShare"`
	MaxLimitedShare    float64 `json:"maxLimitedShare"`
	RequiredDays       int     `json:"requiredDays"`
	// NoData says why the report has no measurements at all.
	NoData string `json:"noData,omitempty"`
	// Summary has one row per cap of every budget, in budget order: the
	// table a team decides with.
	Summary []SummaryRow `json:"summary"`
	// Budgets are sorted by name.
	Budgets []Budget `json:"budgets"`
	// Warnings are data problems that did not stop the report, sorted.
	Warnings []string `json:"warnings,omitempty"`
}

// SummaryRow is one cap in the summary table.
type SummaryRow struct {
	Budget   string `json:"budget"`
	Window   string `json:"window"`
	Measure  string `json:"measure"`
	Currency string `json:"currency,omitempty"`
	Cap      uint64 `json:"cap"`
	Mode     string `json:"mode,omitempty"`
	// Judged says what the cap was judged on (days, a week, a projection).
	Judged         string  `json:"judged"`
	Projection     bool    `json:"projection,omitempty"`
	PrincipalsOver int     `json:"principalsOver"`
	Would429       uint64  `json:"would429"`
	SuggestedCap   uint64  `json:"suggestedCap"`
	Verdict        Verdict `json:"verdict"`
}

// Verdict says whether a cap (or a budget, all its caps) is ready to be
// enforced and, if not, why.
type Verdict struct {
	// Status is VerdictReady, VerdictNotYet or VerdictEnforced.
	Status  string   `json:"status"`
	Reasons []string `json:"reasons,omitempty"`
	// Notes qualify a ready verdict (a cap judged on a projection).
	Notes []string `json:"notes,omitempty"`
}

// Budget holds one budget's caps. Kill-switch rules carry no usage.
type Budget struct {
	Name string `json:"name"`
	// Mode and ShadowSince are the spec's when known.
	Mode        string `json:"mode,omitempty"`
	ShadowSince string `json:"shadowSince,omitempty"`
	// Shared is true for a budget with one bucket for everyone (group,
	// frontier): its one "principal" is the whole group.
	Shared bool `json:"shared,omitempty"`
	// Reserve is the spec's reserve when the budget reserves: a number of
	// tokens held per admitted, unfinished request, or "auto".
	Reserve string `json:"reserve,omitempty"`
	// Rules are the ledger rules measured for this budget, sorted.
	Rules []string `json:"rules"`
	// Verdict is the budget's: ready when every cap is.
	Verdict Verdict `json:"verdict"`
	// Caps are ordered by window (hour first), tokens before money.
	Caps []Cap `json:"caps"`
	// Daily are the budget's totals per day of the report (from its day or
	// hour caps), for the per-day chart; empty without such caps.
	Daily []DailyTotal `json:"daily,omitempty"`
	// NoData says why the budget has no caps to report.
	NoData string `json:"noData,omitempty"`
}

// Cap is one cap of a budget (a window and a measure) judged on its window.
type Cap struct {
	// Window is hour, day, week or month.
	Window  string `json:"window"`
	Measure string `json:"measure"`
	// Currency is set for a money cap: Cap and every amount count 1/10,000 of it.
	Currency string `json:"currency,omitempty"`
	// Cap is the default rule's cap (0 when unknown).
	Cap uint64 `json:"cap"`
	// Judged describes the windows the cap was judged on.
	Judged Judged `json:"judged"`
	// WindowsCovered counts complete judged windows with data; DaysCovered
	// the completed days with data (day and hour caps).
	WindowsCovered int `json:"windowsCovered"`
	DaysCovered    int `json:"daysCovered"`
	// Summary aggregates every principal-window judged of the principals
	// under the default rule; override principals are in Overridden.
	Summary Stats `json:"summary"`
	// PerWindow has one entry per judged window, oldest first, including
	// windows without data.
	PerWindow []WindowStats `json:"perWindow"`
	// PerDay rolls an hour cap's windows up per day (for tables).
	PerDay          []WindowStats `json:"perDay,omitempty"`
	SuggestedCap    uint64        `json:"suggestedCap"`
	SuggestionBasis string        `json:"suggestionBasis,omitempty"`
	NoData          string        `json:"noData,omitempty"`
	// OverCapPrincipals are the principals under the default rule that went
	// over the cap, most usage above it first, at most Report.TopN.
	OverCapPrincipals      []PrincipalOver `json:"overCapPrincipals,omitempty"`
	OverCapPrincipalsTotal int             `json:"overCapPrincipalsTotal"`
	// Outliers are principal-windows far above the rest (more than ten times
	// the 95th percentile, and over the cap), listed apart and left out of
	// the histogram so they do not squash it; at most Report.TopN.
	Outliers      []Outlier `json:"outliers,omitempty"`
	OutliersTotal int       `json:"outliersTotal,omitempty"`
	// Overridden has one entry per override principal, each against its own cap.
	Overridden []Override `json:"overridden,omitempty"`
	Verdict    Verdict    `json:"verdict"`
	// Distribution lists the judged principal-window usages, outliers
	// excluded, sorted ascending; PrincipalPeaks each principal's largest.
	// The HTML histogram draws them; not in the JSON.
	Distribution   []uint64 `json:"-"`
	PrincipalPeaks []uint64 `json:"-"`
}

// Judged is what a cap was judged on.
type Judged struct {
	// Text says it for people: "7 days 2026-10-17..2026-10-23", "month
	// 2026-09", "month 2026-10 so far, projected x2.50 (12 of 31 days)".
	Text string `json:"text"`
	// Windows are the judged windows' names; From is the first one's start
	// and To the last one's end (RFC 3339, UTC).
	Windows []string `json:"windows"`
	From    string   `json:"from,omitempty"`
	To      string   `json:"to,omitempty"`
	// Projection is set when no window of the cap was measured in full.
	Projection *Projection `json:"projection,omitempty"`
}

// Projection scales a partly measured window to its full length: each
// principal's usage in the measured part times Factor.
type Projection struct {
	Window string `json:"window"`
	// ObservedFrom..ObservedTo is the measured part (RFC 3339).
	ObservedFrom  string  `json:"observedFrom"`
	ObservedTo    string  `json:"observedTo"`
	ObservedHours float64 `json:"observedHours"`
	Factor        float64 `json:"factor"`
}

// Override is one override principal's numbers against its own cap.
type Override struct {
	Principal       string        `json:"principal"`
	Cap             uint64        `json:"cap"`
	WindowsCovered  int           `json:"windowsCovered"`
	DaysCovered     int           `json:"daysCovered"`
	Summary         Stats         `json:"summary"`
	PerWindow       []WindowStats `json:"perWindow"`
	SuggestedCap    uint64        `json:"suggestedCap"`
	SuggestionBasis string        `json:"suggestionBasis,omitempty"`
	NoData          string        `json:"noData,omitempty"`
}

// PrincipalOver is one principal that went over its cap.
type PrincipalOver struct {
	Principal string `json:"principal"`
	Cap       uint64 `json:"cap"`
	// WindowsOver names the windows its usage went above the cap.
	WindowsOver []string `json:"windowsOver"`
	// AboveCap sums usage - cap over those windows; MaxWindow is its largest.
	AboveCap  uint64 `json:"aboveCap"`
	MaxWindow uint64 `json:"maxWindow"`
	// Would429 are its would-be 429s in the judged windows. Would429Exact is
	// false when the ledger lacks some principals' counts (a recorder past
	// its bound, or data written before per-principal counts): then
	// Would429 is a lower bound.
	Would429      uint64 `json:"would429"`
	Would429Exact bool   `json:"would429Exact"`
}

// Outlier is one principal-window far above the rest.
type Outlier struct {
	Principal string `json:"principal"`
	Window    string `json:"window"`
	Value     uint64 `json:"value"`
	Cap       uint64 `json:"cap"`
}

// Stats are the numbers reported for a set of principal-windows.
type Stats struct {
	// PrincipalWindows is the number of (principal, window) pairs with usage.
	PrincipalWindows int `json:"principalWindows"`
	// Principals is the number of distinct principals seen.
	Principals int    `json:"principals"`
	P50        uint64 `json:"p50"`
	P95        uint64 `json:"p95"`
	P99        uint64 `json:"p99"`
	Max        uint64 `json:"max"`
	// Total is the sum of all usage.
	Total uint64 `json:"total"`
	// OverCap is the number of principal-windows above the cap that applies
	// to the principal (the service denies above the limit, not at it).
	OverCap int `json:"overCap"`
	// LimitedShare is OverCap / PrincipalWindows (0 without data).
	LimitedShare float64 `json:"limitedShare"`
	// AboveCap sums, over principal-windows over the cap, usage - cap.
	AboveCap uint64 `json:"aboveCap"`
	// Would429 are would-be 429s (shadow), Denied real ones (enforce), and
	// ReserveDenied those of either due to reservations alone.
	Would429      uint64 `json:"would429"`
	Denied        uint64 `json:"denied"`
	ReserveDenied uint64 `json:"reserveDenied,omitempty"`
	// Reservations (a budget with reserve, shadow or enforced): Holds counts
	// checks admitted holding a reservation, Held the amount they held (the
	// sum of their reserve) and Expired the amount of holds released
	// because their request's charge never came. Amounts are in the cap's
	// measure, like Total; none is projected. Totals of the rule's windows:
	// the ledger keeps no principal's.
	Holds   uint64 `json:"holds,omitempty"`
	Held    uint64 `json:"held,omitempty"`
	Expired uint64 `json:"expired,omitempty"`
}

// hasReservations reports whether s counts any reservation outcome.
func (s Stats) hasReservations() bool {
	return s.Holds > 0 || s.Held > 0 || s.Expired > 0 || s.ReserveDenied > 0
}

// WindowStats is Stats for one window (or one day of an hour cap).
type WindowStats struct {
	Window string `json:"window"`
	// Partial marks a window that is not over (today, this hour).
	Partial bool `json:"partial,omitempty"`
	Stats
}

// DailyTotal is a budget's usage on one day, for the per-day chart.
type DailyTotal struct {
	Date    string `json:"date"`
	Partial bool   `json:"partial,omitempty"`
	// Tokens is the day's total tokens; MaxPrincipal the largest
	// principal's; Cap the day cap (0 without one).
	Tokens       uint64 `json:"tokens"`
	MaxPrincipal uint64 `json:"maxPrincipal"`
	Cap          uint64 `json:"cap,omitempty"`
	// Money is the day's cost in 1/10,000 of Currency, when the budget has
	// a day or hour money cap.
	Money    uint64 `json:"money,omitempty"`
	Currency string `json:"currency,omitempty"`
	// PrincipalsOver counts principals over a day cap that day (or over an
	// hour cap in one of its hours); Would429 the day's would-be 429s.
	PrincipalsOver int    `json:"principalsOver"`
	Would429       uint64 `json:"would429"`
}
