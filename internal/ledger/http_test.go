package ledger

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestHTTPReaderRoundTrip: the embedded store's ledger read over HTTP is the
// ledger read directly, rule by rule and day by day.
func TestHTTPReaderRoundTrip(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 10, 17, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := NewMemory("p_", clock)
	rec, err := NewRecorder(Options{Prefix: "p_"}, mem, clock)
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 := RuleID{"ns/pol", "ns/pol/rule/0"}, RuleID{"ns/pol", "ns/pol/rule/1"}
	for i, p := range []string{"alice@example.com", "bob", "weird \"name\"\n%", "alice@example.com"} {
		u := rec.Usage(r0, p, now, uint64(100*(i+1)))
		mem.HIncrBy(u.Key, u.Field, u.Tokens)
	}
	u := rec.Usage(r1, "carol", now.Add(-24*time.Hour), 9)
	mem.HIncrBy(u.Key, u.Field, u.Tokens)
	rec.Denied(r0, now, true)
	rec.Denied(r1, now, false)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(mem))
	defer srv.Close()
	h := &HTTPReader{Base: srv.URL + "/"}
	days := []Day{DayOf(now) - 2, DayOf(now) - 1, DayOf(now)}
	want, err := ReadAll(ctx, mem, days)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadAll(ctx, h, days)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 3 || !reflect.DeepEqual(got, want) {
		t.Fatalf("over HTTP %+v\ndirect %+v", got, want)
	}
	// Bounds and errors are clear.
	h.MaxPrincipals = 2
	if _, err := h.Read(ctx, r0, DayOf(now)); !errors.Is(err, ErrTooMany) {
		t.Fatalf("bound: %v", err)
	}
	notLedger := httptest.NewServer(http.NotFoundHandler())
	defer notLedger.Close()
	if _, err := (&HTTPReader{Base: notLedger.URL}).Rules(ctx, days); err == nil || !strings.Contains(err.Error(), "no ledger served there") {
		t.Fatalf("404: %v", err)
	}
	for _, q := range []string{"/ledger/rules?day=x", "/ledger/day?domain=a&rule=b", "/ledger/day?domain=a&day=1"} {
		resp, err := http.Get(srv.URL + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %s, want 400", q, resp.Status)
		}
	}
}
