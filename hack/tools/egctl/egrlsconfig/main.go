// Command egrlsconfig prints the rate limit service configuration that Envoy
// Gateway serves its rate limit service for a set of Gateway API and Envoy
// Gateway resources, which `egctl x translate` cannot print (its output types
// are gateway-api, xds, whose resource types are bootstrap, endpoint,
// cluster, listener and route, and ir).
//
// It runs EG's own code the way EG does, no model of it: the resources are
// loaded and translated to the xDS IR exactly as `egctl x translate
// --add-missing-resources` does (internal/cmd/egctl/translate.go of
// envoyproxy/gateway), then each Gateway's IR is turned into rate limit
// configs by translator.BuildRateLimitServiceConfig, the function EG's global
// rate limit runner calls for every xDS IR update
// (internal/globalratelimit/runner/runner.go).
//
// Usage: egrlsconfig FILE. The output is one JSON object: per xDS IR key
// ("<namespace>/<gateway>"), the list of RateLimitConfig messages in
// protojson, in the order EG builds them.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"github.com/envoyproxy/gateway/internal/gatewayapi"
	"github.com/envoyproxy/gateway/internal/gatewayapi/resource"
	"github.com/envoyproxy/gateway/internal/logging"
	"github.com/envoyproxy/gateway/internal/xds/translator"
	"google.golang.org/protobuf/encoding/protojson"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: egrlsconfig FILE")
		os.Exit(2)
	}
	out, err := run(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "egrlsconfig:", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}

func run(path string) ([]byte, error) {
	in, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	res, err := resource.LoadResourcesFromYAMLBytes(in, true, nil)
	if err != nil {
		return nil, fmt.Errorf("unable to unmarshal input: %w", err)
	}
	if res.GatewayClass == nil {
		return nil, fmt.Errorf("the GatewayClass resource is required")
	}
	// The options of egctl's TranslateGatewayAPIToXds.
	t := &gatewayapi.Translator{
		GatewayControllerName:   string(res.GatewayClass.Spec.ControllerName),
		GatewayClassName:        gwapiv1.ObjectName(res.GatewayClass.Name),
		GlobalRateLimitEnabled:  true,
		EndpointRoutingDisabled: true,
		EnvoyPatchPolicyEnabled: true,
		BackendEnabled:          true,
		Logger:                  logging.DefaultLogger(io.Discard, egv1a1.LogLevelInfo),
	}
	// Like egctl, ignore the error: what went wrong is in the statuses,
	// which `egctl x translate --to gateway-api` prints.
	result, _ := t.Translate(context.Background(), res)
	keys := make([]string, 0, len(result.XdsIR))
	for k := range result.XdsIR {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[string][]json.RawMessage{}
	for _, k := range keys {
		out[k] = []json.RawMessage{}
		for _, cfg := range translator.BuildRateLimitServiceConfig(result.XdsIR[k].HTTP) {
			b, err := protojson.Marshal(cfg)
			if err != nil {
				return nil, err
			}
			out[k] = append(out[k], b)
		}
	}
	return json.MarshalIndent(out, "", "  ")
}
