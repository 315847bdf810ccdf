package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Format names for --format.
const (
	FormatText     = "text"
	FormatJSON     = "json"
	FormatMarkdown = "markdown"
	FormatHTML     = "html"
)

// Formats lists the format names, for the flag's help.
var Formats = []string{FormatText, FormatJSON, FormatMarkdown, FormatHTML}

// Writer writes a whole report in one format.
type Writer func(w io.Writer, r *Report) error

// WriterFor returns the writer of a format, or an error naming the known ones
// (an unknown format never falls back to text).
func WriterFor(format string) (Writer, error) {
	switch format {
	case FormatText:
		return WriteText, nil
	case FormatJSON:
		return WriteJSON, nil
	case FormatMarkdown:
		return WriteMarkdown, nil
	case FormatHTML:
		return WriteHTML, nil
	}
	return nil, fmt.Errorf("unknown format %q (known: %s)", format, strings.Join(Formats, ", "))
}

// group formats n with thousands separators: 5000000 -> 5,000,000.
func group(n uint64) string {
	s := fmt.Sprintf("%d", n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func pct(f float64) string { return fmt.Sprintf("%.2f%%", f*100) }

// amountText formats an amount of a cap: tokens, or money in 1/10,000 units
// of currency ("USD 12.3400").
func amountText(v uint64, measure, currency string) string {
	if measure != MeasureCost {
		return group(v)
	}
	return fmt.Sprintf("%s %s.%04d", currency, group(v/10000), v%10000)
}

// amount formats an amount of the cap.
func (c *Cap) amount(v uint64) string { return amountText(v, c.Measure, c.Currency) }

// capOf is the cap as text ("unknown" when 0).
func (c *Cap) capOf() string {
	if c.Cap == 0 {
		return "unknown"
	}
	return c.amount(c.Cap)
}

// label is the cap's unit and window: "tokens per day", "USD per month".
func (c *Cap) label() string { return capLabel(c.Window, c.Measure, c.Currency) }

// rowCap is a summary row's cap as text.
func (s SummaryRow) capText() string {
	if s.Cap == 0 {
		return "unknown"
	}
	return amountText(s.Cap, s.Measure, s.Currency)
}

// suggestedText is a summary row's suggestion as text ("-" without one).
func (s SummaryRow) suggestedText() string {
	if s.SuggestedCap == 0 {
		return "-"
	}
	return amountText(s.SuggestedCap, s.Measure, s.Currency)
}

// why429 is a principal's would-be 429s: a lower bound ("at least N") when
// the ledger lacks some principals' counts, "unknown" when that bound is 0.
func would429Text(p PrincipalOver) string {
	switch {
	case p.Would429Exact:
		return fmt.Sprintf("%d", p.Would429)
	case p.Would429 == 0:
		return "unknown"
	}
	return fmt.Sprintf(">=%d", p.Would429)
}

// reserveLabel names a budget's reserve for people: "reserve auto",
// "reserve 50,000 tokens", or "" when the spec gives none.
func reserveLabel(reserve string) string {
	if reserve == "" {
		return ""
	}
	if n, err := strconv.ParseUint(reserve, 10, 64); err == nil {
		return "reserve " + group(n) + " tokens"
	}
	return "reserve " + reserve
}

// reserving reports whether a cap's reservations are shown: its budget
// reserves (so zero holds is news: the service is not reserving), or the
// ledger counted some.
func (c *Cap) reserving(reserve string) bool {
	if reserve != "" || c.Summary.hasReservations() {
		return true
	}
	for _, ov := range c.Overridden {
		if ov.Summary.hasReservations() {
			return true
		}
	}
	return false
}

// held formats a reserved amount: tokens, or money for a money cap (a
// reserve is held at the dearest price).
func (c *Cap) held(v uint64) string {
	if c.Measure == MeasureCost {
		return c.amount(v)
	}
	return group(v) + " tokens"
}

// reservationText is one population's reservations on one line ("" when the
// cap shows none): "reservations (reserve auto): 1,234 holds, 61,700,000
// tokens held, 100,000 tokens expired without a charge". The store counts an
// expired hold's amount, not the holds, so there is no count of them.
func (c *Cap) reservationText(s Stats, reserve string) string {
	if !c.reserving(reserve) {
		return ""
	}
	head := "reservations"
	if l := reserveLabel(reserve); l != "" {
		head += " (" + l + ")"
	}
	return fmt.Sprintf("%s: %s holds, %s held, %s expired without a charge", head, group(s.Holds), c.held(s.Held), c.held(s.Expired))
}
