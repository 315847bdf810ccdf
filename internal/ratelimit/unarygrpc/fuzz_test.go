package unarygrpc

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// seedFrames is a valid exchange: SETTINGS, a call to Echo, a PING, a call
// to an unknown method, and a reset stream.
func seedFrames() []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	hdr := func(path string) []byte {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {"content-type", "application/grpc"}, {"grpc-timeout", "20m"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		return hb.Bytes()
	}
	msg := func(m string) []byte {
		p := make([]byte, 5, 5+len(m))
		binary.BigEndian.PutUint32(p[1:], uint32(len(m)))
		return append(p, m...)
	}
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr("/t.S/Echo"), EndHeaders: true})
	_ = fr.WriteData(1, true, msg("hello"))
	_ = fr.WritePing(false, [8]byte{9})
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: hdr("/t.S/None"), EndHeaders: true, EndStream: true})
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: hdr("/t.S/Echo"), EndHeaders: true})
	_ = fr.WriteRSTStream(5, http2.ErrCodeCancel)
	_ = fr.WriteWindowUpdate(0, 1000)
	_ = fr.WriteWindowUpdate(1, 1000)
	_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	return b.Bytes()
}

// FuzzConn feeds arbitrary bytes after the client preface: the connection
// must end by itself (the input ends with EOF), without a panic, and every
// handler must return.
func FuzzConn(f *testing.F) {
	valid := seedFrames()
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	f.Add(bytes.Repeat([]byte{0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, 50))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	s := New(Options{MaxRecvMsgSize: 64, MaxConcurrentStreams: 4, Workers: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	s.Handle("/t.S/Echo", echo)
	f.Fuzz(func(t *testing.T, data []byte) {
		client, server := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		c := s.newConn(server)
		s.connWG.Add(1)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go func() {
			_, _ = client.Write([]byte(clientPreface))
			_, _ = client.Write(data)
			// EOF: the read loop must end whatever state it is in.
			_ = client.Close()
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("connection did not end within 5 s of EOF")
		}
	})
}
