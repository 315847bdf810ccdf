package service

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// logLines returns the log lines holding all of want.
func logLines(logs string, want ...string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		ok := l != ""
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// TestRoutineStartAndStopLogAtInfo: with the default log level, a routine
// start (embedded store, a config directory) and a clean stop log their
// facts at INFO with the fields an operator needs, and nothing at WARN or
// ERROR.
func TestRoutineStartAndStopLogAtInfo(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 5}\n")
	s := startService(t, dir, nil)
	call(t, s.client, "d", "user", "alice")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	logs := s.logs.String()
	if bad := append(logLines(logs, "level=WARN"), logLines(logs, "level=ERROR")...); len(bad) > 0 {
		t.Errorf("routine start and stop logged above INFO:\n%s", strings.Join(bad, "\n"))
	}
	for _, want := range [][]string{
		{"level=INFO", `msg="counter store"`, "store=\"memory", "failure_policy=allow", "store_timeout="},
		{"level=INFO", `msg="config loaded"`, "source=file", "rules=1"},
		{"level=INFO", "msg=listening", "grpc=127.0.0.1:", "http=127.0.0.1:", "version=", "log_level=INFO"},
		{"level=INFO", `msg="shutting down: not ready, serving for the shutdown delay, then draining in-flight calls"`, "shutdown_delay=0s"},
		{"level=INFO", `msg="stopped: listeners closed after draining in-flight calls"`},
	} {
		if len(logLines(logs, want...)) != 1 {
			t.Errorf("no single log line with %q:\n%s", want, logs)
		}
	}
}

// TestValkeyOutageLoggedAndHealthSaysWhy: Valkey down at start makes
// /healthcheck say why it is not ready; its arrival is an INFO event; an
// outage later is one WARN when the failure policy starts answering and one
// INFO, with the outage's length, when Valkey answers again.
func TestValkeyOutageLoggedAndHealthSaysWhy(t *testing.T) {
	port := valkeytest.FreePort(t)
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	s := startService(t, dir, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": fmt.Sprintf("127.0.0.1:%d", port), "OVER_LIMIT_CACHE_SIZE": "-1"})
	_, h, _, _ := s.srv.Addrs()
	health := func() (int, string) {
		resp, err := http.Get("http://" + h.String() + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := health(); code != http.StatusInternalServerError || !strings.Contains(body, "redis: valkey has not answered since start (valkey standalone 127.0.0.1:") ||
		!strings.Contains(body, "FAILURE_POLICY=allow") {
		t.Fatalf("health check with Valkey down: %d %q", code, body)
	}
	vk := valkeytest.Start(t, valkeytest.Options{Port: port})
	waitFor(t, "the health check to turn ready", func() bool { code, _ := health(); return code == http.StatusOK })
	waitFor(t, "the connection to be logged", func() bool {
		return len(logLines(s.logs.String(), "level=INFO", `msg="valkey connected: health check ready"`, "waited=")) == 1
	})
	chargeUser(t, s.client, "alice", 1)
	vk.Kill()
	waitFor(t, "the outage to be logged", func() bool {
		chargeUser(t, s.client, "alice", 1) // answered by the failure policy (allow)
		return len(logLines(s.logs.String(), "level=WARN", `msg="counter store failing: requests are answered by the failure policy"`, "failure_policy=allow")) == 1
	})
	vk.Restart()
	waitFor(t, "the recovery to be logged", func() bool {
		chargeUser(t, s.client, "alice", 1)
		return len(logLines(s.logs.String(), "level=INFO", `msg="counter store answering again"`, "outage=", "failure_policy_answers=")) == 1
	})
}
