package ledger

import (
	"context"
	"errors"
	"io"
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
	// Other windows, with a principal's reservation denial.
	mw := WindowAt(PeriodMonth, now, nil)
	u = rec.UsageIn(r1, "carol", mw, 5)
	mem.HIncrBy(u.Key, u.Field, u.Tokens)
	rec.DeniedIn(r1, mw, Denial{Principal: "carol", Shadow: true, Reserve: true})
	rec.HoldsIn(r1, mw, Holds{Count: 4, Held: 200, Expired: 50})
	hw := WindowAt(PeriodHour, now, nil)
	u = rec.UsageIn(r0, "bob", hw, 3)
	mem.HIncrBy(u.Key, u.Field, u.Tokens)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(mem))
	defer srv.Close()
	h := &HTTPReader{Base: srv.URL + "/"}
	days := []Window{DayWindow(DayOf(now) - 2), DayWindow(DayOf(now) - 1), DayWindow(DayOf(now)), mw, hw}
	want, err := ReadAll(ctx, mem, days)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadAll(ctx, h, days)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 5 || !reflect.DeepEqual(got, want) {
		t.Fatalf("over HTTP %+v\ndirect %+v", got, want)
	}
	all, err := ReadAll(ctx, h, nil)
	if err != nil || !reflect.DeepEqual(all, want) {
		t.Fatalf("every window over HTTP: %v %+v", err, all)
	}
	if m := want[4]; m.Window != mw || m.Denials != (Denials{Shadow: 1, Reserve: 1}) || m.PrincipalDenials["carol"] != (Denials{Shadow: 1, Reserve: 1}) || m.Holds != (Holds{Count: 4, Held: 200, Expired: 50}) {
		t.Fatalf("month window: %+v", m)
	}
	checkHoldsJSON(t, srv.URL, hw, mw)
	// Bounds and errors are clear.
	h.MaxPrincipals = 2
	if _, err := h.Read(ctx, r0, DayWindow(DayOf(now))); !errors.Is(err, ErrTooMany) {
		t.Fatalf("bound: %v", err)
	}
	notLedger := httptest.NewServer(http.NotFoundHandler())
	defer notLedger.Close()
	if _, err := (&HTTPReader{Base: notLedger.URL}).Keys(ctx, days); err == nil || !strings.Contains(err.Error(), "no ledger served there") {
		t.Fatalf("404: %v", err)
	}
	for _, q := range []string{"/ledger/keys?window=x", "/ledger/window?domain=a&rule=b", "/ledger/window?domain=a&window=20261019", "/ledger/window?domain=a&rule=b&window=w20261020"} {
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

// checkHoldsJSON: a window without holds says nothing of them (an older
// reader's JSON is unchanged), one with holds names them.
func checkHoldsJSON(t *testing.T, base string, without, with Window) {
	t.Helper()
	for q, wantHolds := range map[string]bool{
		"/ledger/window?domain=ns/pol&rule=ns/pol/rule/0&window=" + without.ID(): false,
		"/ledger/window?domain=ns/pol&rule=ns/pol/rule/1&window=" + with.ID():    true,
	} {
		resp, err := http.Get(base + q)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.Contains(string(body), `"holds":{"count":4,"held":200,"expired":50}`); got != wantHolds {
			t.Errorf("%s: %s", q, body)
		}
		if !wantHolds && strings.Contains(string(body), "holds") {
			t.Errorf("%s names holds it has not: %s", q, body)
		}
	}
}
