package deploy

import (
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// goRuntimeEnv are the Go runtime's variables a platform team sets on the
// container (GOMAXPROCS to the CPU limit, GOMEMLIMIT): not settings of the
// table, read by the runtime itself.
var goRuntimeEnv = []string{"GODEBUG", "GOGC", "GOMAXPROCS", "GOMEMLIMIT"}

// TestChartEnvNamesAreSettings: values.schema.json accepts in env exactly
// the service's settings (settings.Docs, and the reference's settings it
// accepts apart from the table) and the Go runtime's variables, less those
// the chart sets itself, so a misspelt name (LOG_LEVL) fails helm install
// instead of being ignored by the service; and every name it refuses as set
// by the chart is a setting.
func TestChartEnvNamesAreSettings(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Env struct {
				PropertyNames struct {
					Enum []string `json:"enum"`
					Not  struct {
						Enum []string `json:"enum"`
					} `json:"not"`
				} `json:"propertyNames"`
			} `json:"env"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, d := range settings.Docs() {
		for _, e := range d.Env {
			names[e] = true
		}
	}
	for _, a := range settings.Accepted() {
		names[a[0]] = true
	}
	pn := schema.Properties.Env.PropertyNames
	for _, n := range pn.Not.Enum {
		if !names[n] {
			t.Errorf("env refuses %s, which is no setting", n)
		}
		delete(names, n)
	}
	for _, n := range goRuntimeEnv {
		names[n] = true
	}
	want := slices.Sorted(maps.Keys(names))
	if got := slices.Sorted(slices.Values(pn.Enum)); !slices.Equal(got, want) {
		t.Errorf("env's propertyNames.enum in values.schema.json: want exactly (sorted)\n%q\ngot\n%q", want, got)
	}
	helmRefuses(t, "invalid propertyName 'LOG_LEVL'", "--values", exampleValues, "--set", "env.LOG_LEVL=debug")
}

// TestChartRefusesLoopbackListenHosts: env.HOST or env.GRPC_HOST on a
// loopback address (127.0.0.0/8, ::1, localhost) is out of reach: the
// kubelet's probes dial the HTTP port on the pod's address (the pod would never
// be ready), and Envoy the gRPC port through the Service. The chart refuses them at
// install, naming the setting; other hosts are rendered as given. DEBUG_HOST
// is left alone: no probe uses it and the service's own default is loopback.
func TestChartRefusesLoopbackListenHosts(t *testing.T) {
	dir := t.TempDir()
	values := func(k, v string) string { // one file, rewritten per case
		f := filepath.Join(dir, "values.yaml")
		b, err := sigsyaml.Marshal(map[string]any{"env": map[string]string{k: v}})
		if err == nil {
			err = os.WriteFile(f, b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, k := range []string{"HOST", "GRPC_HOST"} {
		for _, v := range []string{"127.0.0.1", "127.3.2.1", "::1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "localhost", "LocalHost"} {
			helmRefuses(t, "env."+k+" is "+v+", a loopback address", "--values", exampleValues, "--values", values(k, v))
		}
		for _, v := range []string{"0.0.0.0", "::", "10.1.2.3", "128.0.0.1", "10::1", "localhost.example.com"} {
			docs := helmTemplate(t, exampleValues, values(k, v))
			if !strings.Contains(string(docs), "- name: "+k+"\n") || !strings.Contains(string(docs), strconv.Quote(v)) {
				t.Errorf("env.%s=%s: not rendered", k, v)
			}
		}
	}
	helmTemplate(t, exampleValues, values("DEBUG_HOST", "127.0.0.1"))
}
