package ctxio

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestReadFileOfFIFOEndsOnCancel: opening a FIFO without a writer blocks in
// open(2); ReadFile returns the context's cause once it is cancelled.
func TestReadFileOfFIFOEndsOnCancel(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "in.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("sigterm")
	done := make(chan error, 1)
	go func() { _, err := ReadFile(ctx, fifo); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("ReadFile returned before cancel: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel(stop)
	if err := <-done; !errors.Is(err, stop) {
		t.Fatalf("err = %v, want the cause", err)
	}
	// Unblock the abandoned open so the goroutine ends.
	if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
		w.Close()
	}
}

// TestReaderReadsAndStops: data arrives unchanged; once cancelled, a Read
// blocked on a pipe returns and later data never lands in the caller's buffer.
func TestReaderReadsAndStops(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cr := &Reader{Ctx: ctx, R: r}
	if _, err := w.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if n, err := cr.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	clear(buf)
	go func() { time.Sleep(50 * time.Millisecond); cancel() }() // stays: cancel while the Read below blocks
	if n, err := cr.Read(buf); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Read after cancel = %d, %v", n, err)
	}
	if _, err := w.WriteString("late"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // stays: time for a late write to land in buf, which it must not
	for _, b := range buf {
		if b != 0 {
			t.Fatalf("abandoned read wrote into the caller's buffer: %q", buf)
		}
	}
}
