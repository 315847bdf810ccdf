package charge

import (
	"math"
	"strings"
	"testing"
	"time"
)

// Pending charges on a cached over-limit key saturate at the store's signed
// 64-bit range instead of wrapping to a small number.
func TestOverCachePendingSaturates(t *testing.T) {
	c := newOverCache(16)
	k := []byte("k")
	end := time.Now().Add(time.Hour)
	if !c.put(k, 10, 0, end.Unix(), end) {
		t.Fatal("put refused")
	}
	for i := 0; i < 3; i++ {
		if !c.hit(k, 5, 0, math.MaxInt64-1, 0, 0) {
			t.Fatal("cached key not hit")
		}
	}
	out := c.drain(0, nil)
	if len(out) != 1 || out[0].Hits != math.MaxInt64 {
		t.Fatalf("drained %+v, want one counter with Hits = MaxInt64", out)
	}
}

func TestOverLimitCacheBounded(t *testing.T) {
	c := newOverCache(64)
	now := int64(1000)
	for i := 0; i < 10000; i++ {
		c.put([]byte(strings.Repeat("k", i%50)+string(rune(i))), 5, now, now+60, time.Unix(now+60, 0))
	}
	if n := c.len(); n > 64 {
		t.Fatalf("cache holds %d entries, bound is 64", n)
	}
}
