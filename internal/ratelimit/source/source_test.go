package source

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
)

type sink struct {
	mu sync.Mutex
	c  *config.Config
	n  int
}

func (s *sink) SetConfig(c *config.Config) { s.mu.Lock(); s.c = c; s.n++; s.mu.Unlock() }
func (s *sink) get() (*config.Config, int) { s.mu.Lock(); defer s.mu.Unlock(); return s.c, s.n }

func TestFilesHotReloadKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "rl", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// write replaces the file atomically (rename): os.WriteFile truncates
	// first, and a poll between the truncate and the write would load an
	// empty file, an error of its own that this test would count.
	write := func(s string) {
		tmp := filepath.Join(dir, "a.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(cfgDir, "a.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: one\n")
	m := metrics.New(prometheus.NewRegistry())
	sk := &sink{}
	a := &Applier{Sink: sk, Metrics: m}
	f := &Files{Dir: config.DirOptions{Root: dir, Subdirectory: "rl", AppDirectory: "config"}, Interval: 10 * time.Millisecond}
	if err := f.Load(a); err != nil {
		t.Fatal(err)
	}
	// run starts the poll loop; the returned stop ends it and waits.
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = f.Run(ctx, a); close(done) }()
		return func() { cancel(); <-done }
	}
	stop := run()
	defer func() { stop() }()

	waitFor := func(cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal("timed out")
			}
			time.Sleep(5 * time.Millisecond) // poll interval
		}
	}
	write("domain: two\n")
	waitFor(func() bool { c, _ := sk.get(); return strings.Join(c.Domains(), ",") == "two" })
	write("domain: three\nbogus: true\n")
	waitFor(func() bool { return testutil.ToFloat64(m.ConfigLoads.WithLabelValues("file", "error")) == 1 })
	// More polls of the unchanged bad file: stop the loop and make them
	// here, so each one certainly happened (no sleep hoping the ticker
	// fired), then start the loop again for the fix below.
	stop()
	for range 3 {
		if err := f.Load(a); err != nil {
			t.Fatalf("poll of the unchanged bad file: %v (the error was reported already)", err)
		}
	}
	stop = run()
	c, n := sk.get()
	if strings.Join(c.Domains(), ",") != "two" || n != 2 {
		t.Fatalf("invalid config replaced the last good one: %v after %d sets", c.Domains(), n)
	}
	if got := testutil.ToFloat64(m.ConfigLoads.WithLabelValues("file", "error")); got != 1 {
		t.Fatalf("error counted %v times; an unchanged bad file must not be re-reported", got)
	}
	write("domain: four\n")
	waitFor(func() bool { c, _ := sk.get(); return strings.Join(c.Domains(), ",") == "four" })
}

func TestApplyProto(t *testing.T) {
	sk := &sink{}
	a := &Applier{Sink: sk}
	if err := a.ApplyProto(context.Background(), []*rlsconfv3.RateLimitConfig{{Domain: "d"}}); err != nil || !a.Loaded() {
		t.Fatalf("apply: %v", err)
	}
	if err := a.ApplyProto(context.Background(), []*rlsconfv3.RateLimitConfig{{Domain: ""}}); err == nil {
		t.Fatal("invalid xDS config accepted")
	}
	if c, n := sk.get(); n != 1 || c.Domains()[0] != "d" {
		t.Fatalf("sink has %v after %d sets", c.Domains(), n)
	}
}
