package service

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestValkeyDownAtStart: the service starts with Valkey unreachable instead
// of exiting. Until Valkey answers, the health check says not ready and every
// request gets the failure policy's answer within the store deadline; its
// hits are buffered. Once Valkey starts, the store connects by itself, the
// health check turns ready, and the buffered hits land exactly once.
func TestValkeyDownAtStart(t *testing.T) {
	for _, policy := range []string{"allow", "deny"} {
		t.Run(policy, func(t *testing.T) {
			port := valkeytest.FreePort(t)
			dir := t.TempDir()
			writeConfig(t, dir, "d.yaml", snapConfig)
			s := startService(t, dir, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": fmt.Sprintf("127.0.0.1:%d", port), "FAILURE_POLICY": policy, "OVER_LIMIT_CACHE_SIZE": "-1"})
			_, h, _, _ := s.srv.Addrs()
			health := func() int {
				resp, err := http.Get("http://" + h.String() + "/healthcheck")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if code := health(); code == http.StatusOK {
				t.Fatalf("health check %d with Valkey down, want not ready", code)
			}
			const calls, hits = 20, 1000
			lag := schedtest.Start()
			defer lag.Stop()
			var slowest time.Duration
			for i := range calls {
				start := time.Now()
				ctx := t.Context()
				resp, err := s.client.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "d", HitsAddend: hits, Descriptors: userDescriptor("alice")})
				took := time.Since(start)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				want := rlpb.RateLimitResponse_OK
				if policy == "deny" {
					want = rlpb.RateLimitResponse_OVER_LIMIT
				}
				if resp.OverallCode != want || (policy == "allow" && resp.Statuses[0].LimitRemaining != 1_000_000) {
					t.Fatalf("call %d with Valkey down: %v, want the %s policy's answer", i, resp, policy)
				}
				slowest = max(slowest, took)
			}
			// 1 s plus the scheduler's worst lag in this run: a call that
			// waited for the store to connect would take the dial timeout
			// and more.
			if _, lagMax := lag.Stop(); slowest > time.Second+lagMax {
				t.Fatalf("slowest call took %v with Valkey down (bound 1 s + scheduler lag %v)", slowest, lagMax)
			}
			if got := metricValue(t, s, "ratelimit_valkey_not_connected_calls_total"); got < 1 {
				t.Fatalf("ratelimit_valkey_not_connected_calls_total = %v with Valkey down, want the refused calls counted", got)
			}
			valkeytest.Start(t, valkeytest.Options{Port: port})
			waitFor(t, "the health check to turn ready", func() bool { return health() == http.StatusOK })
			// Replayed within the store's replay interval; then exactly once.
			want := uint32(1_000_000 - calls*hits - 1)
			deadline := time.Now().Add(5 * time.Second)
			var got uint32
			for n := uint32(0); ; n++ {
				got = chargeUser(t, s.client, "alice", 1)
				if got == want-n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("remaining %d after %d checks, want %d: the buffered %d hits did not land", got, n+1, want-n, calls*hits)
				}
				time.Sleep(50 * time.Millisecond) // poll interval
				if got < want-n {
					t.Fatalf("remaining %d, below %d: buffered hits counted more than once", got, want-n)
				}
			}
			time.Sleep(500 * time.Millisecond) // stays: time passing must replay nothing more
			if again := chargeUser(t, s.client, "alice", 1); again != got-1 {
				t.Fatalf("remaining %d after one more hit, want %d (replayed once)", again, got-1)
			}
		})
	}
}

func userDescriptor(user string) []*rlcommon.RateLimitDescriptor {
	return []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}
}

// metricValue reads one unlabelled series from the debug port's /metrics.
func metricValue(t *testing.T, s *svc, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(get(t, s.debug+"/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}
