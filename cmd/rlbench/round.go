package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

const domain = "default/llm-budgets"

func writeConfig(root string, o options) error {
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := 0; i < o.descriptors; i++ {
		rule := budgetmap.RuleDescriptor(domain, i)
		fmt.Fprintf(&b, "  - key: %s\n    value: %s\n    descriptors:\n      - key: rule-%d-match-0\n        rate_limit:\n          unit: day\n          requests_per_unit: %d\n", rule, rule, i, o.limit)
	}
	return os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(b.String()), 0o644)
}

type result struct {
	requests, errors, overLimit int64
	elapsed                     time.Duration
	p50, p99, p999              time.Duration
	cpuPerCall                  time.Duration
	genCPUPerCall               time.Duration // the load generator's own CPU
	valkeyCPUPerCall            time.Duration // the private valkey-server's CPU (0 if not ours)
}

func (r result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

func (r result) String() string {
	return fmt.Sprintf("%9.0f req/s  p50 %7s  p99 %7s  p99.9 %7s  cpu/call %6.1fus  (generator %5.1fus, valkey %5.1fus)  requests %d errors %d over_limit %d",
		r.rps(), r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.p999.Round(time.Microsecond),
		float64(r.cpuPerCall.Nanoseconds())/1000, float64(r.genCPUPerCall.Nanoseconds())/1000, float64(r.valkeyCPUPerCall.Nanoseconds())/1000, r.requests, r.errors, r.overLimit)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }() // only used to pick a free port
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startService starts one service process with the reference's environment
// (plus extra, ours only).
func startService(ctx context.Context, bin, name, valkey, root, prefix, keyFormat, logPath string, extra []string) (*exec.Cmd, string, string, func(), error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, "", "", nil, err
		}
		ports[i] = p
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL="+valkey,
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]), "GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]), "CACHE_KEY_PREFIX="+prefix,
	)
	if name == oursGRPCGo {
		cmd.Env = append(cmd.Env, "GRPC_SERVER_IMPL=grpc-go")
	}
	cmd.Env = append(cmd.Env, extra...)
	if strings.HasPrefix(name, "ours") {
		cmd.Env = append(cmd.Env, "KEY_FORMAT="+keyFormat)
		if keyFormat == "memory-store" {
			// Drop REDIS_URL: our service then uses its embedded store.
			env := cmd.Env[:0]
			for _, kv := range cmd.Env {
				if !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "KEY_FORMAT=") {
					env = append(env, kv)
				}
			}
			cmd.Env = env
		}
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, "", "", nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close() // the log file of a process that did not start
		return nil, "", "", nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = f.Close(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			return nil, "", "", nil, fmt.Errorf("%s exited during start-up; log: %s", name, logPath)
		default:
		}
		if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/healthcheck"); err == nil {
			_ = resp.Body.Close() // health probe: only the status matters
			if resp.StatusCode == 200 {
				return cmd, "127.0.0.1:" + strconv.Itoa(ports[1]), "127.0.0.1:" + strconv.Itoa(ports[2]), stop, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, "", "", nil, fmt.Errorf("%s not healthy in 20s; log: %s", name, logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpuTime reads utime+stime of a process from /proc/<pid>/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+2:])
	// fields after ")" start at field 3 (state); utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

// oursGRPCGo is our service on grpc-go's server transport.
const oursGRPCGo = "ours-grpc-go"

// round is one service's measured round: its process and load clients.
type round struct {
	o         options
	name      string
	idx       int
	cmd       *exec.Cmd
	debugAddr string
	clients   []rlpb.RateLimitServiceClient // -client grpc
	h2s       []*h2Client                   // -client h2
	work      workload
}

func runRound(ctx context.Context, o options, name string, idx int, root string, logw io.Writer) (result, error) {
	bin := o.oursBin
	if name == "reference" {
		bin = o.refBin
	}
	prefix := fmt.Sprintf("bench%d_%s_%d_", time.Now().Unix(), name, idx)
	var extra []string
	if strings.HasPrefix(name, "ours") && o.budgetMap != "" {
		extra = append(extra, "BUDGET_MAP_PATH="+o.budgetMap)
	}
	cmd, addr, debugAddr, stop, err := startService(ctx, bin, name, o.valkeyAddr, root, prefix, o.keyFormat, filepath.Join(o.workDir, fmt.Sprintf("%s-%d.log", name, idx)), extra)
	if err != nil {
		return result{}, err
	}
	defer stop()
	r := &round{o: o, name: name, idx: idx, cmd: cmd, debugAddr: debugAddr}
	closeClients, err := r.dial(addr)
	if err != nil {
		return result{}, err
	}
	defer closeClients()
	if r.work, err = newWorkload(o); err != nil {
		return result{}, err
	}
	if o.warmup > 0 {
		if _, err := r.phase(ctx, o.warmup, false, logw); err != nil {
			return result{}, err
		}
	}
	return r.phase(ctx, o.duration, true, logw)
}

// dial opens the round's load connections.
func (r *round) dial(addr string) (func(), error) {
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for i := 0; i < r.o.conns; i++ {
		if r.o.client == "grpc" {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				closeAll()
				return nil, err
			}
			closers = append(closers, func() { _ = c.Close() }) // load client of this round, dropped at its end
			r.clients = append(r.clients, rlpb.NewRateLimitServiceClient(c))
			continue
		}
		c, err := dialH2(addr)
		if err != nil {
			closeAll()
			return nil, err
		}
		closers = append(closers, c.Close)
		r.h2s = append(r.h2s, c)
	}
	return closeAll, nil
}

// cpuSample is the CPU time of the service, the generator and Valkey.
type cpuSample struct{ service, gen, valkey time.Duration }

func (r *round) cpu() (cpuSample, error) {
	var s cpuSample
	var err error
	if s.service, err = cpuTime(r.cmd.Process.Pid); err != nil {
		return s, err
	}
	s.gen, _ = cpuTime(os.Getpid())
	if r.o.valkeyPID != 0 {
		s.valkey, _ = cpuTime(r.o.valkeyPID)
	}
	return s, nil
}

// tally is what a phase's workers counted.
type tally struct {
	count, errs, over atomic.Int64
	mu                sync.Mutex
	lat               []time.Duration
}

// phase runs the closed loop for d (at most o.maxRequests calls) and, when
// record is set, measures it.
func (r *round) phase(ctx context.Context, d time.Duration, record bool, logw io.Writer) (result, error) {
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	phaseEnd := time.Now().Add(d)
	c0, err := r.cpu()
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	if record && r.o.profile != "" && strings.HasPrefix(r.name, "ours") && d > 2*time.Second {
		go fetchProfile(r.debugAddr, d-time.Second, fmt.Sprintf("%s.%d", r.o.profile, r.idx), logw)
	}
	var t tally
	var wg sync.WaitGroup
	for w := 0; w < r.o.workers; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); r.worker(pctx, w, phaseEnd, record, &t, logw) }()
	}
	wg.Wait()
	elapsed := time.Since(start)
	c1, err := r.cpu()
	if err != nil {
		return result{}, err
	}
	n := min(t.count.Load(), r.o.maxRequests)
	res := result{requests: n - t.errs.Load(), errors: t.errs.Load(), overLimit: t.over.Load(), elapsed: elapsed}
	if res.requests > 0 {
		res.cpuPerCall = (c1.service - c0.service) / time.Duration(res.requests)
		res.genCPUPerCall = (c1.gen - c0.gen) / time.Duration(res.requests)
		res.valkeyCPUPerCall = (c1.valkey - c0.valkey) / time.Duration(res.requests)
	}
	res.p50, res.p99, res.p999 = percentiles(t.lat)
	return res, nil
}

func percentiles(lat []time.Duration) (p50, p99, p999 time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p*float64(len(lat)-1))]
	}
	return pct(0.50), pct(0.99), pct(0.999)
}

// worker is one closed-loop caller: each step is one workload call (a
// check, then a charge, in the llm mix: two calls).
func (r *round) worker(ctx context.Context, w int, phaseEnd time.Time, record bool, t *tally, logw io.Writer) {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(r.idx)))
	local := make([]time.Duration, 0, 4096)
	for ctx.Err() == nil {
		p := rng.IntN(r.work.principals())
		for _, call := range r.work.calls(p) {
			if t.count.Add(1) > r.o.maxRequests {
				break
			}
			t0 := time.Now()
			code, err := r.call(ctx, w, call)
			el := time.Since(t0)
			if err != nil {
				// The server enforces the phase deadline (sent as
				// grpc-timeout) a moment before the client's timer: calls
				// cut off by the end of the phase are not errors.
				if ctx.Err() == nil && time.Until(phaseEnd) > 100*time.Millisecond {
					if t.errs.Add(1) == 1 {
						_, _ = fmt.Fprintf(logw, "%s: first error: %v\n", r.name, err) // diagnostic; the error count is the result
					}
				} else {
					t.count.Add(-1) // cut off by the end of the phase
				}
				break
			}
			if code == int(rlpb.RateLimitResponse_OVER_LIMIT) {
				t.over.Add(1)
			}
			if record {
				local = append(local, el)
			}
		}
		if t.count.Load() > r.o.maxRequests {
			break
		}
	}
	t.mu.Lock()
	t.lat = append(t.lat, local...)
	t.mu.Unlock()
}

// call sends one request on worker w's connection.
func (r *round) call(ctx context.Context, w int, c prepared) (int, error) {
	if r.clients != nil {
		resp, err := r.clients[w%len(r.clients)].ShouldRateLimit(ctx, c.req)
		return int(resp.GetOverallCode()), err
	}
	return r.h2s[w%len(r.h2s)].call(c.body, 2*time.Second)
}

func report(w io.Writer, results map[string][]result) error {
	agg := func(rs []result) (rps float64, p50, p99, p999, cpu time.Duration) {
		if len(rs) == 0 {
			return
		}
		var reqs int64
		var el time.Duration
		var cpuTotal time.Duration
		p50s, p99s, p999s := []time.Duration{}, []time.Duration{}, []time.Duration{}
		for _, r := range rs {
			reqs += r.requests
			el += r.elapsed
			cpuTotal += r.cpuPerCall * time.Duration(r.requests)
			p50s, p99s, p999s = append(p50s, r.p50), append(p99s, r.p99), append(p999s, r.p999)
		}
		med := func(d []time.Duration) time.Duration {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			return d[len(d)/2]
		}
		return float64(reqs) / el.Seconds(), med(p50s), med(p99s), med(p999s), cpuTotal / time.Duration(max(reqs, 1))
	}
	if _, err := fmt.Fprintln(w, "\nsummary (req/s over all rounds; latency = median of rounds):"); err != nil {
		return err
	}
	type row struct {
		name           string
		rps            float64
		p50, p99, p999 time.Duration
		cpu            time.Duration
	}
	var rows []row
	for _, name := range []string{"reference", "ours", oursGRPCGo} {
		if rs, ok := results[name]; ok {
			r := row{name: name}
			r.rps, r.p50, r.p99, r.p999, r.cpu = agg(rs)
			rows = append(rows, r)
			if _, err := fmt.Fprintf(w, "  %-12s %9.0f req/s  p50 %7s  p99 %7s  p99.9 %7s  cpu/call %6.1fus\n", name, r.rps,
				r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.p999.Round(time.Microsecond), float64(r.cpu.Nanoseconds())/1000); err != nil {
				return err
			}
		}
	}
	if len(rows) >= 2 && rows[0].name == "reference" {
		ref := rows[0]
		for _, ours := range rows[1:] {
			if _, err := fmt.Fprintf(w, "  ratio %s/reference: throughput %.2fx, p99 %.2fx, cpu/call %.2fx\n", ours.name,
				ours.rps/ref.rps, float64(ours.p99)/float64(ref.p99), float64(ours.cpu)/float64(ref.cpu)); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetchProfile saves a CPU profile of our service taken during the measured
// phase to path, then its allocation profile (since start) to path.allocs.
func fetchProfile(debugAddr string, d time.Duration, path string, logw io.Writer) {
	save(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", debugAddr, int(d.Seconds())), path, logw)
	save(fmt.Sprintf("http://%s/debug/pprof/allocs", debugAddr), path+".allocs", logw)
}

// save writes what url answers to path; a profile is best-effort, so a
// failure is only logged.
func save(url, path string, logw io.Writer) {
	resp, err := http.Get(url)
	if err != nil {
		_, _ = fmt.Fprintln(logw, "profile:", err)
		return
	}
	defer func() { _ = resp.Body.Close() }() // fully read by io.Copy
	f, err := os.Create(path)
	if err != nil {
		_, _ = fmt.Fprintln(logw, "profile:", err)
		return
	}
	defer func() { _ = f.Close() }() // best-effort, like the io.Copy below
	_, _ = io.Copy(f, resp.Body)
}
