package xds_test

import (
	"bufio"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// sample is the value of one series in a Prometheus text exposition, and
// whether it is there.
func sample(exposition, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// scraped reads series from the service's /metrics, failing the test when
// it is missing.
func scraped(t *testing.T, exposition, series string) float64 {
	t.Helper()
	v, ok := sample(exposition, series)
	if !ok {
		t.Fatalf("%s not exported", series)
	}
	return v
}

func errorsOf(reason string) string {
	return `ratelimit_config_xds_stream_errors_total{reason="` + reason + `"}`
}

// The service exports the xDS client's state on its /metrics: the stream
// gauge is 1 while Envoy Gateway's server runs, 0 once it stops (the open
// stream broken, reconnects refused), 1 again when it is back; the
// attempts and errors count up, and the last response's time moves.
func TestServiceExportsXDSStreamMetrics(t *testing.T) {
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", cfg("llm/budgets", 1))
	start := time.Now()
	srv := runService(t, map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": eg.addr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
	})
	// The service started after its first config (FORCE_START_WITHOUT_INITIAL_CONFIG=false).
	m := metrics(t, srv)
	last := scraped(t, m, "ratelimit_config_xds_last_received_timestamp_seconds")
	if up, n := scraped(t, m, "ratelimit_config_xds_stream_up"), scraped(t, m, "ratelimit_config_xds_connect_attempts_total"); up != 1 || n != 1 || last < float64(start.Unix()) {
		t.Fatalf("connected: up %v, attempts %v, last response %v; want 1, 1, since %d", up, n, last, start.Unix())
	}
	for _, r := range xds.StreamErrorReasons {
		if n := scraped(t, m, errorsOf(r)); n != 0 {
			t.Errorf("connected: %s errors %v, want 0 (exported at zero)", r, n)
		}
	}

	addr := eg.addr
	eg.stop()
	eventually(t, "the stream down, a reconnect refused", func() bool {
		m = metrics(t, srv)
		return scraped(t, m, "ratelimit_config_xds_stream_up") == 0 && scraped(t, m, errorsOf(xds.ReasonBroken)) == 1 &&
			scraped(t, m, errorsOf(xds.ReasonConnect)) >= 1
	})
	attempts := scraped(t, m, "ratelimit_config_xds_connect_attempts_total")
	if attempts < 2 || scraped(t, m, "ratelimit_config_xds_last_received_timestamp_seconds") != last {
		t.Errorf("server stopped: %v attempts, want 2 or more; last response %v, want %v", attempts, scraped(t, m, "ratelimit_config_xds_last_received_timestamp_seconds"), last)
	}

	eg2 := startEG(t, addr, nil)
	eg2.set("1", cfg("restarted/policy", 2))
	eventually(t, "the stream up again with a new response", func() bool {
		m = metrics(t, srv)
		return scraped(t, m, "ratelimit_config_xds_stream_up") == 1 && scraped(t, m, "ratelimit_config_xds_last_received_timestamp_seconds") > last
	})
	if n := scraped(t, m, "ratelimit_config_xds_connect_attempts_total"); n <= attempts {
		t.Errorf("attempts %v after the restart, want more than %v", n, attempts)
	}
}

// A service that reads its config from files has no xDS stream and no xDS
// series: a stream gauge at 0 there would read as a stream down.
func TestFileConfiguredServiceHasNoXDSSeries(t *testing.T) {
	srv := runService(t, map[string]string{"CONFIG_DIR": filepath.Join("..", "..", "..", "examples", "ratelimit")})
	m := metrics(t, srv)
	if _, ok := sample(m, "ratelimit_config_rules"); !ok {
		t.Fatal("no ratelimit_config_rules: not the service's metrics")
	}
	if strings.Contains(m, "ratelimit_config_xds_") {
		t.Error("a file-configured service exports xDS series")
	}
}
