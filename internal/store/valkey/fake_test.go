package valkey

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// fakeClient is a valkey-go stand-in whose DoMulti is a function field.
type fakeClient struct {
	do                    func(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult
	inFlight, maxInFlight atomic.Int64
	closed                atomic.Bool
}

// B returns the builder of a real standalone valkey-go client.
func (f *fakeClient) B() valkey.Builder { return standaloneBuilder() }

func (f *fakeClient) Close() { f.closed.Store(true) }
func (f *fakeClient) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	n := f.inFlight.Add(1)
	for {
		m := f.maxInFlight.Load()
		if n <= m || f.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	defer f.inFlight.Add(-1)
	return f.do(ctx, multi...)
}

// standaloneBuilder is a real standalone client's command builder. valkey-go
// hands one out only from a connected client (its mock module is not on the
// module proxy), so the client dials an in-memory connection whose peer
// answers the handshake as a RESP3 server, and is closed at once: the builder
// is a value and outlives it.
var standaloneBuilder = sync.OnceValue(func() valkey.Builder {
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:       []string{"in-memory:0"},
		ForceSingleClient: true, // no CLUSTER probe: the builder of a standalone client
		DisableCache:      true, // no CLIENT TRACKING in the handshake
		ClientSetInfo:     valkey.DisableClientSetInfo,
		DialCtxFn: func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
			conn, peer := net.Pipe()
			go answerHello(peer)
			return conn, nil
		},
	})
	if err != nil {
		panic(fmt.Sprintf("in-memory valkey-go client: %v", err))
	}
	defer c.Close()
	return c.B()
})

// answerHello answers, as a RESP3 server would, the client's HELLO 3 with
// the one field valkey-go checks (proto 3), and the PING its Close sends
// with PONG, until the client hangs up.
func answerHello(peer net.Conn) {
	defer func() { _ = peer.Close() }() // in-memory; nothing to report
	r := bufio.NewReader(peer)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		reply := "+PONG\r\n"
		if strings.EqualFold(cmd, "HELLO") {
			reply = "%1\r\n+proto\r\n:3\r\n"
		}
		if _, err := peer.Write([]byte(reply)); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings and returns its first.
func readCommand(r *bufio.Reader) (string, error) {
	head, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "*")))
	if err != nil {
		return "", fmt.Errorf("not a RESP array: %q", head)
	}
	var name string
	for i := 0; i < n; i++ { // each argument: its $length line, then itself
		if _, err := r.ReadString('\n'); err != nil {
			return "", err
		}
		arg, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		if i == 0 {
			name = strings.TrimSpace(arg)
		}
	}
	return name, nil
}

func errResults(n int, err error) []valkey.ValkeyResult {
	out := make([]valkey.ValkeyResult, n)
	for i := range out {
		out[i] = valkey.NewErrorResult(err)
	}
	return out
}

// TestDeadlineWhenClientIgnoresContext: valkey-go's ring can block a call
// past its context when full. Here the client blocks every call until
// released, ignoring contexts, and a burst of 1000 calls must still return
// by their deadline, with at most MaxInFlight calls handed to the client.
func TestDeadlineWhenClientIgnoresContext(t *testing.T) {
	release := make(chan struct{})
	dialErr := &setupError{err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
	f := &fakeClient{do: func(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
		<-release
		return errResults(len(multi), dialErr)
	}}
	logger, _ := testLogger(t)
	s, err := NewWithClient(f, Options{MaxInFlight: 64, Logger: logger, ReplayInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const callers = 1000
	const deadline = 20 * time.Millisecond
	lat := make([]time.Duration, callers)
	ctl := make([]time.Duration, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	var start sync.WaitGroup
	start.Add(1)
	exp := time.Now().Add(time.Hour)
	for i := 0; i < callers; i++ {
		// A control goroutine per caller only waits for the same deadline:
		// the store is held to how fast this machine wakes them, not to zero.
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			start.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			t0 := time.Now()
			<-ctx.Done()
			ctl[i] = time.Since(t0)
		}(i)
		go func(i int) {
			defer wg.Done()
			start.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			t0 := time.Now()
			errs[i] = s.Charge(ctx, []store.Counter{{Key: "k", Hits: 1, ExpireAt: exp}}, make([]store.Result, 1))
			lat[i] = time.Since(t0)
		}(i)
	}
	start.Done()
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(ctl, func(i, j int) bool { return ctl[i] < ctl[j] })
	p99, worst := lat[callers*99/100], lat[callers-1]
	cp99, cworst := max(deadline, ctl[callers*99/100])+raceSlack, max(deadline, ctl[callers-1])+raceSlack
	t.Logf("burst of %d calls, client stalled: p99 %v, max %v; control goroutines: p99 %v, max %v", callers, p99, worst, cp99, cworst)
	// The control goroutines only sleep; the store's callers also need CPU
	// after waking (slot, buffer, result), so on a loaded machine they lag
	// the control by about the control's own lateness again. When that
	// measured scheduling delay exceeds the slack, the slack grows to it. A
	// store that waited on the stalled client would never return (the
	// client is released only after every call has).
	p99Bound, maxBound := cp99+max(p99Slack, ctl[callers*99/100]-deadline), cworst+max(maxSlack, ctl[callers-1]-deadline)
	if p99Bound > cp99+p99Slack || maxBound > cworst+maxSlack {
		t.Logf("slack widened to the control's scheduling delay in this run: p99 bound %v, max bound %v", p99Bound, maxBound)
	}
	if p99 > p99Bound || worst > maxBound {
		t.Fatalf("calls outlived their %v deadline: p99 %v (bound %v), max %v (bound %v)", deadline, p99, p99Bound, worst, maxBound)
	}
	for i, err := range errs {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("call %d: err = %v, want ErrUnavailable", i, err)
		}
	}
	if m := f.maxInFlight.Load(); m != 64 {
		t.Fatalf("client saw %d concurrent calls, want exactly MaxInFlight 64", m)
	}
	// On a loaded machine (CI under -race) a caller may reach Charge after
	// its deadline: it is refused on entry and charges nothing (Canceled).
	st := s.Stats()
	charged := callers - st.Canceled
	if st.NoSlot+st.Canceled != callers-64 || st.Buffered != st.NoSlot || st.InFlight != 64 {
		t.Fatalf("stats while stalled = %+v", st)
	}
	close(release) // the stalled calls now fail with a refused dial: buffered too
	waitUntil(t, time.Second, func() bool { return s.Stats().InFlight == 0 })
	st = s.Stats()
	if st.Buffered != charged || st.BufferKeys != 1 || st.Ambiguous != 0 || st.Lost != 0 {
		t.Fatalf("stats after release = %+v (%d callers charged)", st, charged)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing with charges still buffered (the fake never answers PING)
	// counts them as lost.
	if st := s.Stats(); st.Lost != charged || !f.closed.Load() {
		t.Fatalf("after Close: %+v, client closed %v", st, f.closed.Load())
	}
}

// TestClassification: what a failed INCRBY means for the buffer.
func TestClassification(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want outcome
	}{
		{"refused dial", &net.OpError{Op: "dial", Err: errors.New("refused")}, notApplied},
		{"handshake", &setupError{err: io.EOF}, notApplied},
		{"reply lost", io.EOF, maybeApplied},
		{"timeout", context.DeadlineExceeded, maybeApplied},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("%s: classify = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// TestShortReplyCountedAmbiguous: a reply that is not one result per command
// tells nothing of what was applied: the call's hits (and its ledger
// increments) are counted ambiguous, never dropped with no class.
func TestShortReplyCountedAmbiguous(t *testing.T) {
	f := &fakeClient{do: func(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
		return errResults(len(multi)-1, errors.New("short"))
	}}
	logger, _ := testLogger(t)
	s, err := NewWithClient(f, Options{Logger: logger, ReplayInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	cs := []store.Counter{{Key: "a", Hits: 3, ExpireAt: exp, Ledger: store.HashIncr{Key: "h", Field: "f"}}, {Key: "b", Hits: 0, ExpireAt: exp}, {Key: "c", Hits: 4, ExpireAt: exp}}
	err = s.Charge(context.Background(), cs, make([]store.Result, len(cs)))
	if !errors.Is(err, store.ErrMalformedReply) {
		t.Fatalf("err = %v, want ErrMalformedReply", err)
	}
	if st := s.Stats(); st.Ambiguous != 7 || st.LedgerAmbiguous != 3 || st.Buffered != 0 || st.Lost != 0 {
		t.Fatalf("ambiguous %d, ledger ambiguous %d, buffered %d, lost %d; want 7, 3, 0, 0", st.Ambiguous, st.LedgerAmbiguous, st.Buffered, st.Lost)
	}
}

// TestChargeAfterCloseCountedLost: Charge or Defer after Close breaks the
// contract, but the hits are counted (Lost), not dropped with no class or
// left in a buffer nothing replays.
func TestChargeAfterCloseCountedLost(t *testing.T) {
	f := &fakeClient{do: func(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
		return errResults(len(multi), errors.New("unexpected call"))
	}}
	logger, _ := testLogger(t)
	s, err := NewWithClient(f, Options{Logger: logger, ReplayInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	err = s.Charge(context.Background(), []store.Counter{{Key: "a", Hits: 5, ExpireAt: time.Now().Add(time.Hour)}}, make([]store.Result, 1))
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	s.Defer([]store.Counter{{Key: "b", Hits: 2, ExpireAt: time.Now().Add(time.Hour)}})
	if st := s.Stats(); st.Lost != 7 || st.Buffered != 0 {
		t.Fatalf("lost %d, buffered %d; want 7 (5 charged, 2 deferred after Close), 0", st.Lost, st.Buffered)
	}
}
