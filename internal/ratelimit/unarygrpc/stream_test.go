package unarygrpc

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var streamDesc = &grpc.StreamDesc{ServerStreams: true}

func TestServerStreaming(t *testing.T) {
	ended := make(chan error, 1)
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	ts.s.HandleServerStream("/t.S/Count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		// req[0] messages of 10 KiB, each filled with its index; then an
		// error if req[1] is set.
		for i := 0; i < int(req[0]); i++ {
			if err := send(bytes.Repeat([]byte{byte(i)}, 10<<10)); err != nil {
				return err
			}
		}
		if req[1] == 1 {
			return status.Error(codes.FailedPrecondition, "stopped on purpose")
		}
		return nil
	})
	ts.s.HandleServerStream("/t.S/Forever", func(ctx context.Context, req []byte, send func([]byte) error) error {
		if err := send([]byte("first")); err != nil {
			return err
		}
		<-ctx.Done()
		ended <- ctx.Err()
		return ctx.Err()
	})
	// A 64 KiB window: 50 x 10 KiB must wait for WINDOW_UPDATEs.
	cc := dial(t, ts.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recvAll := func(req []byte) (int, error) {
		cs, err := cc.NewStream(ctx, streamDesc, "/t.S/Count", grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return 0, err
		}
		if err := cs.SendMsg(&req); err != nil {
			return 0, err
		}
		if err := cs.CloseSend(); err != nil {
			return 0, err
		}
		n := 0
		for {
			var out []byte
			if err := cs.RecvMsg(&out); err != nil {
				if err == io.EOF {
					return n, nil
				}
				return n, err
			}
			if len(out) != 10<<10 || out[0] != byte(n) || out[len(out)-1] != byte(n) {
				t.Fatalf("message %d: %d bytes, first %d", n, len(out), out[0])
			}
			n++
		}
	}
	if n, err := recvAll([]byte{50, 0}); n != 50 || err != nil {
		t.Fatalf("50 messages: got %d, %v", n, err)
	}
	if n, err := recvAll([]byte{3, 1}); n != 3 || status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "stopped on purpose" {
		t.Fatalf("error after 3 messages: got %d, %v", n, err)
	}
	if n, err := recvAll([]byte{0, 1}); n != 0 || status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("trailers-only error: got %d, %v", n, err)
	}
	// Cancel ends the handler and frees the stream; unary calls go on.
	sctx, scancel := context.WithCancel(ctx)
	cs, err := cc.NewStream(sctx, streamDesc, "/t.S/Forever", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	req := []byte("x")
	_ = cs.SendMsg(&req)
	_ = cs.CloseSend()
	var first []byte
	if err := cs.RecvMsg(&first); err != nil || string(first) != "first" {
		t.Fatalf("first message %q, %v", first, err)
	}
	scancel()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("handler context not canceled")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler did not end after the client canceled")
	}
	if out, err := call(ctx, cc, "/t.S/Echo", []byte("ab")); err != nil || string(out) != "ba" {
		t.Fatalf("unary after streams: %q, %v", out, err)
	}
	if _, err := call(ctx, cc, "/t.S/Nope", []byte("x")); status.Convert(err).Message() != "unknown method Nope for service t.S" {
		t.Fatalf("unknown method: %v", err)
	}
}
