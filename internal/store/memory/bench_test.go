package memory

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// BenchmarkCharge: parallel charges over 10,000 principals, 1 and 3 counters
// per call (3 = e.g. a per-user, a per-team and a global budget).
func BenchmarkCharge(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "bg1|default/llm|rule-0|user|u" + strconv.Itoa(i) + "|86400|1764460800"
	}
	for _, n := range []int{1, 3} {
		b.Run("counters="+strconv.Itoa(n), func(b *testing.B) {
			s := New(Options{})
			defer s.Close()
			exp := time.Now().Add(time.Hour)
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				cs := make([]store.Counter, n)
				totals := make([]store.Result, n)
				ctx := context.Background()
				for pb.Next() {
					i := next.Add(1)
					for j := range cs {
						cs[j] = store.Counter{Key: keys[(i+uint64(j)*3331)%uint64(len(keys))], Hits: 1, ExpireAt: exp}
					}
					if err := s.Charge(ctx, cs, totals); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
