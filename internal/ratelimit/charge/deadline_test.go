package charge

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSharedDeadlines(t *testing.T) {
	var d deadlines
	now := time.Now()
	a := d.after(now, 15*time.Millisecond)
	b := d.after(now, 15*time.Millisecond)
	if a != b {
		t.Fatal("calls in the same millisecond got different contexts")
	}
	dl, ok := a.Deadline()
	if !ok || dl.Before(now.Add(15*time.Millisecond)) || dl.After(now.Add(16*time.Millisecond)) {
		t.Fatalf("deadline %v not within [15ms, 16ms] of now", dl.Sub(now))
	}
	if a.Err() != nil {
		t.Fatal("expired early")
	}
	select {
	case <-a.Done():
	case <-time.After(time.Second):
		t.Fatal("Done not closed after the deadline")
	}
	if !errors.Is(a.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v", a.Err())
	}
	if elapsed := time.Since(now); elapsed < 15*time.Millisecond {
		t.Fatalf("expired after %v, before its deadline", elapsed)
	}
	c := d.after(time.Now(), 15*time.Millisecond)
	if c == a || c.Err() != nil {
		t.Fatal("a later call reused an expired context")
	}
}
