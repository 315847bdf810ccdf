package unarygrpc

import (
	"errors"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Answer header blocks are encoded once, with HPACK static-table references
// and literals that are never indexed: they do not depend on the dynamic
// table, so one encoding serves every connection and every answer, and the
// client's table is left alone.
var (
	// okHeaders: ":status: 200", "content-type: application/grpc",
	// "grpc-accept-encoding: gzip" (the encodings a client may compress
	// requests with).
	okHeaders = appendLiteral(appendLiteralIndexedName(appendIndexed(nil, staticStatus200), staticContentType, "application/grpc"),
		"grpc-accept-encoding", gzipEncoding)
	// gzipHeaders: okHeaders and "grpc-encoding: gzip", for an answer to a
	// client that compresses.
	gzipHeaders = appendLiteral(append([]byte(nil), okHeaders...), "grpc-encoding", gzipEncoding)
	// okTrailers: "grpc-status: 0".
	okTrailers = appendLiteral(nil, "grpc-status", "0")
)

// HPACK static table indices (RFC 7541 appendix A).
const (
	staticStatus200   = 8
	staticStatus      = 8 // name ":status"
	staticContentType = 31
)

// maxMessageLen bounds grpc-message so a trailers block stays small.
const maxMessageLen = 1024

// statusError is a gRPC status made by this package.
type statusError struct {
	code codes.Code
	msg  string
}

func (e statusError) Error() string { return e.code.String() + ": " + e.msg }

// statusTrailers appends a trailers-only block for err: HTTP status,
// content-type, grpc-status and grpc-message.
func statusTrailers(dst []byte, httpStatus int, err error) []byte {
	code, msg := statusOf(err)
	if httpStatus == 200 {
		dst = appendIndexed(dst, staticStatus200)
	} else {
		dst = appendLiteralIndexedName(dst, staticStatus, strconv.Itoa(httpStatus))
	}
	dst = appendLiteralIndexedName(dst, staticContentType, "application/grpc")
	dst = appendLiteral(dst, "grpc-accept-encoding", gzipEncoding)
	return appendStatus(dst, code, msg)
}

// statusOnlyTrailers appends the trailers that end a call whose headers were
// sent: grpc-status and grpc-message (nil err: OK).
func statusOnlyTrailers(dst []byte, err error) []byte {
	if err == nil {
		return append(dst, okTrailers...)
	}
	code, msg := statusOf(err)
	return appendStatus(dst, code, msg)
}

func appendStatus(dst []byte, code codes.Code, msg string) []byte {
	dst = appendLiteral(dst, "grpc-status", strconv.Itoa(int(code)))
	if msg != "" {
		if len(msg) > maxMessageLen {
			msg = msg[:maxMessageLen]
		}
		dst = appendLiteral(dst, "grpc-message", percentEncode(msg))
	}
	return dst
}

// statusOf gives err's gRPC code and message: a statusError or a
// google.golang.org/grpc/status error keeps them, anything else is Unknown.
func statusOf(err error) (codes.Code, string) {
	var se statusError
	if errors.As(err, &se) {
		return se.code, se.msg
	}
	if st, ok := status.FromError(err); ok {
		return st.Code(), st.Message()
	}
	return codes.Unknown, err.Error()
}

// percentEncode encodes grpc-message as the gRPC HTTP/2 spec asks: bytes
// outside printable ASCII, and '%', as %XX.
func percentEncode(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+16)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

// appendIndexed appends an indexed header field (RFC 7541 6.1).
func appendIndexed(dst []byte, i uint64) []byte { return appendInt(dst, 7, 0x80, i) }

// appendLiteralIndexedName appends a literal without indexing (6.2.2) whose
// name is static-table entry i.
func appendLiteralIndexedName(dst []byte, i uint64, value string) []byte {
	return appendString(appendInt(dst, 4, 0x00, i), value)
}

// appendLiteral appends a literal without indexing with a new name (6.2.2).
func appendLiteral(dst []byte, name, value string) []byte {
	return appendString(appendString(append(dst, 0x00), name), value)
}

// appendString appends a string literal, not Huffman-coded (5.2).
func appendString(dst []byte, s string) []byte {
	return append(appendInt(dst, 7, 0x00, uint64(len(s))), s...)
}

// appendInt appends an integer with an n-bit prefix (5.1); first holds the
// bits above the prefix.
func appendInt(dst []byte, n uint, first byte, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(dst, first|byte(v))
	}
	dst = append(dst, first|byte(limit))
	v -= limit
	for v >= 128 {
		dst = append(dst, byte(v&0x7f)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}

// parseTimeout parses grpc-timeout: at most 8 digits and a unit.
func parseTimeout(s string) (int64, error) {
	if len(s) < 2 || len(s) > 9 {
		return 0, errors.New("want 1-8 digits and a unit (H, M, S, m, u, n)")
	}
	v, err := strconv.ParseInt(s[:len(s)-1], 10, 64)
	if err != nil || v < 0 {
		return 0, errors.New("want 1-8 digits and a unit (H, M, S, m, u, n)")
	}
	switch s[len(s)-1] {
	case 'H', 'M', 'S', 'm', 'u', 'n':
		return v, nil
	}
	return 0, errors.New("unknown unit " + strconv.Quote(s[len(s)-1:]))
}
