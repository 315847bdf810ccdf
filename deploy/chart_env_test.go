package deploy

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
)

// TestChartEnvKeepsNumbersWhole: settings given as YAML numbers in env
// reach the pod as the service parses them. Helm reads a values file's
// numbers as float64, and quoting one of eight digits or more prints it as
// 1.34217728e+08, which VALKEY_BUFFER_MAX_BYTES or
// XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES refuses ("not an integer"): the pod would
// not start.
func TestChartEnvKeepsNumbersWhole(t *testing.T) {
	values := filepath.Join(t.TempDir(), "env.yaml")
	if err := os.WriteFile(values, []byte("env:\n  VALKEY_BUFFER_MAX_BYTES: 134217728\n  XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: 33554432\n"+
		"  GRPC_MAX_CONNECTIONS: 10000\n  NEAR_LIMIT_RATIO: 0.85\n  RESERVATION_EXPIRY: 2m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	for _, doc := range splitDocs(t, helmTemplate(t, exampleValues, values)) {
		var m struct {
			Kind string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if m.Kind == "Deployment" {
			dep = &appsv1.Deployment{}
			strict(t, "Deployment", doc, dep)
		}
	}
	if dep == nil {
		t.Fatal("the chart renders no Deployment")
	}
	env := podEnv(dep, t.TempDir())
	for k, want := range map[string]string{"VALKEY_BUFFER_MAX_BYTES": "134217728", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "33554432",
		"GRPC_MAX_CONNECTIONS": "10000", "NEAR_LIMIT_RATIO": "0.85", "RESERVATION_EXPIRY": "2m"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	env["REDIS_URL"] = "127.0.0.1:6379" // from the Secret in the pod
	s, err := settings.Load(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatalf("the service refuses the pod's settings: %v", err)
	}
	if s.ValkeyBufferMaxBytes != 134217728 || s.XDSClientMaxMsgSize != 33554432 {
		t.Errorf("parsed %d, %d", s.ValkeyBufferMaxBytes, s.XDSClientMaxMsgSize)
	}
}
