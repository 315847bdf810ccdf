package valkey

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// BenchmarkStallBurst compares a plain valkey-go client with this store
// during a SIGSTOP stall: 50 waves of 100 calls, 100 ms apart, each with a
// 10 ms deadline (5,000 calls, more than the plain client's 4 x 1024 ring
// slots), and goroutines that only wait for the same deadline (control). It
// reports the latency percentiles of the calls, not ns/op; run it
// with -benchtime 1x (each iteration is a 5 s stall):
//
//	go test ./pkg/store/valkey -run '^$' -bench StallBurst -benchtime 1x
func BenchmarkStallBurst(b *testing.B) {
	exp := time.Now().Add(time.Hour)
	b.Run("raw-valkey-go", func(b *testing.B) {
		srv := valkeytest.Start(b, valkeytest.Options{})
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true,
			ForceSingleClient: true, DisableRetry: true, ConnWriteTimeout: DefaultConnWriteTimeout})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		stallBurst(b, srv, func(ctx context.Context, key string) {
			c.DoMulti(ctx, c.B().Incrby().Key(key).Increment(1).Build(),
				c.B().Arbitrary("PEXPIREAT").Keys(key).Args(strconv.FormatInt(exp.UnixMilli(), 10), "NX").Build())
		})
	})
	// control: goroutines that only wait for the same deadline; the floor
	// this machine sets for 100 goroutines waking at once.
	b.Run("control", func(b *testing.B) {
		srv := valkeytest.Start(b, valkeytest.Options{})
		stallBurst(b, srv, func(ctx context.Context, key string) { <-ctx.Done() })
	})
	b.Run("store", func(b *testing.B) {
		srv := valkeytest.Start(b, valkeytest.Options{})
		s := mustNew(b, Options{Addresses: []string{srv.Addr}})
		stallBurst(b, srv, func(ctx context.Context, key string) {
			_ = s.Charge(ctx, []store.Counter{{Key: key, Hits: 1, ExpireAt: exp}}, make([]store.Result, 1))
		})
	})
}

func stallBurst(b *testing.B, srv *valkeytest.Server, call func(ctx context.Context, key string)) {
	var lat []time.Duration
	for n := 0; n < b.N; n++ {
		srv.Stop()
		var mu sync.Mutex
		start := time.Now()
		for w := 0; w < 50; w++ {
			var wg sync.WaitGroup
			for i := 0; i < 100; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
					defer cancel()
					t0 := time.Now()
					call(ctx, "burst:"+strconv.Itoa(i))
					d := time.Since(t0)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}(i)
			}
			wg.Wait()
			time.Sleep(time.Until(start.Add(time.Duration(w+1) * 100 * time.Millisecond))) // stays: one wave every 100 ms of the stall
		}
		srv.Cont()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}
