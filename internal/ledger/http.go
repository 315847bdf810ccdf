package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// The ledger over HTTP, for the embedded store: its ledger lives in the rate
// limit service's memory, so `budgetgen report --service URL` reads it from
// the service's debug port instead of from Valkey. Two read-only endpoints:
//
//	GET <base>/ledger/rules?day=N[&day=M...]        {"rules":[{"domain":...,"rule":...}]}
//	GET <base>/ledger/day?domain=D&rule=R&day=N     DayData as JSON
//
// Days are days since the Unix epoch (Day).

// maxDaysPerRequest bounds the day parameters of one rules request.
const maxDaysPerRequest = 400

type httpRule struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
}

type httpDay struct {
	Domain         string            `json:"domain"`
	Rule           string            `json:"rule"`
	Day            Day               `json:"day"`
	Usage          map[string]uint64 `json:"usage"`
	ShadowDenials  uint64            `json:"shadowDenials"`
	EnforceDenials uint64            `json:"enforceDenials"`
}

// Handler serves r's data under /ledger/ (mount it at "/ledger/").
func Handler(r Reader) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ledger/rules", func(w http.ResponseWriter, req *http.Request) {
		days, err := parseDays(req.URL.Query()["day"])
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rules, err := r.Rules(req.Context(), days)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out := struct {
			Rules []httpRule `json:"rules"`
		}{Rules: make([]httpRule, 0, len(rules))}
		for _, rule := range rules {
			out.Rules = append(out.Rules, httpRule(rule))
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /ledger/day", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		days, err := parseDays(q["day"])
		if err != nil || len(days) != 1 || q.Get("domain") == "" || q.Get("rule") == "" {
			http.Error(w, "want domain, rule and one day", http.StatusBadRequest)
			return
		}
		d, err := r.Read(req.Context(), RuleID{Domain: q.Get("domain"), Rule: q.Get("rule")}, days[0])
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, httpDay{Domain: d.Rule.Domain, Rule: d.Rule.Rule, Day: d.Day, Usage: d.Usage,
			ShadowDenials: d.ShadowDenials, EnforceDenials: d.EnforceDenials})
	})
	return mux
}

func parseDays(vals []string) ([]Day, error) {
	if len(vals) > maxDaysPerRequest {
		return nil, fmt.Errorf("at most %d days", maxDaysPerRequest)
	}
	days := make([]Day, 0, len(vals))
	for _, v := range vals {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("day %q: want days since the Unix epoch", v)
		}
		days = append(days, Day(n))
	}
	return days, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// HTTPReader reads a ledger served by Handler (a rate limit service's debug
// port, for example http://127.0.0.1:6070).
type HTTPReader struct {
	// Base is the server's URL, without /ledger.
	Base string
	// Client defaults to http.DefaultClient; bound its timeout or use a
	// context with a deadline.
	Client *http.Client
	// MaxPrincipals per rule-day; default DefaultMaxPrincipals.
	MaxPrincipals int
}

var _ Reader = (*HTTPReader)(nil)

// Rules implements Reader.
func (h *HTTPReader) Rules(ctx context.Context, days []Day) ([]RuleID, error) {
	q := url.Values{}
	for _, d := range days {
		q.Add("day", strconv.Itoa(int(d)))
	}
	var out struct {
		Rules []httpRule `json:"rules"`
	}
	if err := h.get(ctx, "/ledger/rules?"+q.Encode(), 64<<20, &out); err != nil {
		return nil, err
	}
	m := map[RuleID]bool{}
	for _, r := range out.Rules {
		m[RuleID(r)] = true
	}
	return sortRules(m), nil
}

// Read implements Reader.
func (h *HTTPReader) Read(ctx context.Context, rule RuleID, day Day) (DayData, error) {
	max := h.MaxPrincipals
	if max <= 0 {
		max = DefaultMaxPrincipals
	}
	q := url.Values{"domain": {rule.Domain}, "rule": {rule.Rule}, "day": {strconv.Itoa(int(day))}}
	var d httpDay
	// A principal and its count take well under 512 bytes of JSON unless
	// the principal is itself that long; the count check below is the
	// real bound.
	if err := h.get(ctx, "/ledger/day?"+q.Encode(), int64(max)*512+1<<20, &d); err != nil {
		return DayData{}, err
	}
	if len(d.Usage) > max {
		return DayData{}, fmt.Errorf("%w: %s %s has %d principals, limit %d", ErrTooMany, rule, day, len(d.Usage), max)
	}
	if d.Usage == nil {
		d.Usage = map[string]uint64{}
	}
	return DayData{Rule: rule, Day: day, Usage: d.Usage, ShadowDenials: d.ShadowDenials, EnforceDenials: d.EnforceDenials}, nil
}

func (h *HTTPReader) get(ctx context.Context, path string, limit int64, v any) error {
	c := h.Client
	if c == nil {
		c = http.DefaultClient
	}
	u := strings.TrimSuffix(h.Base, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("ledger %s: %w", h.Base, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("ledger %s unreachable: %w", h.Base, err)
	}
	defer func() { _ = resp.Body.Close() }() // response read or abandoned; nothing to report
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("ledger %s: no ledger served there (404): is it the debug port of a rate limit service using its embedded store?", h.Base)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("ledger %s: %s: %s", h.Base, resp.Status, strings.TrimSpace(string(msg)))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return fmt.Errorf("ledger %s: read: %w", h.Base, err)
	}
	if int64(len(body)) > limit {
		return fmt.Errorf("%w: ledger %s answered more than %d bytes", ErrTooMany, h.Base, limit)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("ledger %s: %w", h.Base, errors.Join(errors.New("malformed answer"), err))
	}
	return nil
}
