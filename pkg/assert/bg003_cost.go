package assert

import "github.com/budgetgen/budgetgen/pkg/manifest"

// ruleCost: the token count arrives after the response, so the request must
// only check the bucket (cost 0) and the response must charge the metadata
// Envoy AI Gateway writes. Any other source charges nothing or the wrong thing.
var ruleCost = &Rule{
	ID:       "BG003",
	Name:     "token-cost",
	Doc:      "token rules charge cost.response from the token metadata and cost.request Number 0",
	Severity: Error,
	Check: func(p *Pass) error {
		tokenNS, tokenKey := p.Options.tokenMetadata()
		for _, pol := range p.Index.BudgetPolicies() {
			for _, r := range pol.Rules {
				if r.Kind != TokenRule {
					continue
				}
				wantNS, wantKey := r.wantMetadata(tokenNS, tokenKey)
				resp := manifest.Get(r.Node, "cost", "response")
				switch {
				case resp == nil:
					p.Report(pol.Obj, r.Node, r.Path()+".cost.response", "token rule %d has no cost.response: it counts requests, not tokens; charge from Metadata %s/%s", r.Index, wantNS, wantKey)
				case manifest.Str(manifest.Get(resp, "from")) != "Metadata":
					p.Report(pol.Obj, manifest.Get(resp, "from"), r.Path()+".cost.response.from", "token rule %d charges the response from %q, want Metadata %s/%s", r.Index, manifest.Str(manifest.Get(resp, "from")), wantNS, wantKey)
				default:
					md := manifest.Get(resp, "metadata")
					ns, key := manifest.Str(manifest.Get(md, "namespace")), manifest.Str(manifest.Get(md, "key"))
					if ns != wantNS || key != wantKey {
						at := md
						if at == nil {
							at = resp
						}
						p.Report(pol.Obj, at, r.Path()+".cost.response.metadata", "token rule %d charges metadata %s/%s, want %s/%s (where llmRequestCosts writes the token count)", r.Index, ns, key, wantNS, wantKey)
					}
				}
				req := manifest.Get(r.Node, "cost", "request")
				num, isNum := manifest.Int(manifest.Get(req, "number"))
				switch {
				case req == nil:
					p.Report(pol.Obj, manifest.Get(r.Node, "cost"), r.Path()+".cost.request", "token rule %d has no cost.request: each request is charged 1 on top of its tokens; set {from: Number, number: 0}", r.Index)
				case manifest.Str(manifest.Get(req, "from")) != "Number" || !isNum || num != 0:
					p.Report(pol.Obj, req, r.Path()+".cost.request", "token rule %d must check the bucket without charging at request time: set cost.request {from: Number, number: 0}", r.Index)
				}
			}
		}
		return nil
	},
}
