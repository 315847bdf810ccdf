package ledger_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/thresholds"
)

const benchConfig = `domain: ns/pol
descriptors:
  - key: ns/pol/rule/0
    value: ns/pol/rule/0
    shadow_mode: true
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: day, requests_per_unit: 1000000000}
`

// BenchmarkEngineCharge compares the decision engine's CPU per token charge
// (embedded store, so only the service's own work is measured) without and
// with the shadow-week ledger and threshold events.
func BenchmarkEngineCharge(b *testing.B) {
	cfg, err := config.Load([]config.File{{Name: "bench.yaml", Data: []byte(benchConfig)}})
	if err != nil {
		b.Fatal(err)
	}
	for _, withLedger := range []bool{false, true} {
		b.Run(fmt.Sprintf("ledger=%v", withLedger), func(b *testing.B) {
			lm := ledger.NewMemory("", nil)
			lm.MaxFields = 1 << 30
			o := engine.Options{Store: memory.New(memory.Options{Ledger: lm}), OverLimitCacheSize: -1}
			if withLedger {
				rec, _ := ledger.NewRecorder(ledger.Options{}, lm, nil)
				det, _ := thresholds.New(thresholds.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				o.Observers = []observe.Observer{&observe.Ledger{Recorder: rec, Thresholds: det}}
			}
			eng, err := engine.New(o)
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close()
			eng.SetConfig(cfg)
			reqs := make([]*rlpb.RateLimitRequest, 1000)
			for i := range reqs {
				reqs[i] = &rlpb.RateLimitRequest{Domain: "ns/pol", Descriptors: []*rlcommon.RateLimitDescriptor{{
					Entries: []*rlcommon.RateLimitDescriptor_Entry{
						{Key: "ns/pol/rule/0", Value: "ns/pol/rule/0"},
						{Key: "rule-0-match-0", Value: fmt.Sprintf("run-%08d-0000-4000-8000-%012d", i, i)},
					},
					HitsAddend: wrapperspb.UInt64(1234),
				}}}
			}
			ctx := context.Background()
			_ = time.Now
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := eng.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
