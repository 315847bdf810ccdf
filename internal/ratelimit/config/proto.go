package config

import (
	"fmt"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// FromProto builds a config from xDS RateLimitConfig resources (what Envoy
// Gateway serves), with the same validation as the YAML path. Resources are
// named by their name (or domain) in errors. Like the reference's
// ConfigXdsProtoToYaml, quota_mode and metadata are not carried over.
func FromProto(cfgs []*rlsconfv3.RateLimitConfig) (*Config, error) {
	docs := make([]*Document, 0, len(cfgs))
	names := make([]string, 0, len(cfgs))
	for i, pc := range cfgs {
		if pc == nil {
			return nil, &yamlpos.Error{File: fmt.Sprintf("resource[%d]", i), Msg: "nil RateLimitConfig"}
		}
		name := pc.GetName()
		if name == "" {
			name = pc.GetDomain()
		}
		names = append(names, "xds:"+name)
		docs = append(docs, &Document{Domain: pc.GetDomain(), Descriptors: descriptorsFromProto(pc.GetDescriptors())})
	}
	return Build(docs, names)
}

func descriptorsFromProto(in []*rlsconfv3.RateLimitDescriptor) []Descriptor {
	if len(in) == 0 {
		return nil
	}
	out := make([]Descriptor, len(in))
	for i, d := range in {
		out[i] = Descriptor{
			Key: d.GetKey(), Value: d.GetValue(), Descriptors: descriptorsFromProto(d.GetDescriptors()),
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(),
		}
		if p := d.GetRateLimit(); p != nil {
			pol := &Policy{
				Unit: p.GetUnit().String(), RequestsPerUnit: p.GetRequestsPerUnit(),
				Unlimited: p.GetUnlimited(), Name: p.GetName(),
			}
			for _, r := range p.GetReplaces() {
				pol.Replaces = append(pol.Replaces, Replace{Name: r.GetName()})
			}
			out[i].RateLimit = pol
		}
	}
	return out
}
