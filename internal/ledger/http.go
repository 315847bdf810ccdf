package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// The ledger over HTTP, for the embedded store: its ledger lives in the rate
// limit service's memory, so `budgetgen report --service URL` reads it from
// the service's debug port instead of from Valkey. Two read-only endpoints:
//
//	GET <base>/ledger/keys[?window=ID&window=ID...]     {"keys":[{"domain":...,"rule":...,"window":ID}]}
//	GET <base>/ledger/window?domain=D&rule=R&window=ID  one rule-window's Data as JSON:
//	    {"domain","rule","window","usage":{principal:n},"denials":{"shadow","enforce","reserve"},
//	     "principalDenials":{principal:{...}},"holds":{"count","held","expired"}}
//
// ID is Window.ID (20261019, h2026101914, w20261019, m202610); no window
// parameter lists every rule-window.

// maxWindowsPerRequest bounds the window parameters of one keys request.
const maxWindowsPerRequest = 5000

type httpKey struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	Window string `json:"window"`
}

type httpDenials struct {
	Shadow  uint64 `json:"shadow,omitempty"`
	Enforce uint64 `json:"enforce,omitempty"`
	Reserve uint64 `json:"reserve,omitempty"`
}

// httpHolds are a window's reservation totals (absent when none, so a
// reader of an older service reads zeros).
type httpHolds struct {
	Count   uint64 `json:"count,omitempty"`
	Held    uint64 `json:"held,omitempty"`
	Expired uint64 `json:"expired,omitempty"`
}

type httpData struct {
	httpKey
	Usage            map[string]uint64      `json:"usage"`
	Denials          httpDenials            `json:"denials"`
	PrincipalDenials map[string]httpDenials `json:"principalDenials,omitempty"`
	Holds            httpHolds              `json:"holds,omitzero"`
}

// Handler serves r's data under /ledger/ (mount it at "/ledger/").
func Handler(r Reader) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ledger/keys", func(w http.ResponseWriter, req *http.Request) {
		ws, err := parseWindows(req.URL.Query()["window"])
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		keys, err := r.Keys(req.Context(), ws)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out := struct {
			Keys []httpKey `json:"keys"`
		}{Keys: make([]httpKey, 0, len(keys))}
		for _, k := range keys {
			out.Keys = append(out.Keys, httpKey{Domain: k.Rule.Domain, Rule: k.Rule.Rule, Window: k.Window.ID()})
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /ledger/window", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		ws, err := parseWindows(q["window"])
		if err != nil || len(ws) != 1 || q.Get("domain") == "" || q.Get("rule") == "" {
			http.Error(w, "want domain, rule and one window", http.StatusBadRequest)
			return
		}
		d, err := r.Read(req.Context(), RuleID{Domain: q.Get("domain"), Rule: q.Get("rule")}, ws[0])
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out := httpData{httpKey: httpKey{Domain: d.Rule.Domain, Rule: d.Rule.Rule, Window: d.Window.ID()}, Usage: d.Usage, Denials: httpDenials(d.Denials), Holds: httpHolds(d.Holds)}
		if len(d.PrincipalDenials) > 0 {
			out.PrincipalDenials = map[string]httpDenials{}
			for p, pd := range d.PrincipalDenials {
				out.PrincipalDenials[p] = httpDenials(pd)
			}
		}
		writeJSON(w, out)
	})
	return mux
}

// parseWindows reads window IDs; none is nil (every window).
func parseWindows(vals []string) ([]Window, error) {
	if len(vals) > maxWindowsPerRequest {
		return nil, fmt.Errorf("at most %d windows", maxWindowsPerRequest)
	}
	if len(vals) == 0 {
		return nil, nil
	}
	ws := make([]Window, 0, len(vals))
	for _, v := range vals {
		w, ok := ParseWindowID(v)
		if !ok {
			return nil, fmt.Errorf("window %q: want an ID such as 20261019, h2026101914, w20261019 or m202610", v)
		}
		ws = append(ws, w)
	}
	return ws, nil
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

// Keys implements Reader. Windows are sent in requests of at most
// maxWindowsPerRequest.
func (h *HTTPReader) Keys(ctx context.Context, windows []Window) ([]Key, error) {
	found := map[Key]bool{}
	for start := 0; start == 0 || start < len(windows); start += maxWindowsPerRequest {
		q := url.Values{}
		for _, w := range windows[start:min(start+maxWindowsPerRequest, len(windows))] {
			q.Add("window", w.ID())
		}
		var out struct {
			Keys []httpKey `json:"keys"`
		}
		if err := h.get(ctx, "/ledger/keys?"+q.Encode(), 64<<20, &out); err != nil {
			return nil, err
		}
		for _, k := range out.Keys {
			w, ok := ParseWindowID(k.Window)
			if !ok {
				return nil, fmt.Errorf("ledger %s: malformed window %q", h.Base, k.Window)
			}
			found[Key{Rule: RuleID{Domain: k.Domain, Rule: k.Rule}, Window: w}] = true
		}
		if len(windows) == 0 {
			break
		}
	}
	return sortKeys(found), nil
}

// Read implements Reader.
func (h *HTTPReader) Read(ctx context.Context, rule RuleID, w Window) (Data, error) {
	max := h.MaxPrincipals
	if max <= 0 {
		max = DefaultMaxPrincipals
	}
	q := url.Values{"domain": {rule.Domain}, "rule": {rule.Rule}, "window": {w.ID()}}
	var d httpData
	// A principal and its counts take well under 1 KiB of JSON unless the
	// principal is itself that long; the count check below is the real bound.
	if err := h.get(ctx, "/ledger/window?"+q.Encode(), int64(max)*1024+1<<20, &d); err != nil {
		return Data{}, err
	}
	if len(d.Usage) > max || len(d.PrincipalDenials) > max {
		return Data{}, fmt.Errorf("%w: %s %s has more than %d principals", ErrTooMany, rule, w, max)
	}
	out := Data{Rule: rule, Window: w, Usage: d.Usage, Denials: Denials(d.Denials), Holds: Holds(d.Holds)}
	if out.Usage == nil {
		out.Usage = map[string]uint64{}
	}
	if len(d.PrincipalDenials) > 0 {
		out.PrincipalDenials = map[string]Denials{}
		for p, pd := range d.PrincipalDenials {
			out.PrincipalDenials[p] = Denials(pd)
		}
	}
	return out, nil
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
