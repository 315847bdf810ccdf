package unarygrpc

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// TestStormOfCallsAndCancels: 48 callers on 3 connections for 2 s, with
// random sizes, slow handlers and deadlines from 0 to 20 ms on seven calls
// in eight (so a share of calls is reset mid-flight, some while their answer
// is being written) and none on the eighth (answered however busy the
// machine):
// every answer received is the right one, no other error, and afterwards
// the server holds no stream and no request byte.
func TestStormOfCallsAndCancels(t *testing.T) {
	ts := serve(t, Options{Workers: 2}, map[string]Handler{"/t.S/Echo": func(ctx context.Context, req, dst []byte) ([]byte, error) {
		if len(req) > 0 && req[0]%7 == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(req[0]) * 10 * time.Microsecond):
			}
		}
		return echo(ctx, req, dst)
	}})
	var ccs []*grpc.ClientConn
	for i := 0; i < 3; i++ {
		ccs = append(ccs, dial(t, ts.addr))
	}
	deadline := time.Now().Add(2 * time.Second)
	var ok, canceled, other atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 48; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(deadline) {
				n := rng.IntN(3000)
				req := make([]byte, n)
				for i := range req {
					req[i] = byte(rng.IntN(256))
				}
				// One call in eight has no deadline and must be answered: on
				// a loaded machine (-race, a CPU hog beside it) 48 callers
				// queue for longer than 20 ms and nearly every deadline
				// passes, so the answers the test checks cannot rest on
				// the deadlines alone.
				var ctx context.Context
				var cancel context.CancelFunc
				if rng.IntN(8) == 0 {
					ctx, cancel = context.WithCancel(context.Background())
				} else {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(20000))*time.Microsecond)
				}
				out, err := call(ctx, ccs[g%3], "/t.S/Echo", req)
				cancel()
				switch {
				case err == nil:
					if string(out) != string(reversed(req)) {
						t.Errorf("wrong answer")
						return
					}
					ok.Add(1)
				case ctx.Err() != nil:
					canceled.Add(1)
				default:
					other.Add(1)
					t.Errorf("call failed: %v", err)
				}
			}
		}(g)
	}
	wg.Wait()
	t.Logf("ok %d canceled %d other %d", ok.Load(), canceled.Load(), other.Load())
	// After the storm, the server still answers and holds no streams.
	if _, err := call(context.Background(), ccs[0], "/t.S/Echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if ok.Load() == 0 || canceled.Load() == 0 {
		t.Fatalf("the storm did not mix answers (%d) and cancels (%d)", ok.Load(), canceled.Load())
	}
	// Streams reset last are removed as their handlers return: wait for it
	// (a stream or byte leaked stays, and the wait fails).
	for deadline := time.Now().Add(waitBound); ; time.Sleep(time.Millisecond) {
		streams, held := serverStreams(ts.s), serverHeld(ts.s)
		if streams == 0 && held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server holds %d streams and %d request bytes %v after the storm", streams, held, waitBound)
		}
	}
}
