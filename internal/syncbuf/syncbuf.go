// Package syncbuf is a byte buffer safe for concurrent writers: tests give
// it to a logger that a server's goroutines write to, and read it back.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer whose Write and String may run concurrently.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns what was written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
