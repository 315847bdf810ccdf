package valkey

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

func benchKeys() []string {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "bg1|default/llm|rule-0|user|u" + strconv.Itoa(i) + "|86400|1764460800"
	}
	return keys
}

// BenchmarkCharge: parallel charges (64 goroutines) against a real Valkey on
// loopback over 10,000 principals, 1 and 3 counters per call (1 s deadline:
// this measures throughput and CPU, the fault tests measure deadlines),
// through the charge script under a call id (exactly once).
func BenchmarkCharge(b *testing.B) {
	srv := valkeytest.Start(b, valkeytest.Options{})
	keys := benchKeys()
	for _, n := range []int{1, 3} {
		b.Run("counters="+strconv.Itoa(n), func(b *testing.B) {
			s, err := New(Options{Addresses: []string{srv.Addr}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			exp := time.Now().Add(time.Hour)
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(32)
			// CPU per call, ours and Valkey's: on a shared machine wall time
			// per op says little, CPU time still compares.
			self0, srv0 := selfCPU(b), serverCPU(b, srv.Addr)
			defer func() {
				b.ReportMetric(float64(selfCPU(b)-self0)/float64(b.N)/1e3, "client-cpu-us/op")
				b.ReportMetric(float64(serverCPU(b, srv.Addr)-srv0)/float64(b.N)/1e3, "valkey-cpu-us/op")
			}()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				cs := make([]store.Counter, n)
				totals := make([]store.Result, n)
				for pb.Next() {
					i := next.Add(1)
					for j := range cs {
						cs[j] = store.Counter{Key: keys[(i+uint64(j)*3331)%uint64(len(keys))], Hits: 1, ExpireAt: exp}
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					err := s.Charge(ctx, cs, totals)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkRawDoMulti is the floor: the same commands through valkey-go
// directly on the caller's goroutine, with no in-flight cap, no goroutine per
// call and no outage handling. The difference to BenchmarkCharge is the price
// of never blocking past the deadline.
func BenchmarkRawDoMulti(b *testing.B) {
	srv := valkeytest.Start(b, valkeytest.Options{})
	keys := benchKeys()
	for _, n := range []int{1, 3} {
		b.Run("counters="+strconv.Itoa(n), func(b *testing.B) {
			c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			exp := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(32)
			self0, srv0 := selfCPU(b), serverCPU(b, srv.Addr)
			defer func() {
				b.ReportMetric(float64(selfCPU(b)-self0)/float64(b.N)/1e3, "client-cpu-us/op")
				b.ReportMetric(float64(serverCPU(b, srv.Addr)-srv0)/float64(b.N)/1e3, "valkey-cpu-us/op")
			}()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				cmds := make([]valkey.Completed, 0, 2*n)
				for pb.Next() {
					i := next.Add(1)
					cmds = cmds[:0]
					for j := 0; j < n; j++ {
						k := keys[(i+uint64(j)*3331)%uint64(len(keys))]
						cmds = append(cmds, c.B().Incrby().Key(k).Increment(1).Build(),
							c.B().Arbitrary("PEXPIREAT").Keys(k).Args(exp, "NX").Build())
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					for _, r := range c.DoMulti(ctx, cmds...) {
						if r.Error() != nil {
							b.Fatal(r.Error())
						}
					}
					cancel()
				}
			})
		})
	}
}

// selfCPU is this process's user+system CPU time in ns.
func selfCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// serverCPU is Valkey's used_cpu_user + used_cpu_sys in ns (INFO cpu).
func serverCPU(b *testing.B, addr string) int64 {
	out, err := valkeytest.Do(addr, "INFO", "cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", line, err)
			}
			total += f
		}
	}
	return int64(total * 1e9)
}

// BenchmarkChargeReserving: the llm mix of a reserving budget as the
// service's charger sends it: calls carrying 8 requests (its batching), each
// request two reserving counters (a budget and a frontier cap), a check
// (holds 50,000 if admitted) or the charge of a finished request (its
// tokens, one release, a ledger increment), over 10,000 principals. CPU per
// request, ours and Valkey's: Valkey runs the script and is the service's
// neighbour on the same cores.
func BenchmarkChargeReserving(b *testing.B) {
	srv := valkeytest.Start(b, valkeytest.Options{})
	for _, holds := range []bool{true, false} {
		b.Run("holds="+strconv.FormatBool(holds), func(b *testing.B) { benchLLMMix(b, srv, holds) })
	}
}

// benchLLMMix runs the llm mix, with the counters' holds or (the control)
// as a budget without a reserve.
func benchLLMMix(b *testing.B, srv *valkeytest.Server, holds bool) {
	keys := benchKeys()
	s, err := New(Options{Addresses: []string{srv.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	const perCall = 8
	var next atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(8)
	// The script's own time (EVALSHA's usec in commandstats) moves less
	// with the machine's noise than Valkey's process CPU, which also counts
	// its sockets: it is what compares two versions of the script.
	self0, srv0, script0 := selfCPU(b), serverCPU(b, srv.Addr), commandStat(b, srv.Addr, "evalsha", "usec")
	defer func() {
		b.ReportMetric(float64(selfCPU(b)-self0)/float64(b.N)/1e3, "client-cpu-us/req")
		b.ReportMetric(float64(serverCPU(b, srv.Addr)-srv0)/float64(b.N)/1e3, "valkey-cpu-us/req")
		b.ReportMetric(float64(commandStat(b, srv.Addr, "evalsha", "usec")-script0)/float64(b.N), "script-us/req")
	}()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		cs := make([]store.Counter, 0, 2*perCall)
		res := make([]store.Result, 2*perCall)
		for {
			cs = cs[:0]
			for r := 0; r < perCall; r++ {
				if !pb.Next() {
					break
				}
				i := next.Add(1)
				p := keys[(i/2)%uint64(len(keys))]
				for j, k := range []string{p, "frontier|" + p} {
					c := store.Counter{Key: k, ExpireAt: exp, Start: j == 0, Limit: 1 << 40, Enforce: true,
						Hold: store.Hold{Reserve: 50_000, Expiry: 10 * time.Minute}}
					if i%2 == 1 { // the request's charge
						c.Hits, c.Hold = 1_234, store.Hold{Release: 1, Expiry: 10 * time.Minute}
						c.Ledger = store.HashIncr{Key: "bench|ledger", Field: k}
					}
					if !holds {
						c.Hold, c.Limit, c.Enforce = store.Hold{}, 0, false
					}
					cs = append(cs, c)
				}
			}
			if len(cs) == 0 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := s.Charge(ctx, cs, res[:len(cs)])
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
