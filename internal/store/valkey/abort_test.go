package valkey

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// abortingClient answers its first script call as valkey-go's pipe does
// when the call's context ends before the reply (pipe.go, DoMulti's abort
// path): a context error at once, while the commands stay queued and are
// written later. It keeps the slice it was handed and a copy of what it
// held, so the test can tell whether the store reused the slice meanwhile.
type abortingClient struct {
	valkey.Client
	mu       sync.Mutex
	kept     []valkey.Completed // the slice handed to DoMulti, as the pipe's ring keeps it
	snapshot [][]string         // what it held then
}

func (a *abortingClient) DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	a.mu.Lock()
	first := a.kept == nil && len(cmds) > 0 && cmds[0].Commands()[0] != "PING"
	if first {
		a.kept = cmds
		for _, c := range cmds {
			a.snapshot = append(a.snapshot, slices.Clone(c.Commands()))
		}
	}
	a.mu.Unlock()
	if !first {
		return a.Client.DoMulti(ctx, cmds...)
	}
	res := make([]valkey.ValkeyResult, len(cmds))
	for i := range res {
		res[i] = valkey.NewErrorResult(context.DeadlineExceeded)
	}
	return res
}

// TestAbortedCallKeepsItsCommands: a call valkey-go gave up on by its
// context still has its commands in the client's queue, to be written
// later; the store must not clear or reuse that slice for the next calls
// (found as a nil-pointer panic in valkey-go's background writer while
// Valkey was killed under load). The kept commands must stay intact
// through many later calls, and the aborted call is still settled: its
// hits are replayed once under its id.
func TestAbortedCallKeepsItsCommands(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	ac := &abortingClient{Client: realClient(t, srv.Addr)}
	s := storeOver(t, ac, Options{Addresses: []string{srv.Addr}, ReplayInterval: 5 * time.Millisecond, StallAfter: -1})
	exp := time.Now().Add(time.Hour)
	ctx := context.Background()
	if err := s.Charge(ctx, []store.Counter{{Key: "abort:first", Hits: 3, ExpireAt: exp}}, make([]store.Result, 1)); err == nil {
		t.Fatal("the aborted call answered without error")
	}
	for i := range 200 {
		cs := []store.Counter{{Key: "abort:k" + strconv.Itoa(i%7), Hits: 1, ExpireAt: exp}, {Key: "abort:j", Hits: 2, ExpireAt: exp}}
		if err := s.Charge(ctx, cs, make([]store.Result, len(cs))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	ac.mu.Lock()
	for i, c := range ac.kept {
		if got := c.Commands(); !slices.Equal(got, ac.snapshot[i]) {
			t.Errorf("kept command %d changed after the store gave it up: %q, was %q", i, got, ac.snapshot[i])
		}
	}
	ac.mu.Unlock()
	waitUntil(t, 5*time.Second, func() bool { st := s.Stats(); return st.AmbiguousApplied+st.AmbiguousReplayed == 3 })
	if got, _ := srv.Do("GET", "abort:first"); got != "3" {
		t.Errorf("abort:first = %q after the replay, want 3", got)
	}
}
