package reliability

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// syncBuffer collects the service's log output (written from its goroutines).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// svc is one in-process rate limit service (service.Run) and gRPC clients to it.
type svc struct {
	t        testing.TB
	logs     *syncBuffer
	grpcAddr string
	httpURL  string
	debugURL string
	clients  []rlpb.RateLimitServiceClient
	conns    []*grpc.ClientConn
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
	runErr   error
}

// svcOptions start a service. Env is layered over loopback listeners on free
// ports and a fast config poll.
type svcOptions struct {
	ConfigDir string
	Env       map[string]string
	// Conns is the number of gRPC client connections (calls are spread
	// over them); default 2.
	Conns int
	// ClientTLS, when set, dials the gRPC port with TLS.
	ClientTLS credentials.TransportCredentials
	// Logs receives the service's log output; default a new buffer.
	Logs *syncBuffer
}

func baseEnv() map[string]string {
	return map[string]string{
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "CONFIG_POLL_INTERVAL": "50ms",
		"LOG_LEVEL": "warn",
	}
}

// valkeyEnv is what Envoy Gateway sets for a standalone Valkey at addr.
func valkeyEnv(addr string) map[string]string {
	return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "single", "REDIS_URL": addr}
}

func merge(maps ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// startSvc runs service.Run in a goroutine until the test ends (or stop).
func startSvc(t testing.TB, o svcOptions) *svc {
	t.Helper()
	s, err := tryStartSvc(t, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryStartSvc is startSvc returning the start-up error (and logs) instead.
func tryStartSvc(t testing.TB, o svcOptions) (*svc, error) {
	t.Helper()
	env := merge(baseEnv(), o.Env)
	if _, ok := env["XDG_STATE_HOME"]; !ok {
		env["XDG_STATE_HOME"] = t.TempDir() // the embedded store's default snapshot, this service's own
	}
	logs := o.Logs
	if logs == nil {
		logs = &syncBuffer{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &svc{t: t, logs: logs, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan *server.Server, 1)
	var args []string
	if o.ConfigDir != "" {
		args = []string{"--config-dir", o.ConfigDir}
	}
	go func() {
		s.done <- service.Run(ctx, args, func(k string) string { return env[k] }, logs, func(srv *server.Server) { ready <- srv })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-s.done:
		cancel()
		return nil, fmt.Errorf("service exited at start: %w\nlogs:\n%s", err, logs)
	case <-time.After(30 * time.Second):
		cancel()
		return nil, fmt.Errorf("service did not start within 30s\nlogs:\n%s", logs)
	}
	g, h, d, _ := srv.Addrs()
	s.grpcAddr, s.httpURL, s.debugURL = g.String(), "http://"+h.String(), "http://"+d.String()
	creds := o.ClientTLS
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	n := o.Conns
	if n <= 0 {
		n = 2
	}
	for i := 0; i < n; i++ {
		conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			s.stop()
			return nil, err
		}
		s.conns = append(s.conns, conn)
		s.clients = append(s.clients, rlpb.NewRateLimitServiceClient(conn))
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("service run: %v", err)
		}
	})
	return s, nil
}

// stop cancels the service, waits for it to drain and returns Run's error.
func (s *svc) stop() error {
	s.stopOnce.Do(func() {
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.cancel()
		select {
		case s.runErr = <-s.done:
		case <-time.After(20 * time.Second):
			s.runErr = fmt.Errorf("service did not stop within 20s")
		}
	})
	return s.runErr
}

func (s *svc) client(i int) rlpb.RateLimitServiceClient { return s.clients[i%len(s.clients)] }

// metrics returns the Prometheus text of the debug port's /metrics.
func (s *svc) metrics() string {
	s.t.Helper()
	resp, err := http.Get(s.debugURL + "/metrics")
	if err != nil {
		s.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("read /metrics: %v", err)
	}
	return string(b)
}

// metric returns the value of one series (name with its labels exactly as
// exposed, e.g. `ratelimit_requests_total{result="ok"}`), 0 if absent.
func metric(text, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(series):]), 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}

// metricSum sums every series of a metric family name (all label sets).
func metricSum(text, name string) float64 {
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || len(line) == len(name) {
			continue
		}
		if c := line[len(name)]; c != ' ' && c != '{' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func writeFile(t testing.TB, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// req builds a one-descriptor request.
func req(domain string, kv ...string) *rlpb.RateLimitRequest {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlpb.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

// counterKeys is the KEYS pattern of the counters under CACHE_KEY_PREFIX
// prefix in the default (safe) key format; the usage ledger's hashes under
// the same prefix do not match it.
func counterKeys(prefix string) string { return prefix + "bg1|*" }

// sumKeys reads every counter under prefix from Valkey (KEYS, then GET
// each) and returns their sum and count. Test-sized keyspaces only.
func sumKeys(t testing.TB, addr, prefix string) (sum uint64, n int) {
	t.Helper()
	out, err := valkeytest.Do(addr, "KEYS", counterKeys(prefix))
	if err != nil {
		t.Fatalf("KEYS %s*: %v", prefix, err)
	}
	if out == "" {
		return 0, 0
	}
	for _, k := range strings.Split(out, "\n") {
		v, err := valkeytest.Do(addr, "GET", k)
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		u, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("GET %s = %q: not a counter", k, v)
		}
		sum += u
		n++
	}
	return sum, n
}

// waitUnresponsive returns once a fresh connection's PING to addr gets no
// answer within 50 ms: a SIGSTOP has taken effect (the signal is delivered
// asynchronously, and a server still running answers at once).
func waitUnresponsive(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		_ = c.SetDeadline(time.Now().Add(50 * time.Millisecond))
		_, _ = c.Write([]byte("*1\r\n$4\r\nPING\r\n"))
		_, err = c.Read(make([]byte, 16))
		c.Close()
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return
		}
		time.Sleep(time.Millisecond) // poll interval
	}
	t.Fatalf("valkey at %s still answers 5 s after SIGSTOP", addr)
}

// waitUntil polls cond every 20 ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// probe measures how late a goroutine wakes from a 2 ms sleep: the
// scheduling delay of this shared 2-core machine during the test. No call
// can be answered faster than its goroutines get scheduled, so latency
// bounds add the probe's delay at the same percentile, and a single call's
// bound adds the time the probe was kept waiting during that call (the
// machine stalled).
type probe struct {
	stop  chan struct{}
	done  chan struct{}
	lags  []time.Duration
	late  []span // periods in which the probe was overdue by more than 1 ms
	once  sync.Once
	p99   time.Duration
	worst time.Duration
}

type span struct{ from, to time.Time }

func startProbe() *probe {
	// Preallocated: the soak measures this process's heap, so the probe's
	// records must not grow during a run.
	p := &probe{stop: make(chan struct{}), done: make(chan struct{}), lags: resident[time.Duration](200_000), late: resident[span](20_000)}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(2 * time.Millisecond) // stays: the probe measures how late this sleep wakes
			t1 := time.Now()
			lag := t1.Sub(t0) - 2*time.Millisecond
			if len(p.lags) < cap(p.lags) {
				p.lags = append(p.lags, lag)
			}
			if lag > time.Millisecond && len(p.late) < cap(p.late) {
				p.late = append(p.late, span{t0.Add(2 * time.Millisecond), t1})
			}
		}
	}()
	return p
}

// startValkeyProbe measures Valkey's own responsiveness: a PING on a raw
// connection every 2 ms; a PING that takes over 1 ms is recorded as a span
// in which Valkey (a separate process, which the machine may deschedule
// while this one runs) did not answer. Its lags are the PING round trips.
func startValkeyProbe(t testing.TB, addr string) *probe {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("valkey probe: %v", err)
	}
	p := &probe{stop: make(chan struct{}), done: make(chan struct{}), lags: resident[time.Duration](200_000), late: resident[span](20_000)}
	go func() {
		defer close(p.done)
		defer c.Close()
		buf := make([]byte, 16)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			t0 := time.Now()
			_ = c.SetDeadline(t0.Add(10 * time.Second))
			if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
				return
			}
			if _, err := io.ReadAtLeast(c, buf, 7); err != nil {
				return
			}
			t1 := time.Now()
			lat := t1.Sub(t0)
			if len(p.lags) < cap(p.lags) {
				p.lags = append(p.lags, lat)
			}
			if lat > time.Millisecond && len(p.late) < cap(p.late) {
				p.late = append(p.late, span{t0, t1})
			}
			time.Sleep(2 * time.Millisecond) // stays: paces the probe
		}
	}()
	return p
}

// resident returns an empty slice with capacity n whose memory is already
// written: fresh pages from the OS only become resident when first
// touched, so filling a preallocated record during a soak would look like
// RSS growth.
func resident[T any](n int) []T {
	s := make([]T, n)
	clear(s) // writes every page
	return s[:0]
}

// finish stops the probe and returns its p99 and max delay.
func (p *probe) finish() (p99, worst time.Duration) {
	p.once.Do(func() {
		close(p.stop)
		<-p.done
		lags := append([]time.Duration(nil), p.lags...)
		p.p99, p.worst = pct(lags, 99), pct(lags, 100)
	})
	return p.p99, p.worst
}

// stalled returns how long the probe was overdue within [from, to] (call
// after finish).
func (p *probe) stalled(from, to time.Time) time.Duration {
	var d time.Duration
	for _, s := range p.late {
		a, b := s.from, s.to
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			d += b.Sub(a)
		}
	}
	return d
}

// stalls returns the periods in which the probe was overdue by at least
// min (call after finish).
func (p *probe) stalls(min time.Duration) []span {
	var out []span
	for _, s := range p.late {
		if s.to.Sub(s.from) >= min {
			out = append(out, s)
		}
	}
	return out
}

// control calls the service in a loop, for a descriptor of domain no rule matches
// (answered without the store), and records the calls that took at least
// slow: periods in which the service's own CPU queue delayed every call.
type control struct {
	stop chan struct{}
	done chan struct{}
	slow []span
}

func startControl(s *svc, domain string, slow time.Duration) *control {
	// Preallocated, like the probes: the soak measures this process's heap.
	c := &control{stop: make(chan struct{}), done: make(chan struct{}), slow: resident[span](50_000)}
	go func() {
		defer close(c.done)
		r := req(domain, "unmatched", "control")
		cl := s.client(0)
		for {
			select {
			case <-c.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
			t0 := time.Now()
			_, _ = cl.ShouldRateLimit(ctx, r) // the answer does not matter, its latency does
			t1 := time.Now()
			cancel()
			if t1.Sub(t0) >= slow && len(c.slow) < cap(c.slow) {
				c.slow = append(c.slow, span{t0, t1})
			}
			time.Sleep(time.Millisecond) // stays: paces the control client
		}
	}()
	return c
}

// finish stops the control and returns its slow calls.
func (c *control) finish() []span {
	close(c.stop)
	<-c.done
	return c.slow
}

// overlaps reports whether one of spans (sequential: sorted, not
// overlapping each other) overlaps s.
func overlaps(spans []span, s span) bool {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].to.After(s.from) })
	return i < len(spans) && spans[i].from.Before(s.to)
}

// merged returns the union of spans, as sorted spans that do not overlap.
func merged(spans []span) []span {
	s := append([]span(nil), spans...)
	sort.Slice(s, func(i, j int) bool { return s[i].from.Before(s[j].from) })
	var out []span
	for _, x := range s {
		if n := len(out); n > 0 && !x.from.After(out[n-1].to) {
			if x.to.After(out[n-1].to) {
				out[n-1].to = x.to
			}
			continue
		}
		out = append(out, x)
	}
	return out
}

// stallBudget is how many calls can have met one of the stalls (merged:
// not overlapping): each of the workers' calls in flight when it began,
// and the calls due at rate (per second) while it lasted.
func stallBudget(stalls []span, workers int, rate float64) int {
	n := 0.0
	for _, s := range stalls {
		n += float64(workers) + rate*s.to.Sub(s.from).Seconds()
	}
	return int(n)
}

// pct returns the q-th percentile (100 = max) of d, sorting it in place.
func pct(d []time.Duration, q int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := len(d) * q / 100
	if i >= len(d) {
		i = len(d) - 1
	}
	return d[i]
}

// heapAfterGC returns the live heap after full collections (two, so that
// sync.Pool caches, which survive one, are gone too).
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// settledHeap measures the live heap (heapAfterGC) until it is at most
// bound or wait has passed, and returns the last measurement. On a loaded
// machine work still finishing after the last answer (a store call
// detached at its deadline, valkey-go's pipelines, the previous test's
// service shutting down) holds memory for a moment; a leak holds it for
// good, so it still fails the bound.
func settledHeap(bound uint64, wait time.Duration) uint64 {
	deadline := time.Now().Add(wait)
	for {
		h := heapAfterGC()
		if h <= bound || time.Now().After(deadline) {
			return h
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

// rssBytes reads this process's resident set size from /proc/self/status.
func rssBytes(t testing.TB) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("read /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil || len(f) < 2 || f[1] != "kB" {
				t.Fatalf("VmRSS line %q", line)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

const mib = 1 << 20

// requirePassword makes a running Valkey require password for the default
// user and adds an ACL user "budget" with the same password. (Set after
// start: valkeytest waits for an unauthenticated PING.)
func requirePassword(t testing.TB, addr, password string) {
	t.Helper()
	if _, err := valkeytest.Do(addr, "ACL", "SETUSER", "budget", "on", ">"+password, "~*", "+@all"); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	if _, err := valkeytest.Do(addr, "CONFIG", "SET", "requirepass", password); err != nil {
		t.Fatalf("CONFIG SET requirepass: %v", err)
	}
}
