package agentgateway

import (
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
	// NoUsage: the response reported no token counts (an upstream error:
	// agentgateway keeps a default LLMResponse, llm/mod.rs process_response),
	// so InputTokens and OutputTokens are not known.
	NoUsage bool
}

// Requests returns the two ShouldRateLimit calls agentgateway's remote rate
// limit client (crates/agentgateway/src/http/remoteratelimit.rs) makes for
// the Tokens descriptors of g: the request-time check, whose answer decides,
// and the amend after the response, whose answer is ignored. A descriptor
// whose entry does not evaluate to a string is dropped; when all are, the
// call is nil (not made). Request-level hits_addend is 0; every descriptor
// carries its own: without a cost, the estimate at request time and
// (response input - estimate) + output in the amend (amend_tokens in
// llm/mod.rs: 0 for a response without usage, a negative delta left out);
// with a cost, 0 at request time and the cost's value in the amend, the
// descriptor left out of the amend when the cost fails. agentgateway sends
// the amend after a check answered OK (or failed under FailOpen), once the
// response is processed, even with every descriptor left out (then it has
// none); it sends none after an OVER_LIMIT answer (PolicyResponse::apply in
// crates/agentgateway/src/http/mod.rs returns the 429 and the amend is
// dropped), nor when the request ends before its response is processed
// (docs/agentgateway.md lists those): callers send amend only for an
// admitted request that got a response.
func Requests(g *GlobalRateLimit, r LLMRequest) (check, amend *rlsv3.RateLimitRequest, err error) {
	ev, err := NewEvaluator()
	if err != nil {
		return nil, nil, err
	}
	check = &rlsv3.RateLimitRequest{Domain: g.Domain}
	amend = &rlsv3.RateLimitRequest{Domain: g.Domain}
	for _, d := range g.Descriptors {
		if d.Unit != UnitTokens {
			continue
		}
		entries, ok := evalEntries(ev, d.Entries, r.Claims)
		if !ok {
			continue
		}
		atRequest, charge, charged, err := descriptorHits(d, r)
		if err != nil {
			return nil, nil, err
		}
		check.Descriptors = append(check.Descriptors, &rlcommon.RateLimitDescriptor{Entries: entries, HitsAddend: wrapperspb.UInt64(atRequest)})
		if charged {
			amend.Descriptors = append(amend.Descriptors, &rlcommon.RateLimitDescriptor{Entries: entries, HitsAddend: wrapperspb.UInt64(charge)})
		}
	}
	if len(check.Descriptors) == 0 {
		return nil, nil, nil
	}
	// An amend that leaves out every descriptor is still sent:
	// LLMResponseAmend::amend_tokens spawns check_internal whatever
	// apply_token_amend kept (remoteratelimit.rs), so the service receives
	// a request with no descriptors, which it rejects (InvalidArgument, as
	// the reference does) without charging or holding anything.
	return check, amend, nil
}

// descriptorHits is what a Tokens descriptor adds at request time and in
// the amend; charged is false when the amend leaves it out.
func descriptorHits(d Descriptor, r LLMRequest) (atRequest, charge uint64, charged bool, err error) {
	if d.Cost != "" {
		charge, charged, err = evalCost(d.Cost, r)
		return 0, charge, charged, err
	}
	// "(response input - request input) + output"; with no usage in the
	// response the input mismatch is 0 and the output 0.
	delta := int64(r.InputTokens) - int64(r.EstimatedInputTokens) + int64(r.OutputTokens)
	if r.NoUsage {
		delta = 0
	}
	return r.EstimatedInputTokens, uint64(max(delta, 0)), delta >= 0, nil
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
