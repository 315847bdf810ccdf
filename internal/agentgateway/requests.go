package agentgateway

import (
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// LLMRequest is what agentgateway knows about one LLM request when it calls
// the rate limit server.
type LLMRequest struct {
	// Claims of the verified JWT (the CEL variable jwt); nil: no JWT verified.
	Claims map[string]any
	// EstimatedInputTokens is the prompt's token count when the gateway
	// tokenized the request, else 0 (then the request-time call only checks).
	EstimatedInputTokens uint64
	// InputTokens and OutputTokens are the response's counts.
	InputTokens, OutputTokens uint64
}

// Requests returns the two ShouldRateLimit calls agentgateway's remote rate
// limit client (crates/agentgateway/src/http/remoteratelimit.rs) makes for
// the Tokens descriptors of g: the request-time check, whose answer decides,
// and the amend after the response, whose answer is ignored. A descriptor
// whose entry does not evaluate to a string is dropped; when all are, the
// call is nil (not made). Request-level hits_addend is 0; every descriptor
// carries its own. Descriptors with a cost expression are not simulated.
func Requests(g *GlobalRateLimit, r LLMRequest) (check, amend *rlsv3.RateLimitRequest, err error) {
	ev, err := NewEvaluator()
	if err != nil {
		return nil, nil, err
	}
	check = &rlsv3.RateLimitRequest{Domain: g.Domain}
	amend = &rlsv3.RateLimitRequest{Domain: g.Domain}
	// "(response input - request input) + output"; negative amends are skipped.
	delta := int64(r.InputTokens) - int64(r.EstimatedInputTokens) + int64(r.OutputTokens)
	for _, d := range g.Descriptors {
		if d.Unit != UnitTokens {
			continue
		}
		if d.Cost != "" {
			return nil, nil, fmt.Errorf("descriptor cost expressions are not simulated")
		}
		entries, ok := evalEntries(ev, d.Entries, r.Claims)
		if !ok {
			continue
		}
		check.Descriptors = append(check.Descriptors, &rlcommon.RateLimitDescriptor{
			Entries: entries, HitsAddend: wrapperspb.UInt64(r.EstimatedInputTokens),
		})
		if delta >= 0 {
			amend.Descriptors = append(amend.Descriptors, &rlcommon.RateLimitDescriptor{
				Entries: entries, HitsAddend: wrapperspb.UInt64(uint64(delta)),
			})
		}
	}
	if len(check.Descriptors) == 0 {
		return nil, nil, nil
	}
	if len(amend.Descriptors) == 0 {
		amend = nil
	}
	return check, amend, nil
}

// evalEntries evaluates a descriptor's entries (EvalEntry); false when one
// fails, which drops the descriptor.
func evalEntries(ev *Evaluator, es []Entry, claims map[string]any) ([]*rlcommon.RateLimitDescriptor_Entry, bool) {
	out := make([]*rlcommon.RateLimitDescriptor_Entry, 0, len(es))
	for _, e := range es {
		v, err := ev.Eval(e.Expression, claims)
		if err != nil {
			return nil, false
		}
		out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: e.Name, Value: v})
	}
	return out, true
}
