package observe

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
)

// TestStoreWatchLogsOutageOnce: failures log one WARN; answers inside the
// quiet period (and cached ones, which prove nothing) log nothing; the
// first store answer after it logs one INFO with the outage's length and
// the failure policy's answers; a second outage is logged again.
func TestStoreWatchLogsOutageOnce(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	w := &StoreWatch{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Store: "valkey standalone 127.0.0.1:1", Quiet: time.Second, Now: func() time.Time { return now }}
	ctx := context.Background()
	answered := func(cached bool) {
		w.Descriptor(ctx, &Descriptor{Item: &decide.Item{Cached: cached}, Now: now})
	}
	answered(false) // healthy: nothing to say
	for range 3 {
		w.Request(ctx, &Request{Class: RequestOK, FailurePolicy: "allow"})
		now = now.Add(200 * time.Millisecond)
	}
	answered(false) // 200 ms after the last failure: still inside the quiet period
	now = now.Add(2 * time.Second)
	answered(true) // the over-limit cache answered: says nothing about the store
	if got := strings.Count(buf.String(), "\n"); got != 1 || !strings.Contains(buf.String(), "level=WARN msg=\"counter store failing") {
		t.Fatalf("log during the outage:\n%s", buf.String())
	}
	answered(false)
	answered(false)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], `level=INFO msg="counter store answering again"`) ||
		!strings.Contains(lines[1], "outage=400ms") || !strings.Contains(lines[1], "failure_policy_answers=3") ||
		!strings.Contains(lines[1], `store="valkey standalone 127.0.0.1:1"`) {
		t.Fatalf("log after recovery:\n%s", buf.String())
	}
	w.Request(ctx, &Request{Class: RequestUnavailable, FailurePolicy: "error"})
	if n := strings.Count(buf.String(), "counter store failing"); n != 2 {
		t.Fatalf("second outage logged %d times:\n%s", n, buf.String())
	}
}
