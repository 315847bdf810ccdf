package decide

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/refseq"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// diffConfig is the differential test's config (internal/ratelimit/refseq).
const diffConfig = refseq.Config

func dsc(kv ...string) *rlcommon.RateLimitDescriptor { return refseq.Dsc(kv...) }

func hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	return refseq.Hits(d, n)
}

func rq(domain string, h uint32, ds ...*rlcommon.RateLimitDescriptor) *rlpb.RateLimitRequest {
	return refseq.Rq(domain, h, ds...)
}

func mustConfig(t *testing.T, y string) *config.Config {
	t.Helper()
	c, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(y)}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sim is a store in a map: Plan, charge every limited item, Answer.
type sim struct {
	cfg      *config.Config
	planner  Planner
	policy   Policy
	counters map[string]uint64
	sc       Scratch
}

// epochWindows are the reference's windows (the differential test's mode).
func epochWindows(t testing.TB) window.Windows {
	w, err := window.New(window.Options{Mode: window.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func newSim(t *testing.T, p Policy) *sim {
	return &sim{cfg: mustConfig(t, diffConfig), planner: Planner{Keys: key.Encoder{Prefix: "rl_", Format: key.Envoy}, Windows: epochWindows(t)},
		policy: p, counters: map[string]uint64{}}
}

func (s *sim) do(t *testing.T, now time.Time, r *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, Verdict, []Item) {
	t.Helper()
	if err := Validate(r, Limits{}); err != nil {
		t.Fatal(err)
	}
	items := s.planner.Plan(s.cfg, r, now, &s.sc)
	for i := range items {
		it := &items[i]
		if it.Limit == nil {
			continue
		}
		s.counters[string(it.Key)] += it.Hits
		it.Total = s.counters[string(it.Key)]
	}
	resp, v, err := Answer(items, nil, now.Unix(), s.policy)
	if err != nil {
		t.Fatal(err)
	}
	return resp, v, items
}

func describe(r *rlpb.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	for _, s := range r.Statuses {
		rem := fmt.Sprint(s.LimitRemaining)
		if s.LimitRemaining == math.MaxUint32 {
			rem = "max"
		}
		fmt.Fprintf(&b, " %s/%s", s.Code, rem)
		if s.CurrentLimit != nil {
			fmt.Fprintf(&b, "@%d/%s", s.CurrentLimit.RequestsPerUnit, s.CurrentLimit.Unit)
		}
	}
	return b.String()
}

// noon is 12:00:10 UTC: no minute, hour or day window ends during the test.
var noon = time.Date(2026, 12, 1, 12, 0, 10, 0, time.UTC)

// TestReferenceSequence decides the differential test's sequence with the
// answers the reference gives (internal/ratelimit/refseq, checked by
// test/reftest against envoyproxy/ratelimit on every run) without any store.
func TestReferenceSequence(t *testing.T) {
	s := newSim(t, Policy{})
	steps := refseq.Steps()
	for _, st := range steps {
		resp, _, _ := s.do(t, noon, st.Request)
		if got := refseq.Describe(resp); got != st.Want {
			t.Fatalf("%s:\n got  %s\n want %s", st.Name, got, st.Want)
		}
		for i, ds := range resp.Statuses {
			quotaOver := st.Request.Descriptors[i].Entries[0].Key == "quota" && strings.HasSuffix(st.Name, " 1")
			switch {
			case ds.CurrentLimit == nil || quotaOver:
				if ds.DurationUntilReset != nil {
					t.Fatalf("%s: status %d has a duration_until_reset without a limit (or in quota mode over the limit)", st.Name, i)
				}
			default:
				div := int64(config.Divider(ds.CurrentLimit.Unit))
				if want := div - noon.Unix()%div; ds.DurationUntilReset.GetSeconds() != want {
					t.Fatalf("%s: status %d duration_until_reset %v, want %ds", st.Name, i, ds.DurationUntilReset, want)
				}
			}
		}
	}
	// The envoy key format shares a counter between values whose '_'
	// joins agree, as the reference does; both underscore calls used one.
	if n := s.counters["rl_diff_user_x_y_"+fmt.Sprint(noon.Unix()/86400*86400)]; n != 2 {
		t.Fatalf("underscore counter = %d, want 2 (%v)", n, s.counters)
	}
}

func TestGlobalShadowModeOnlyOverallCode(t *testing.T) {
	s := newSim(t, Policy{ShadowMode: true})
	for i, want := range []string{"OVER_LIMIT", "OVER_LIMIT"} {
		resp, v, items := s.do(t, noon, rq("diff", 0, dsc("kill", "k")))
		if resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].Code.String() != want {
			t.Fatalf("call %d: %s", i, describe(resp))
		}
		if !v.GlobalShadowed || v.Over || !items[0].Over {
			t.Fatalf("call %d: verdict %+v, item over %v", i, v, items[0].Over)
		}
	}
	// a descriptor in shadow mode is OK in its status too, not a global shadow
	s.do(t, noon, rq("diff", 0, dsc("shadow", "z")))
	s.do(t, noon, rq("diff", 0, dsc("shadow", "z")))
	resp, v, items := s.do(t, noon, rq("diff", 0, dsc("shadow", "z")))
	if describe(resp) != "OK OK/0@2/DAY" || v.GlobalShadowed || !items[0].Over {
		t.Fatalf("shadow descriptor: %s %+v over=%v", describe(resp), v, items[0].Over)
	}
}

func TestNearLimit(t *testing.T) {
	s := newSim(t, Policy{})
	var near []bool
	for i := 0; i < 5; i++ {
		_, _, items := s.do(t, noon, rq("diff", 0, dsc("user", "n")))
		near = append(near, items[0].Near)
	}
	// floor(5 * 0.8) = 4: a total of 5 is near, 1..4 are not
	if fmt.Sprint(near) != "[false false false false true]" {
		t.Fatalf("near = %v", near)
	}
}

func TestWindowBoundaries(t *testing.T) {
	midnight := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).Unix()
	for _, tc := range []struct {
		unit       config.Unit
		now        int64
		start, end int64
	}{
		{rlpb.RateLimitResponse_RateLimit_DAY, midnight - 1, midnight - 86400, midnight},
		{rlpb.RateLimitResponse_RateLimit_DAY, midnight, midnight, midnight + 86400},
		{rlpb.RateLimitResponse_RateLimit_SECOND, 17, 17, 18},
		{rlpb.RateLimitResponse_RateLimit_MINUTE, 119, 60, 120},
		// weeks start on Thursdays, as the epoch did
		{rlpb.RateLimitResponse_RateLimit_WEEK, 7*86400 + 5, 7 * 86400, 14 * 86400},
		{rlpb.RateLimitResponse_RateLimit_MONTH, 30 * 86400, 30 * 86400, 60 * 86400},
	} {
		start, end, ok := Window(epochWindows(t), tc.unit, tc.now)
		if !ok || start != tc.start || end != tc.end {
			t.Errorf("Window(%s, %d) = %d, %d, %v; want %d, %d", tc.unit, tc.now, start, end, ok, tc.start, tc.end)
		}
	}
	if _, _, ok := Window(epochWindows(t), rlpb.RateLimitResponse_RateLimit_UNKNOWN, 5); ok {
		t.Error("a unit without a divider has a window")
	}
	// Across midnight UTC: the key changes, the reset is one second before.
	s := newSim(t, Policy{})
	before := time.Unix(midnight, 0).Add(-100 * time.Millisecond)
	for i := 0; i < 5; i++ {
		s.do(t, before, rq("diff", 0, dsc("user", "m")))
	}
	resp, _, items := s.do(t, before, rq("diff", 0, dsc("user", "m")))
	if describe(resp) != "OVER_LIMIT OVER_LIMIT/0@5/DAY" || resp.Statuses[0].DurationUntilReset.GetSeconds() != 1 {
		t.Fatalf("23:59:59.9: %s reset %v", describe(resp), resp.Statuses[0].DurationUntilReset)
	}
	oldKey := string(items[0].Key)
	resp, _, items = s.do(t, time.Unix(midnight, 0), rq("diff", 0, dsc("user", "m")))
	if describe(resp) != "OK OK/4@5/DAY" || resp.Statuses[0].DurationUntilReset.GetSeconds() != 86400 || string(items[0].Key) == oldKey {
		t.Fatalf("00:00:00.0: %s reset %v key %s", describe(resp), resp.Statuses[0].DurationUntilReset, items[0].Key)
	}
	if !strings.HasSuffix(string(items[0].Key), fmt.Sprint(midnight)) {
		t.Fatalf("key %s does not name the new window", items[0].Key)
	}
}

// TestFailureAndCache: answers without totals: a store error under each
// policy, and items the over-limit cache answered.
func TestFailureAndCache(t *testing.T) {
	cfg := mustConfig(t, diffConfig)
	r := rq("diff", 0, dsc("user", "a"), dsc("shadow", "s"), dsc("none", "x"), dsc("free", "f"))
	storeErr := errors.New("store down")
	for _, tc := range []struct {
		policy FailurePolicy
		want   string
	}{
		{FailAllow, "OK OK/5@5/DAY OK/2@2/DAY OK/0 OK/max"},
		{FailDeny, "OVER_LIMIT OVER_LIMIT/0@5/DAY OK/0@2/DAY OK/0 OK/max"},
	} {
		var sc Scratch
		items := Planner{}.Plan(cfg, r, noon, &sc)
		resp, _, err := Answer(items, storeErr, noon.Unix(), Policy{Failure: tc.policy})
		if err != nil || describe(resp) != tc.want {
			t.Fatalf("%s: %v %v, want %s", tc.policy, err, resp, tc.want)
		}
	}
	var sc Scratch
	items := Planner{}.Plan(cfg, r, noon, &sc)
	_, _, err := Answer(items, storeErr, noon.Unix(), Policy{Failure: FailError})
	var se *StoreError
	if !errors.As(err, &se) || !errors.Is(err, storeErr) {
		t.Fatalf("FailError: err = %v, want a *StoreError wrapping the store's", err)
	}
	// a store error that asks for a denial (a bounded store at its bound)
	// denies under every policy, FailError included
	for _, pol := range []FailurePolicy{FailAllow, FailDeny, FailError} {
		items = Planner{}.Plan(cfg, r, noon, &sc)
		resp, _, err := Answer(items, fmt.Errorf("%w: full", ErrDenied), noon.Unix(), Policy{Failure: pol})
		if err != nil || describe(resp) != "OVER_LIMIT OVER_LIMIT/0@5/DAY OK/0@2/DAY OK/0 OK/max" {
			t.Fatalf("ErrDenied under %s: %v %v", pol, err, resp)
		}
	}
	// cached: over whatever the totals, no store slot read
	items = Planner{}.Plan(cfg, rq("diff", 0, dsc("user", "a")), noon, &sc)
	items[0].Cached = true
	resp, v, err := Answer(items, nil, noon.Unix(), Policy{})
	if err != nil || describe(resp) != "OVER_LIMIT OVER_LIMIT/0@5/DAY" || !v.Over {
		t.Fatalf("cached: %v %v %+v", err, resp, v)
	}
}

func TestPlanKeysAndHits(t *testing.T) {
	cfg := mustConfig(t, diffConfig)
	var sc Scratch
	// the buffer grows while keys are built: every key must stay intact
	var ds []*rlcommon.RateLimitDescriptor
	for i := 0; i < 40; i++ {
		ds = append(ds, dsc("user", strings.Repeat("u", i)+"!"))
	}
	r := rq("diff", 4, ds...)
	r.Descriptors[3] = hits(r.Descriptors[3], 0)
	items := Planner{}.Plan(cfg, r, noon, &sc)
	day := noon.Unix() / 86400 * 86400
	for i, it := range items {
		want := string(key.Encoder{}.Append(nil, "diff", ds[i].Entries, nil, 86400, day))
		if string(it.Key) != want {
			t.Fatalf("item %d key %q, want %q", i, it.Key, want)
		}
		wantHits := uint64(4)
		if i == 3 {
			wantHits = 0
		}
		if it.Hits != wantHits || it.WindowStart != day || it.WindowEnd != day+86400 {
			t.Fatalf("item %d: %+v", i, it)
		}
	}
}

func TestValidate(t *testing.T) {
	many := make([]*rlcommon.RateLimitDescriptor, 600)
	for i := range many {
		many[i] = dsc("user", "x")
	}
	wide := &rlcommon.RateLimitDescriptor{}
	for i := 0; i < 300; i++ {
		wide.Entries = append(wide.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	override := dsc("user", "x")
	override.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	for name, r := range map[string]*rlpb.RateLimitRequest{
		"nil":              nil,
		"empty domain":     rq("", 0, dsc("user", "x")),
		"no descriptors":   rq("d", 0),
		"many descriptors": rq("d", 0, many...),
		"many entries":     rq("d", 0, wide),
		"long key":         rq("d", 0, dsc(strings.Repeat("k", 9000), "x")),
		"long domain":      rq(strings.Repeat("d", 9000), 0, dsc("user", "x")),
		"invalid utf8":     rq("d", 0, dsc("user", "\xff\xfe")),
		"invalid utf8 key": rq("d", 0, dsc("\xc3", "x")),
		"nil descriptor":   rq("d", 0, nil),
		"nil entry":        rq("d", 0, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{nil}}),
		"huge hits":        rq("d", 0, hits(dsc("user", "x"), math.MaxUint64)),
		"override no unit": rq("d", 0, override),
	} {
		var ie *InvalidError
		if err := Validate(r, Limits{}); !errors.As(err, &ie) || ie.Reason == "" {
			t.Errorf("%s: err = %v, want an *InvalidError with a reason", name, err)
		}
	}
	if err := Validate(rq("d", 0, dsc("user", "x"), hits(dsc("t", "y"), math.MaxInt64)), Limits{}); err != nil {
		t.Fatalf("valid request: %v", err)
	}
	// A long value (a principal with a huge identity) is counted under its
	// digest, never refused: a refusal makes Envoy fail open.
	if err := Validate(rq("d", 0, dsc("user", strings.Repeat("v", 1<<20))), Limits{}); err != nil {
		t.Fatalf("a 1 MiB value: %v, want it accepted", err)
	}
	if err := Validate(rq("d", 0, dsc("user", "x"), dsc("user", "y")), Limits{MaxDescriptors: 1}); err == nil {
		t.Fatal("MaxDescriptors ignored")
	}
}

// FuzzDecide: any request Validate accepts is planned and answered without
// a panic, one status per descriptor, and a limited item never reports more
// remaining than its limit; a rejected one is an *InvalidError.
func FuzzDecide(f *testing.F) {
	seed := func(r *rlpb.RateLimitRequest) {
		b, _ := proto.Marshal(r)
		f.Add(b, uint64(3))
	}
	seed(rq("diff", 0, dsc("user", "a")))
	seed(rq("diff", 3, hits(dsc("tokens", "t"), 0), dsc("tier", "gold"), dsc("who", "w")))
	seed(rq("diff", 0, dsc("files", "fx"), dsc("nested", "n1", "leaf", "x"), dsc("kill", "k")))
	cfg, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(diffConfig)}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, total uint64) {
		var r rlpb.RateLimitRequest
		if err := proto.Unmarshal(data, &r); err != nil {
			return
		}
		if err := Validate(&r, Limits{}); err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("rejection is not an *InvalidError: %v", err)
			}
			return
		}
		var sc Scratch
		items := Planner{Keys: key.Encoder{Format: key.Envoy}}.Plan(cfg, &r, noon, &sc)
		for i := range items {
			if items[i].Limit != nil {
				items[i].Total = total
			}
		}
		resp, _, err := Answer(items, nil, noon.Unix(), Policy{})
		if err != nil || len(resp.Statuses) != len(r.Descriptors) {
			t.Fatalf("answer %v, %v for %d descriptors", resp, err, len(r.Descriptors))
		}
		for i, st := range resp.Statuses {
			if l := items[i].Limit; l != nil && st.LimitRemaining > l.RequestsPerUnit {
				t.Fatalf("status %d: remaining %d above the limit %d", i, st.LimitRemaining, l.RequestsPerUnit)
			}
		}
	})
}
