package service

import (
	"errors"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestApplyMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	noEnv := func(string) string { return "" }
	for name, tc := range map[string]struct {
		ratio    float32
		getenv   func(string) string
		provider memlimit.Provider
		want     int64 // 0: left as it was
		wantErr  bool
	}{
		"a pod with 1 GiB":           {ratio: 0.75, getenv: noEnv, provider: memlimit.Limit(gib), want: 3 * gib / 4},
		"ratio 1":                    {ratio: 1, getenv: noEnv, provider: memlimit.Limit(gib), want: gib},
		"off":                        {ratio: 0, getenv: noEnv, provider: memlimit.Limit(gib)},
		"GOMEMLIMIT wins":            {ratio: 0.9, getenv: func(k string) string { return map[string]string{"GOMEMLIMIT": "2GiB"}[k] }, provider: memlimit.Limit(gib)},
		"no container":               {ratio: 0.9, getenv: noEnv, provider: func() (uint64, error) { return 0, memlimit.ErrNoLimit }},
		"cgroup v1 unlimited":        {ratio: 0.9, getenv: noEnv, provider: memlimit.Limit(math.MaxUint64)},
		"cgroup v1 unlimited (page)": {ratio: 0.9, getenv: noEnv, provider: memlimit.Limit(9223372036854771712)},
		"cgroup unreadable":          {ratio: 0.9, getenv: noEnv, provider: func() (uint64, error) { return 0, errors.New("permission denied") }, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			// The limit is process-wide: start from none and put back
			// whatever the test binary had.
			prev := debug.SetMemoryLimit(math.MaxInt64)
			t.Cleanup(func() { debug.SetMemoryLimit(prev) })
			got, set, err := applyMemoryLimit(tc.ratio, tc.getenv, tc.provider)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			now := debug.SetMemoryLimit(-1)
			if tc.want == 0 {
				if set || now != math.MaxInt64 || got != math.MaxInt64 {
					t.Fatalf("limit changed: set %v, returned %d, runtime %d", set, got, now)
				}
				return
			}
			if !set || got != tc.want || now != tc.want {
				t.Fatalf("set %v, returned %d, runtime %d; want %d", set, got, now, tc.want)
			}
		})
	}
}

// The real cgroup reader on this machine: whatever it finds (a limit, none,
// or an unreadable hierarchy), the service starts and the limit it reports
// is the one in force.
func TestApplyMemoryLimitFromCgroup(t *testing.T) {
	prev := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	got, set, err := applyMemoryLimit(0.9, func(string) string { return "" }, memlimit.FromCgroup)
	t.Logf("cgroup: soft limit %d, set %v, err %v", got, set, err)
	if now := debug.SetMemoryLimit(-1); now != got {
		t.Fatalf("returned %d, runtime has %d", got, now)
	}
}
