// Package ctxio makes blocking reads give up when a context ends. Opening a
// FIFO without a writer, or reading a pipe or a terminal that never sends
// EOF, blocks in a system call that no signal handler interrupts; a CLI
// that waits there ignores SIGTERM from its CI runner until killed. Here
// the blocking call runs on its own goroutine and the caller returns with
// the context's cause as soon as it ends; the abandoned call finishes or
// dies with the process, which is about to exit.
package ctxio

import (
	"context"
	"io"
	"os"
)

// Reader reads from R until Ctx ends. Each Read reads into a buffer of its
// own, so a Read abandoned on cancellation never writes into the caller's
// slice afterwards.
type Reader struct {
	Ctx context.Context
	R   io.Reader
}

type readResult struct {
	n   int
	err error
}

func (r *Reader) Read(p []byte) (int, error) {
	if err := r.Ctx.Err(); err != nil {
		return 0, context.Cause(r.Ctx)
	}
	buf := make([]byte, len(p))
	done := make(chan readResult, 1)
	go func() {
		n, err := r.R.Read(buf)
		done <- readResult{n, err}
	}()
	select {
	case res := <-done:
		copy(p, buf[:res.n])
		return res.n, res.err
	case <-r.Ctx.Done():
		return 0, context.Cause(r.Ctx)
	}
}

// ReadAll is io.ReadAll of r, ending with the context's cause when ctx ends.
func ReadAll(ctx context.Context, r io.Reader) ([]byte, error) {
	return io.ReadAll(&Reader{Ctx: ctx, R: r})
}

// Open is os.Open, returning the context's cause if ctx ends first (a FIFO
// blocks in open until a writer comes). A file opened after that is closed.
func Open(ctx context.Context, path string) (*os.File, error) {
	type openResult struct {
		f   *os.File
		err error
	}
	done := make(chan openResult, 1)
	go func() {
		f, err := os.Open(path)
		done <- openResult{f, err}
	}()
	select {
	case res := <-done:
		return res.f, res.err
	case <-ctx.Done():
		go func() {
			if res := <-done; res.f != nil {
				_ = res.f.Close() // abandoned read-only open: no one to report to
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// ReadFile is os.ReadFile, ending with the context's cause when ctx ends
// (while opening or reading).
func ReadFile(ctx context.Context, path string) ([]byte, error) {
	return ReadFileWith(ctx, path, io.ReadAll)
}

// ReadFileWith is ReadFile with read in place of io.ReadAll (a bounded
// read, say), given a reader that ends when ctx does.
func ReadFileWith(ctx context.Context, path string, read func(io.Reader) ([]byte, error)) ([]byte, error) {
	f, err := Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	return read(&Reader{Ctx: ctx, R: f})
}
