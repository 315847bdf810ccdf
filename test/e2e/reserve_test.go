package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// reserveSpec: one human's 2,000,000-token daily cap on an Envoy Gateway
// Gateway and one agent run's on agentgateway, both enforced; RESERVE is
// replaced by each test.
const reserveSpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways:
    - {namespace: edge, name: gw}
    - {namespace: agents, name: agw, kind: agentgateway}
  identities:
    x-human: {jwtClaim: email}
    x-run: {jwtClaim: run_id}
  budgets:
    - {name: per-human, perPrincipal: x-human, tokensPerDay: 2000000, mode: enforce, gateways: [edge/gw]RESERVE}
    - {name: per-run, perPrincipal: x-run, tokensPerDay: 2000000, mode: enforce, gateways: [agents/agw]RESERVE}
`

// replicas is one rendered spec served by several engines (service
// replicas) sharing their counters: one Valkey, or one embedded store.
type replicas struct {
	t      *testing.T
	clock  *clock
	engs   []*engine.Engine
	routes map[string][]*routev3.RateLimit
	agw    *agentgateway.GlobalRateLimit
	next   atomic.Uint64
}

// newReplicas renders doc and starts one engine per store, each with the
// budget map, Envoy Gateway's config (as xDS would bring it) and
// agentgateway's files. The stores' clocks must be the returned clock.
func newReplicas(t *testing.T, doc string, clk *clock, stores ...store.Store) *replicas {
	t.Helper()
	bs, err := spec.Load([]byte(doc), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	r := &replicas{t: t, clock: clk}
	var btps []*egv1a1.BackendTrafficPolicy
	for _, o := range res.Objects {
		switch p := agentgateway.Model(o.Object).(type) {
		case *egv1a1.BackendTrafficPolicy:
			btps = append(btps, p)
			if r.routes, err = rlsconfig.RouteRateLimits(p); err != nil {
				t.Fatal(err)
			}
		case *agentgateway.Policy:
			if p.Spec.Traffic != nil {
				r.agw = p.Spec.Traffic.RateLimit.Global
			}
		}
	}
	egCfgs, err := rlsconfig.Configs(btps)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := rlsconfig.Files(res.AgentgatewayConfigs)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mapData, err := budgetmap.Encode(render.BudgetMap(bs))
	if err != nil {
		t.Fatal(err)
	}
	mapPath := filepath.Join(t.TempDir(), "budget-map.yaml")
	if err := os.WriteFile(mapPath, mapData, 0o644); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, st := range stores {
		eng, err := engine.New(engine.Options{Store: st, Now: clk.Now, Logger: quiet, StoreTimeout: 5 * time.Second, FailurePolicy: decide.FailError})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		a := &source.Applier{Sink: eng, Logger: quiet}
		if err := (&source.BudgetMapFile{Path: mapPath}).Load(a); err != nil {
			t.Fatal(err)
		}
		if err := (&source.Files{Dir: config.DirOptions{Root: dir}}).Load(a); err != nil {
			t.Fatal(err)
		}
		if err := a.ApplyProto(context.Background(), egCfgs); err != nil {
			t.Fatal(err)
		}
		r.engs = append(r.engs, eng)
	}
	return r
}

// send makes one call on the next replica (round robin) and returns the
// answer.
func (r *replicas) send(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	r.t.Helper()
	eng := r.engs[r.next.Add(1)%uint64(len(r.engs))]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := eng.ShouldRateLimit(ctx, req)
	if err != nil {
		r.t.Errorf("ShouldRateLimit: %v", err)
		return nil
	}
	return resp
}

// A call through one of the gateways: check builds the request-time call
// (nil when the gateway sends none), done the stream-end charge (nil: none).
type gatewayCall struct {
	check, done *rlsv3.RateLimitRequest
}

// envoyCall is an LLM request of human as Envoy builds it from Envoy
// Gateway's translation: a check with hits_addend 0, then the token count
// from the AI Gateway's metadata at stream end (none when it is missing).
func (r *replicas) envoyCall(human string, tokens string) gatewayCall {
	r.t.Helper()
	req := rlsconfig.Request{Headers: map[string]string{"x-human": human, ":method": "POST", ":path": "/v1/chat/completions"}}
	if tokens != "" {
		req.Metadata = map[string]string{tokenMeta: tokens}
	}
	var c gatewayCall
	for phase, out := range map[rlsconfig.Phase]**rlsv3.RateLimitRequest{rlsconfig.PhaseRequest: &c.check, rlsconfig.PhaseStreamDone: &c.done} {
		calls, err := rlsconfig.Requests(r.routes, req, phase)
		if err != nil || len(calls) > 1 {
			r.t.Fatalf("Envoy's calls in phase %v: %d, %v", phase, len(calls), err)
		}
		if len(calls) == 1 {
			*out = calls[0]
		}
	}
	return c
}

// agentCall is an LLM request of an agent run through agentgateway (the
// prompt not tokenized): a check with hits 0, then the amend.
func (r *replicas) agentCall(run string, tokens uint64) gatewayCall {
	r.t.Helper()
	check, amend, err := agentgateway.Requests(r.agw, agentgateway.LLMRequest{Claims: map[string]any{"run_id": run}, InputTokens: tokens / 4, OutputTokens: tokens - tokens/4})
	if err != nil {
		r.t.Fatal(err)
	}
	return gatewayCall{check: check, done: amend}
}

// fanOut sends n calls whose checks all arrive before the first charge
// (an agent fanning out), then the charges of the admitted ones. It
// returns how many were admitted.
func (r *replicas) fanOut(calls []gatewayCall) int {
	r.t.Helper()
	admitted := make([]bool, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := r.send(c.check)
			admitted[i] = resp != nil && resp.OverallCode == rlsv3.RateLimitResponse_OK
		}()
	}
	wg.Wait()
	n := 0
	for i, ok := range admitted {
		if ok {
			n++
			if calls[i].done != nil {
				r.send(calls[i].done)
			}
		}
	}
	return n
}

// spend charges used tokens to a principal in sequential calls of step
// (each a check, then its charge).
func (r *replicas) spend(mk func(tokens uint64) gatewayCall, used, step uint64) {
	r.t.Helper()
	for ; used > 0; used -= min(used, step) {
		c := mk(min(used, step))
		if resp := r.send(c.check); resp == nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			r.t.Fatalf("a sequential call was denied while spending: %v", resp)
		}
		r.send(c.done)
	}
}

// remaining is what a check of the principal answers (limit - used - held).
func (r *replicas) remaining(c gatewayCall) uint32 {
	r.t.Helper()
	resp := r.send(c.check)
	if resp == nil {
		return 0
	}
	return resp.Statuses[0].LimitRemaining
}

// backendNames are the store set-ups a cap must bind on: one service on
// Valkey, two replicas sharing one Valkey, one service on the embedded store.
var backendNames = []string{"valkey", "valkey-2-replicas", "embedded"}

// backend makes the stores of a set-up on clk (the engines' clock, so holds
// expire on the test's time).
func backend(t *testing.T, vk *valkeytest.Server, name string, clk *clock) []store.Store {
	t.Helper()
	if name == "embedded" {
		mem := memory.New(memory.Options{Now: clk.Now})
		t.Cleanup(func() { _ = mem.Close() })
		return []store.Store{mem}
	}
	n := 1
	if name == "valkey-2-replicas" {
		n = 2
	}
	var out []store.Store
	for range n {
		st, err := valkey.New(valkey.Options{Addresses: []string{vk.Addr}, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		out = append(out, st)
	}
	return out
}

func withReserve(r string) string {
	doc := reserveSpec
	for range 2 {
		doc = replaceOnce(doc, "RESERVE", r)
	}
	return doc
}

func replaceOnce(s, old, new string) string {
	for i := 0; i+len(old) <= len(s); i++ {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	return s
}

// TestConcurrentCallsBindTheCap: 100 concurrent 50,000-token calls of one
// principal on a 2,000,000 cap with reserve: 50000 admit at most 41 with the
// whole day ahead and at most 2 with 50,000 left, through Envoy Gateway's
// and agentgateway's request shapes, on Valkey, on two replicas sharing one
// Valkey, and on the embedded store. Without reserve (the control) all 100
// are admitted.
func TestConcurrentCallsBindTheCap(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	for _, tc := range []struct {
		name, reserve string
		full, left    int // most admitted: whole day ahead; 50,000 left
	}{
		{"reserve-50000", ", reserve: 50000", 41, 2},
		{"no-reserve", "", 100, 100},
	} {
		for _, name := range backendNames {
			clk := &clock{t: morning}
			r := newReplicas(t, withReserve(tc.reserve), clk, backend(t, vk, name, clk)...)
			for _, via := range []string{viaEnvoy, viaAgentgateway} {
				t.Run(tc.name+"/"+name+"/"+via, func(t *testing.T) {
					r.t = t
					principal := func(p string) func(tokens uint64) gatewayCall {
						p = fmt.Sprintf("%s-%s-%s-%s", tc.name, name, via, p)
						if via == viaEnvoy {
							return func(n uint64) gatewayCall { return r.envoyCall(p, strconv.FormatUint(n, 10)) }
						}
						return func(n uint64) gatewayCall { return r.agentCall(p, n) }
					}
					checkFanOut(t, r, principal("full"), 0, tc.full)
					left := principal("left")
					r.spend(left, 1_950_000, 50_000)
					checkFanOut(t, r, left, 1_950_000, tc.left)
				})
			}
		}
	}
}

// checkFanOut fans out 100 calls of 50,000 tokens of one principal that has
// used tokens and checks how many were admitted (at most want; exactly want
// for the control, which must overshoot).
func checkFanOut(t *testing.T, r *replicas, mk func(uint64) gatewayCall, used uint64, want int) {
	t.Helper()
	calls := make([]gatewayCall, 100)
	for i := range calls {
		calls[i] = mk(50_000)
	}
	got := r.fanOut(calls)
	t.Logf("used %d: %d of 100 admitted (at most %d)", used, got, want)
	if got > want || (want == 100 && got != 100) {
		t.Errorf("used %d of 2,000,000: %d of 100 concurrent 50,000-token calls admitted, want at most %d", used, got, want)
	}
	if want < 100 && got == 0 && used+50_000 < 2_000_000 {
		t.Errorf("used %d: nothing admitted though the cap had room", used)
	}
}

// TestAutoReserveLearnsTheChargeSize: with reserve: auto and a small
// reserveInitial, the budget first learns from its charges (of other
// principals) that calls cost 50,000, then binds a fan-out as a fixed
// reserve of that size does.
func TestAutoReserveLearnsTheChargeSize(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	for _, name := range backendNames {
		t.Run(name, func(t *testing.T) {
			clk := &clock{t: morning}
			r := newReplicas(t, withReserve(", reserve: auto, reserveInitial: 1000"), clk, backend(t, vk, name, clk)...)
			human := func(p string) func(uint64) gatewayCall {
				return func(n uint64) gatewayCall { return r.envoyCall("auto-"+name+"-"+p, strconv.FormatUint(n, 10)) }
			}
			// Before learning: 1,000 held per call lets far more through.
			before := r.fanOut(fanOutOf(human("early")))
			// Learn: charges of 50,000 by other principals, on every replica.
			for i := range 25 * len(r.engs) {
				r.spend(human(fmt.Sprint("trainer-", i)), 50_000, 50_000)
			}
			after := r.fanOut(fanOutOf(human("late")))
			t.Logf("admitted before learning %d, after %d", before, after)
			if after > 41 || after == 0 {
				t.Errorf("after learning 50,000-token charges: %d of 100 admitted, want 1 to 41", after)
			}
			if before <= 41 {
				t.Errorf("before learning (1,000 held per call): %d admitted; the test shows nothing", before)
			}
		})
	}
}

func fanOutOf(mk func(uint64) gatewayCall) []gatewayCall {
	calls := make([]gatewayCall, 100)
	for i := range calls {
		calls[i] = mk(50_000)
	}
	return calls
}

// TestLostChargeReleasesItsHold: a call admitted whose charge never comes
// (an upstream error: Envoy AI Gateway writes no token count, so Envoy
// sends no stream-done call; agentgateway leaves llm.totalTokens unset, so
// the rendered cost fails and its amend carries no descriptor) holds its
// reservation until the expiry, then the budget is whole again; the missing
// count reserves nothing new (agentgateway's amend without descriptors is
// refused and holds nothing). The control: an agentgateway descriptor
// without the cost amends an upstream error with 0, which is a second
// check and holds a second reservation.
func TestLostChargeReleasesItsHold(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	for _, name := range []string{"valkey", "embedded"} {
		t.Run(name, func(t *testing.T) {
			clk := &clock{t: morning}
			r := newReplicas(t, withReserve(", reserve: 50000"), clk, backend(t, vk, name, clk)...)
			lost := r.envoyCall("lost-"+name, "")
			if lost.done != nil {
				t.Fatalf("Envoy sends a stream-done call without a token count: %v", lost.done)
			}
			failed := r.agentFailure("failed-"+name, "")
			if failed.done == nil || len(failed.done.Descriptors) != 0 {
				t.Fatalf("agentgateway's amend of an upstream error with the rendered cost: %v, want one without descriptors", failed.done)
			}
			// agentgateway sends that amend anyway (amend_tokens spawns the
			// call whatever apply_token_amend kept): it is refused as the
			// reference refuses it, and charges and holds nothing.
			for _, eng := range r.engs {
				var ie *decide.InvalidError
				if _, err := eng.ShouldRateLimit(context.Background(), failed.done); !errors.As(err, &ie) {
					t.Fatalf("an amend without descriptors: err %v, want an InvalidError", err)
				}
			}
			for _, c := range []gatewayCall{lost, failed} {
				// Each admitted check answers what is left with its own hold
				// set aside; the lost call's charge never comes and holds
				// nothing new.
				if got := r.remaining(c); got != 2_000_000-50_000 {
					t.Fatalf("first check: remaining %d, want %d", got, 2_000_000-50_000)
				}
				if got := r.remaining(c); got != 2_000_000-2*50_000 {
					t.Fatalf("second check: remaining %d, want %d", got, 2_000_000-2*50_000)
				}
			}
			clk.Add(charge.DefaultHoldExpiry + time.Second)
			for _, c := range []gatewayCall{lost, failed} {
				// Both holds expired: only this check's own hold is set aside.
				if got := r.remaining(c); got != 2_000_000-50_000 {
					t.Fatalf("after the hold expiry: remaining %d, want %d (the lost calls' holds released)", got, 2_000_000-50_000)
				}
			}
			// Without the cost, the upstream error's amend is a check.
			zero := r.agentFailure("zero-"+name, "without cost")
			if zero.done == nil || zero.done.Descriptors[0].HitsAddend.GetValue() != 0 {
				t.Fatalf("without a cost agentgateway amends an upstream error with 0, got %v", zero.done)
			}
			r.send(zero.check)
			r.send(zero.done)
			if got := r.remaining(zero); got != 2_000_000-3*50_000 {
				t.Fatalf("control: remaining %d, want %d (the zero amend held a second reservation)", got, 2_000_000-3*50_000)
			}
		})
	}
}

// TestZeroUsageSettlesItsHold: a response that reports a usage of 0 tokens
// is amended with 1 under the rendered cost, so the amend settles the
// request's hold (one token charged) instead of reading as a new check that
// holds a second reservation until the expiry.
func TestZeroUsageSettlesItsHold(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	for _, name := range []string{"valkey", "embedded"} {
		t.Run(name, func(t *testing.T) {
			clk := &clock{t: morning}
			r := newReplicas(t, withReserve(", reserve: 50000"), clk, backend(t, vk, name, clk)...)
			check, amend, err := agentgateway.Requests(r.agw, agentgateway.LLMRequest{Claims: map[string]any{"run_id": "empty-" + name}})
			if err != nil {
				t.Fatal(err)
			}
			if got := amend.Descriptors[0].HitsAddend.GetValue(); got != 1 {
				t.Fatalf("zero usage: amend hits_addend %d, want 1", got)
			}
			r.send(check)
			r.send(amend)
			// The only hold left is the probing check's own.
			zero := gatewayCall{check: check, done: amend}
			if got := r.remaining(zero); got != 2_000_000-1-50_000 {
				t.Fatalf("remaining %d, want %d (the amend settled its hold)", got, 2_000_000-1-50_000)
			}
		})
	}
}

// agentFailure is an agent run's request through agentgateway whose
// upstream answered an error (no usage in the response); mode "without
// cost" drops the rendered cost expression from the descriptors.
func (r *replicas) agentFailure(run, mode string) gatewayCall {
	r.t.Helper()
	g := *r.agw
	if mode == "without cost" {
		g.Descriptors = append([]agentgateway.Descriptor(nil), g.Descriptors...)
		for i := range g.Descriptors {
			g.Descriptors[i].Cost = ""
		}
	}
	check, amend, err := agentgateway.Requests(&g, agentgateway.LLMRequest{Claims: map[string]any{"run_id": run}, NoUsage: true})
	if err != nil {
		r.t.Fatal(err)
	}
	return gatewayCall{check: check, done: amend}
}
