package valkeytest

import "testing"

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
