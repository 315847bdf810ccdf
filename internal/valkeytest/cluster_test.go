package valkeytest

import (
	"strings"
	"testing"
)

func TestStartCluster(t *testing.T) {
	c := StartCluster(t, 3)
	seen := map[string]bool{}
	for _, slot := range []int{0, 8000, 16383} {
		owner, err := SlotOwner(c.Addrs[0], slot)
		if err != nil {
			t.Fatal(err)
		}
		seen[owner] = true
	}
	if len(seen) != 3 {
		t.Fatalf("slots 0, 8000, 16383 owned by %v, want 3 different nodes", seen)
	}
}

func TestStartSentinel(t *testing.T) {
	s := StartSentinel(t)
	addr, err := s.MasterAddr()
	if err != nil || addr != s.Primary.Addr {
		t.Fatalf("MasterAddr = %s, %v; want %s", addr, err, s.Primary.Addr)
	}
	if out, err := s.Replica.Do("INFO", "replication"); err != nil || !strings.Contains(out, "role:slave") {
		t.Fatalf("replica role: %v %s", err, out)
	}
}
