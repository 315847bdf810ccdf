package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A real server answers its own client on the port Start chose, and is gone
// after the test's cleanup.
func TestStart(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v := s.Psql(ctx, t, "SELECT current_setting('server_version_num')::int >= 120000, current_user"); v != "t|postgres" {
		t.Fatalf("server answered %q, want PostgreSQL 12 or later as postgres", v)
	}
	if !strings.Contains(s.DSN, "127.0.0.1:") {
		t.Fatalf("DSN %q is not on loopback", s.DSN)
	}
	s.stop()
	select {
	case <-s.done:
	default:
		t.Fatal("postgres still running after stop")
	}
}
