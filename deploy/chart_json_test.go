package deploy

import (
	"net/http"
	"strings"
	"testing"
)

// TestChartJSONOnlyBehindClientCertificates: the chart's NetworkPolicy
// opens the HTTP port to every source (the kubelet's probes come from the
// node), and restricts gRPC to networkPolicy.grpcFrom. With tls.mode server
// or disabled, HTTP_JSON=auto served /json there, so any pod in the cluster
// could charge (or drain) any principal's budget through it, which the gRPC
// port refuses to that pod. The chart now sets HTTP_JSON=false unless
// env.HTTP_JSON says otherwise: /json answers 404, /healthcheck 200.
func TestChartJSONOnlyBehindClientCertificates(t *testing.T) {
	body := `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	for _, set := range [][]string{{"tls.mode=server"}, {"tls.mode=disabled"}, nil} {
		p := startChartPod(t, nil, nil, set...)
		base := "http://" + p.ports["http"].String()
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("--set %v: /json: %v", set, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("--set %v: /json answered %d on the port open to every pod, want 404", set, resp.StatusCode)
		}
		resp, err = http.Get(base + "/healthcheck")
		if err != nil {
			t.Fatalf("--set %v: /healthcheck: %v", set, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("--set %v: /healthcheck answered %d, want 200", set, resp.StatusCode)
		}
	}
	// An operator who asks for /json gets it (here without client
	// certificates: their NetworkPolicy must then restrict the HTTP port).
	p := startChartPod(t, nil, nil, "tls.mode=disabled", "env.HTTP_JSON=true")
	resp, err := http.Post("http://"+p.ports["http"].String()+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		t.Errorf("env.HTTP_JSON=true: /json answered 404")
	}
}
