package unarygrpc

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"sync"
)

// gzipEncoding is the one message encoding served besides identity: what
// grpc-go's gzip compressor (and Envoy's, and grpc-js's) speak.
const gzipEncoding = "gzip"

// errDecompressedTooLarge: a compressed message inflates past the bound.
var errDecompressedTooLarge = errors.New("decompressed message too large")

// errHoldRefused: the connection's held bytes have no room for the rest of
// a decompressed message (gunzipHeld's hold said no).
var errHoldRefused = errors.New("decompressed message over the connection's held bytes")

var (
	gzipReaders sync.Pool // *gzip.Reader
	gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(io.Discard) }}
)

// gunzip appends the decompression of src to dst, failing with
// errDecompressedTooLarge as soon as the output would exceed limit bytes:
// the output is bounded, not the input's claim (a small bomb inflates
// 1000-fold), and never more than limit+1 bytes are allocated for it.
func gunzip(dst, src []byte, limit int) ([]byte, error) {
	return gunzipHeld(dst, src, limit, nil)
}

// gunzipHeld is gunzip that asks hold, when not nil, before the output's
// buffer grows by n bytes; hold false ends it with errHoldRefused.
func gunzipHeld(dst, src []byte, limit int, hold func(n int) bool) ([]byte, error) {
	zr, _ := gzipReaders.Get().(*gzip.Reader)
	var err error
	if zr == nil {
		zr, err = gzip.NewReader(bytes.NewReader(src))
	} else {
		err = zr.Reset(bytes.NewReader(src))
	}
	if err != nil {
		return dst, err
	}
	defer gzipReaders.Put(zr)
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			grow := min(max(cap(dst)-start, 512), limit+1-(len(dst)-start))
			if grow <= 0 {
				return dst, errDecompressedTooLarge
			}
			if hold != nil && !hold(grow) {
				return dst, errHoldRefused
			}
			nb := make([]byte, len(dst), len(dst)+grow) // exactly: append rounds up
			copy(nb, dst)
			dst = nb
		}
		n, rerr := zr.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst)-start > limit {
			return dst, errDecompressedTooLarge
		}
		if rerr == io.EOF {
			return dst, nil
		}
		if rerr != nil {
			return dst, rerr
		}
	}
}

// appendGzip appends the gzip compression of src to dst.
func appendGzip(dst, src []byte) ([]byte, error) {
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	buf := bytes.NewBuffer(dst)
	zw.Reset(buf)
	if _, err := zw.Write(src); err != nil {
		return dst, err
	}
	if err := zw.Close(); err != nil {
		return dst, err
	}
	return buf.Bytes(), nil
}
