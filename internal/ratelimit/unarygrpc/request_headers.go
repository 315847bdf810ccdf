package unarygrpc

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerBlock decodes a request's header block (a HEADERS frame and the
// CONTINUATION frames that end it) into requestHeaders. It does what x/net's
// Framer does when its ReadMetaHeaders is set (readMetaFrame and
// checkPseudos in golang.org/x/net/http2/frame.go): the same refusals, in the
// same order, with the same error codes. It exists because that path
// allocates a frame, a closure and its captured variables, and the fields'
// slice per request (8-9 of the 19 allocations a call of the llm mix made,
// a heap profile of a running service); here the state lives as long as the
// connection and a request's fields reuse one slice.
//
// The framer itself still parses frames, enforces their order (a
// CONTINUATION only after a HEADERS without END_HEADERS, on its stream) and
// the padding and priority fields; h2spec (internal/ratelimit/server's
// TestH2Spec) checks the whole.
type headerBlock struct {
	dec     *hpack.Decoder
	maxSize uint32 // SETTINGS_MAX_HEADER_LIST_SIZE as advertised

	h          requestHeaders // the block being read
	open       bool           // a HEADERS frame started h and it has not ended
	remain     uint32         // header list bytes still accepted
	sawRegular bool
	invalid    error // a refused field: the stream's error once the block ends
}

// requestHeaders is what the connection reads of a request's header block:
// the fields are valid until the next block starts.
type requestHeaders struct {
	StreamID    uint32
	endStream   bool
	hasPriority bool
	Priority    http2.PriorityParam
	Fields      []hpack.HeaderField
	// Truncated: the fields passed the header list size limit; the rest
	// were decoded (the HPACK state stays in step) but not kept.
	Truncated bool
}

func newHeaderBlock(maxSize uint32) *headerBlock {
	b := &headerBlock{dec: hpack.NewDecoder(4096, nil), maxSize: maxSize}
	b.dec.SetEmitFunc(b.emit)
	// A string longer than the whole list is refused by the decoder, as
	// x/net's maxHeaderStringLen does (no limit where int cannot hold it).
	if n := int(maxSize); n > 0 {
		b.dec.SetMaxStringLength(n)
	}
	return b
}

func (b *headerBlock) emit(hf hpack.HeaderField) {
	if !httpguts.ValidHeaderFieldValue(hf.Value) {
		// The value is not in the error: it may be a secret.
		b.invalid = fmt.Errorf("invalid header field value for %q", hf.Name)
	}
	if strings.HasPrefix(hf.Name, ":") {
		if b.sawRegular {
			b.invalid = errPseudoAfterRegular
		}
	} else {
		b.sawRegular = true
		if !validWireHeaderFieldName(hf.Name) {
			b.invalid = fmt.Errorf("invalid header field name %q", hf.Name)
		}
	}
	if b.invalid != nil {
		b.dec.SetEmitEnabled(false)
		return
	}
	size := hf.Size()
	if size > b.remain {
		b.dec.SetEmitEnabled(false)
		b.h.Truncated = true
		b.remain = 0
		return
	}
	b.remain -= size
	b.h.Fields = append(b.h.Fields, hf)
}

var errPseudoAfterRegular = errors.New("pseudo header field after regular")

// start begins the block of HEADERS frame f.
func (b *headerBlock) start(f *http2.HeadersFrame) {
	b.h = requestHeaders{StreamID: f.StreamID, endStream: f.StreamEnded(), hasPriority: f.HasPriority(),
		Priority: f.Priority, Fields: b.h.Fields[:0]}
	b.remain, b.sawRegular, b.invalid, b.open = b.maxSize, false, nil, true
	b.dec.SetEmitEnabled(true)
}

// blockError is a header block's refusal: a connection error (code), or, when
// stream is set, a stream error (RST_STREAM with code).
type blockError struct {
	stream bool
	code   http2.ErrCode
	err    error
}

func (e *blockError) Error() string { return e.err.Error() }

// add decodes one fragment; it returns the headers once the block ended (nil
// while it goes on), or the block's refusal. A fragment with no block open
// is ignored: a CONTINUATION after a HEADERS frame the framer refused (a bad
// pad length is a stream error found after the framer already expects a
// CONTINUATION) never started one, and x/net's framer, which merges only
// into a HEADERS frame it parsed, hands such a CONTINUATION on as a frame of
// its own, which the connection ignored.
func (b *headerBlock) add(frag []byte, ended bool) (*requestHeaders, *blockError) {
	if !b.open {
		return nil, nil
	}
	h, err := b.decode(frag, ended)
	if err != nil || ended {
		b.open = false
	}
	return h, err
}

func (b *headerBlock) decode(frag []byte, ended bool) (*requestHeaders, *blockError) {
	// As x/net: a fragment more than twice the bytes still accepted, or any
	// fragment after a refused field, closes the connection rather than
	// being decoded and thrown away. The doubling is done in 64 bits:
	// x/net's framer (v0.58.0 readMetaFrame) doubles in 32 bits, so with a
	// MaxHeaderListSize of 1<<31 or more it wraps and refuses every
	// non-empty block; only an operator can set such a size, and decoding
	// what it allows is the intent, so there the two differ on purpose.
	if int64(len(frag)) > 2*int64(b.remain) {
		return nil, &blockError{code: http2.ErrCodeProtocol, err: errors.New("header list too large")}
	}
	if b.invalid != nil {
		return nil, &blockError{code: http2.ErrCodeProtocol, err: b.invalid}
	}
	if _, err := b.dec.Write(frag); err != nil {
		return nil, &blockError{code: http2.ErrCodeCompression, err: err}
	}
	if !ended {
		return nil, nil
	}
	if err := b.dec.Close(); err != nil {
		return nil, &blockError{code: http2.ErrCodeCompression, err: err}
	}
	if b.invalid != nil {
		return nil, &blockError{stream: true, code: http2.ErrCodeProtocol, err: b.invalid}
	}
	if err := checkPseudos(b.h.PseudoFields()); err != nil {
		return nil, &blockError{stream: true, code: http2.ErrCodeProtocol, err: err}
	}
	return &b.h, nil
}

// checkPseudos is x/net's MetaHeadersFrame.checkPseudos: only known
// pseudo-headers, none twice, not request and response ones mixed.
func checkPseudos(pf []hpack.HeaderField) error {
	var isRequest, isResponse bool
	for i, hf := range pf {
		switch hf.Name {
		case ":method", ":path", ":scheme", ":authority", ":protocol":
			isRequest = true
		case ":status":
			isResponse = true
		default:
			return fmt.Errorf("invalid pseudo-header %q", hf.Name)
		}
		for _, hf2 := range pf[:i] {
			if hf.Name == hf2.Name {
				return fmt.Errorf("duplicate pseudo-header %q", hf.Name)
			}
		}
	}
	if isRequest && isResponse {
		return errors.New("mix of request and response pseudo headers")
	}
	return nil
}

// validWireHeaderFieldName is x/net's: a token (httpguts.IsTokenRune) with
// no upper case letter (RFC 9113 8.2.1).
func validWireHeaderFieldName(v string) bool {
	if len(v) == 0 {
		return false
	}
	for _, r := range v {
		if !httpguts.IsTokenRune(r) {
			return false
		}
		if 'A' <= r && r <= 'Z' {
			return false
		}
	}
	return true
}

func (h *requestHeaders) StreamEnded() bool { return h.endStream }
func (h *requestHeaders) HasPriority() bool { return h.hasPriority }

// PseudoValue returns pseudo-header ":"+name's value, or "".
func (h *requestHeaders) PseudoValue(name string) string {
	for _, hf := range h.Fields {
		if !hf.IsPseudo() {
			return ""
		}
		if hf.Name[1:] == name {
			return hf.Value
		}
	}
	return ""
}

// PseudoFields are the block's pseudo-headers (they come first).
func (h *requestHeaders) PseudoFields() []hpack.HeaderField {
	for i, hf := range h.Fields {
		if !hf.IsPseudo() {
			return h.Fields[:i]
		}
	}
	return h.Fields
}

// RegularFields are the block's other fields.
func (h *requestHeaders) RegularFields() []hpack.HeaderField {
	for i, hf := range h.Fields {
		if !hf.IsPseudo() {
			return h.Fields[i:]
		}
	}
	return nil
}
