package settings

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestShutdownDelaySetting: SHUTDOWN_DELAY is auto by default, which is
// DefaultKubernetesShutdownDelay in a pod (KUBERNETES_SERVICE_HOST set) and
// nothing elsewhere (a local run, the tests); an explicit value wins, the
// flag wins over it, and out-of-range values are refused by name.
func TestShutdownDelaySetting(t *testing.T) {
	pod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for mk, mv := range m {
			out[mk] = mv
		}
		return out
	}
	for _, c := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    time.Duration
		wantErr string
	}{
		{name: "outside a pod: none", want: 0},
		{name: "in a pod: the Kubernetes default", env: pod, want: DefaultKubernetesShutdownDelay},
		{name: "auto spelled out", env: with(pod, "SHUTDOWN_DELAY", "AUTO"), want: DefaultKubernetesShutdownDelay},
		{name: "explicit 0 in a pod", env: with(pod, "SHUTDOWN_DELAY", "0s"), want: 0},
		{name: "explicit outside a pod", env: map[string]string{"SHUTDOWN_DELAY": "3s"}, want: 3 * time.Second},
		{name: "flag wins", env: with(pod, "SHUTDOWN_DELAY", "20s"), args: []string{"--shutdown-delay", "1s"}, want: time.Second},
		{name: "at the bound", env: map[string]string{"SHUTDOWN_DELAY": "2m"}, want: MaxShutdownDelay},
		{name: "above the bound", env: map[string]string{"SHUTDOWN_DELAY": "121s"}, wantErr: "SHUTDOWN_DELAY: 2m1s not in [0s,2m0s]"},
		{name: "negative", env: map[string]string{"SHUTDOWN_DELAY": "-1s"}, wantErr: "SHUTDOWN_DELAY: -1s not in"},
		{name: "not a duration", env: map[string]string{"SHUTDOWN_DELAY": "ten"}, wantErr: `SHUTDOWN_DELAY: not a duration or auto: "ten"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Load(c.args, envOf(c.env), io.Discard)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.ShutdownDelay != c.want {
				t.Fatalf("ShutdownDelay = %v, want %v", s.ShutdownDelay, c.want)
			}
		})
	}
}
