package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// Mixes of calls (-mix).
const (
	// mixCharge: every call charges one hit per descriptor (the request
	// count shape of the reference's own load tests): scenario A.
	mixCharge = "charge"
	// mixLLM: every LLM request is two calls, as Envoy Gateway sends a token
	// budget's: a request-time check (descriptor hits_addend 0) and the
	// stream-done charge of the response's tokens (200 to 4,000, per
	// principal). Ours runs with a budget map naming every rule a budget
	// (so a reserving one holds and releases), the reference without.
	mixLLM = "llm"
)

// prepared is one pre-built call: the request and its framed body.
type prepared struct {
	req  *rlpb.RateLimitRequest
	body []byte
}

// workload is the pre-built calls of every principal, so the generator
// spends its CPU on the calls.
type workload struct {
	perPrincipal [][]prepared
}

func (w workload) principals() int        { return len(w.perPrincipal) }
func (w workload) calls(p int) []prepared { return w.perPrincipal[p] }
func rule(i int) string                   { return budgetmap.RuleDescriptor(domain, i) }
func entries(i int, user string) []*rlcommon.RateLimitDescriptor_Entry {
	return []*rlcommon.RateLimitDescriptor_Entry{{Key: rule(i), Value: rule(i)}, {Key: fmt.Sprintf("rule-%d-match-0", i), Value: user}}
}

func newWorkload(o options) (workload, error) {
	var w workload
	for p := 0; p < o.principals; p++ {
		user := fmt.Sprintf("user-%07d@example.com", p)
		var calls []prepared
		switch o.mix {
		case mixLLM:
			tokens := uint64(200 + (p*7919)%3800)
			calls = []prepared{request(o, user, wrapperspb.UInt64(0)), request(o, user, wrapperspb.UInt64(tokens))}
		default:
			calls = []prepared{request(o, user, nil)}
		}
		w.perPrincipal = append(w.perPrincipal, calls)
	}
	for _, cs := range w.perPrincipal {
		for i := range cs {
			b, err := proto.Marshal(cs[i].req)
			if err != nil {
				return w, err
			}
			cs[i].body = frame(b)
		}
	}
	return w, nil
}

// request is one call of user over o.descriptors rules, each descriptor
// adding hits (nil: the request's default, 1).
func request(o options, user string, hits *wrapperspb.UInt64Value) prepared {
	r := &rlpb.RateLimitRequest{Domain: domain}
	for i := 0; i < o.descriptors; i++ {
		r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{Entries: entries(i, user), HitsAddend: hits})
	}
	return prepared{req: r}
}

// writeBudgetMap writes the budget map ours runs with in the llm mix: every
// rule a budget of its own, reserving what -reserve says.
func writeBudgetMap(dir string, o options) (string, error) {
	var b strings.Builder
	b.WriteString("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetMap\nbudgetSet: bench\nentries:\n")
	for i := 0; i < o.descriptors; i++ {
		fmt.Fprintf(&b, "  - domain: %s\n    descriptor: [{key: %s, value: %s}]\n    gateway: {kind: envoy, namespace: default, name: llm}\n"+
			"    budget: b%d\n    bucket: bench/b%d\n    kind: tokens\n    principal: {header: x-user}\n    tokensPerDay: %d\n    window: day\n    mode: enforce\n",
			domain, rule(i), rule(i), i, i, o.limit)
		switch {
		case o.reserve == "auto":
			b.WriteString("    reserve: {auto: true, initial: 4000}\n")
		case o.reserve != "":
			fmt.Fprintf(&b, "    reserve: {tokens: %s}\n", o.reserve)
		}
	}
	path := filepath.Join(dir, "budget-map.yaml")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}
