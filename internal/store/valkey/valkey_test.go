package valkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/storetest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// logBuf is a concurrency-safe log sink for assertions on what was logged.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testLogger(t testing.TB) (*slog.Logger, *logBuf) {
	lb := &logBuf{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

func mustNew(t testing.TB, opts Options) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger, _ = testLogger(t)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestBehaviourStandalone(t *testing.T) {
	t.Parallel() // its own servers; no fault, no timing bound but the behaviour suite's generous one
	srv := valkeytest.Start(t, valkeytest.Options{})
	storetest.Run(t, func(t *testing.T) store.Store { return mustNew(t, Options{Addresses: []string{srv.Addr}}) })
}

func TestCheckCreatesNoKey(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	exp := time.Now().Add(time.Hour)
	totals := make([]store.Result, 2)
	if err := s.Charge(context.Background(), []store.Counter{{Key: "a", ExpireAt: exp}, {Key: "b", Hits: 2, ExpireAt: exp}}, totals); err != nil {
		t.Fatal(err)
	}
	if out, _ := srv.Do("EXISTS", "a"); out != "0" {
		t.Fatalf("EXISTS a = %s after a check", out)
	}
	out, _ := srv.Do("PEXPIRETIME", "b")
	if out != fmt.Sprint(exp.UnixMilli()) {
		t.Fatalf("PEXPIRETIME b = %s, want %d", out, exp.UnixMilli())
	}
}

func TestMalformedCounter(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	if _, err := srv.Do("LPUSH", "list", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("SET", "text", "abc"); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	for _, c := range []store.Counter{{Key: "list", Hits: 1, ExpireAt: exp}, {Key: "list", ExpireAt: exp}, {Key: "text", ExpireAt: exp}, {Key: "text", Hits: 1, ExpireAt: exp}} {
		err := s.Charge(context.Background(), []store.Counter{c}, make([]store.Result, 1))
		if !errors.Is(err, store.ErrMalformedReply) {
			t.Errorf("counter %+v: err = %v, want ErrMalformedReply", c, err)
		}
	}
	if st := s.Stats(); st.Buffered != 0 || st.Ambiguous != 0 {
		t.Fatalf("a malformed counter must not be buffered: %+v", st)
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no address", Options{}, "no address"},
		{"bad address", Options{Addresses: []string{"localhost"}}, "address"},
		{"two standalone", Options{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "one address"},
		{"sentinel without set", Options{Addresses: []string{"127.0.0.1:1"}, Mode: Sentinel}, "MasterSet"},
		{"set without sentinel", Options{Addresses: []string{"127.0.0.1:1"}, MasterSet: "m"}, "only for sentinel"},
		{"unknown mode", Options{Addresses: []string{"127.0.0.1:1"}, Mode: "ring"}, "unknown mode"},
		{"in-flight above ring", Options{Addresses: []string{"127.0.0.1:1"}, RingScale: 8, MaxInFlight: 256}, "below the ring"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestUnreachableAtStart(t *testing.T) {
	port := valkeytest.FreePort(t)
	lag := schedtest.Start()
	start := time.Now()
	_, err := New(Options{Addresses: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Password: "s3cr3t-start", DialTimeout: 200 * time.Millisecond})
	took := time.Since(start)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if strings.Contains(err.Error(), "s3cr3t-start") {
		t.Fatalf("password in error: %v", err)
	}
	// 2 s plus the scheduler's worst lag, for a 200 ms dial timeout.
	if lagMax := worstLag(lag); took > 2*time.Second+lagMax {
		t.Fatalf("New took %v (bound 2 s + scheduler lag %v)", took, lagMax)
	}
}
