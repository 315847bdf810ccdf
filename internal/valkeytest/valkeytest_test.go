package valkeytest

import (
	"net"
	"testing"
)

func TestStartKillRestart(t *testing.T) {
	s := Start(t, Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	if out, err := s.Do("INCRBY", "k", "5"); err != nil || out != "5" {
		t.Fatalf("INCRBY = %q, %v", out, err)
	}
	s.Kill()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("server still answers after Kill")
	}
	s.Restart()
	if out, err := s.Do("GET", "k"); err != nil || out != "5" {
		t.Fatalf("after restart with AOF GET = %q, %v; want 5", out, err)
	}
}

// TestStartRetriesTakenPort hands Start a port that another listener holds
// (the race between FreePort and valkey-server's bind, made certain) and
// checks that it starts on another port instead of failing.
func TestStartRetriesTakenPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	picks := 0
	s := startWith(t, Options{}, func(t testing.TB, cluster bool) int {
		picks++
		if picks == 1 {
			return taken
		}
		return freeServerPort(t, cluster)
	})
	if picks != 2 || s.Port == taken {
		t.Fatalf("picks = %d, port = %d (taken %d); want a second pick on another port", picks, s.Port, taken)
	}
	if out, err := s.Do("PING"); err != nil || out != "PONG" {
		t.Fatalf("PING = %q, %v", out, err)
	}
}
