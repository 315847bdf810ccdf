package memory

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/store"
)

// BenchmarkMillionPrincipals measures the memory of 1,000,000 day counters
// (one principal each, keys of the service's default format) with their
// usage-ledger fields, as the service holds them: live heap after GC and
// RSS, per counter, under the service's default GC_PERCENT=400 and under
// GOGC=100. Run with -benchtime 1x (docs/reliability.md has the numbers).
func BenchmarkMillionPrincipals(b *testing.B) {
	for _, gc := range []int{400, 100} {
		b.Run("gogc="+strconv.Itoa(gc), func(b *testing.B) {
			for range b.N {
				millionPrincipals(b, gc)
			}
		})
	}
}

func millionPrincipals(b *testing.B, gc int) {
	const n = 1_000_000
	defer debug.SetGCPercent(debug.SetGCPercent(gc))
	runtime.GC()
	debug.FreeOSMemory()
	heap0, rss0 := liveHeap(), rss(b)
	lm := ledger.NewMemory("", nil)
	lm.MaxFields = 2 * n
	s := New(Options{MaxCounters: n + 1, Ledger: lm, SweepInterval: time.Hour})
	defer s.Close()
	exp := time.Now().Add(24 * time.Hour)
	uk := ledger.UsageKey("", ledger.RuleID{Domain: "default/llm", Rule: "per-user"}, ledger.DayOf(time.Now()))
	cs := make([]store.Counter, 1)
	totals := make([]store.Result, 1)
	ctx := context.Background()
	var peak int64
	for i := range n {
		u := "user-" + strconv.Itoa(1_000_000+i) + "@example.com"
		cs[0] = store.Counter{Key: "bg1|default/llm|per-user|x-user-id|" + u + "|86400|1764460800", Hits: 1, ExpireAt: exp, Ledger: store.HashIncr{Key: uk, Field: u}}
		if err := s.Charge(ctx, cs, totals); err != nil {
			b.Fatal(err)
		}
		if i%100_000 == 0 {
			peak = max(peak, rss(b))
		}
	}
	peak = max(peak, rss(b))
	heap1 := liveHeap()
	b.ReportMetric(float64(heap1-heap0)/n, "live-heap-B/counter")
	b.ReportMetric(float64(peak-rss0)/n, "peak-rss-B/counter")
	b.ReportMetric(float64(peak)/(1<<20), "peak-rss-MiB")
	runtime.KeepAlive(s)
	runtime.KeepAlive(lm)
}

func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// rss is VmRSS from /proc/self/status, in bytes.
func rss(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
