package server

import (
	"errors"
	"fmt"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
)

// decodeRequest is a hand-written decoder for RateLimitRequest, about three
// times cheaper than reflection-driven proto.Unmarshal on the hot path. It
// accepts exactly what proto.Unmarshal accepts for the fields the service
// reads (FuzzDecodeMatchesProto checks that): strings must be UTF-8, unknown
// fields are skipped, a field with an unexpected wire type is skipped as
// unknown, the last occurrence of a scalar wins and messages merge.
//
// Allocation is most of a decode's cost, so the messages of a typical
// request come from one arena and its strings are substrings of one copy of
// the wire bytes: two allocations instead of one per message and string
// (BenchmarkDecode). Nothing is reused between requests, so a message or
// string the engine keeps stays valid; a kept string keeps the request's
// bytes alive with it, at most maxSharedText of them.
func decodeRequest(b []byte, r *rlpb.RateLimitRequest) error {
	d := decoder{wire: b}
	return d.request(b, r)
}

// newRequest decodes b into a request that lives in its own arena.
func newRequest(b []byte) (*rlpb.RateLimitRequest, error) {
	return newBoundedRequest(b, shape{})
}

// shape bounds what the decoder builds: at most descriptors descriptors
// and entries entries in each (0: no bound).
type shape struct{ descriptors, entries int }

// newBoundedRequest is newRequest that stops, with a *decide.InvalidError,
// at the first descriptor or entry past lim, which decide.Validate would
// refuse anyway. An empty descriptor or entry is 2 bytes on the wire and
// about 100 bytes decoded: a 4 MiB message of them made 2 million
// descriptors (290 MB) before Validate counted them.
func newBoundedRequest(b []byte, lim shape) (*rlpb.RateLimitRequest, error) {
	d := decoder{wire: b, a: &arena{}, lim: lim}
	return &d.a.req, d.request(b, &d.a.req)
}

// maxSharedText bounds the requests whose strings share one copy of their
// bytes: a string the engine keeps (a ledger key, a principal awaiting a
// flush, a metric label) keeps that copy alive, so a larger request, whose
// size is the client's choice up to the message limit, copies each string
// on its own as before.
const maxSharedText = 1024

// arena holds the messages of a request of up to arenaDescriptors
// descriptors and arenaEntries entries in one allocation; a larger request
// takes the rest from the heap one by one.
const (
	arenaDescriptors = 2
	arenaEntries     = 4
)

type arena struct {
	req   rlpb.RateLimitRequest // newRequest's
	descs [arenaDescriptors]rlcommon.RateLimitDescriptor
	dptrs [arenaDescriptors]*rlcommon.RateLimitDescriptor
	ents  [arenaEntries]rlcommon.RateLimitDescriptor_Entry
	eptrs [arenaEntries]*rlcommon.RateLimitDescriptor_Entry
	hits  [arenaDescriptors]wrapperspb.UInt64Value // the descriptors' hits_addend
	nd    int                                      // descs used (dptrs is the request's Descriptors' backing array)
	ne    int                                      // ents used
	np    int                                      // eptrs used (each descriptor's Entries take a run of it)
	nh    int                                      // hits used
}

// decoder decodes one request: wire is the whole message, text its string
// copy (made at the first string field), a its arena (at the first
// descriptor).
type decoder struct {
	wire []byte
	text string
	a    *arena
	lim  shape
}

// str is v (a subslice of d.wire) as a substring of the request's text. A
// subslice's offset is the difference of capacities: every slice the
// decoder takes is wire[i:] or a prefix of one.
func (d *decoder) str(v []byte) string {
	if len(v) == 0 {
		return ""
	}
	if len(d.wire) > maxSharedText {
		return string(v)
	}
	if d.text == "" {
		d.text = string(d.wire)
	}
	off := cap(d.wire) - cap(v)
	return d.text[off : off+len(v)]
}

func (d *decoder) arena() *arena {
	if d.a == nil {
		d.a = &arena{}
	}
	return d.a
}

func (d *decoder) newDescriptor(r *rlpb.RateLimitRequest) *rlcommon.RateLimitDescriptor {
	a := d.arena()
	if r.Descriptors == nil {
		r.Descriptors = a.dptrs[:0:arenaDescriptors]
	}
	return next(a.descs[:], &a.nd)
}

// next hands out slots in order (used counts them), then heap values.
func next[T any](slots []T, used *int) *T {
	if *used < len(slots) {
		*used++
		return &slots[*used-1]
	}
	return new(T)
}

func (d *decoder) request(b []byte, r *rlpb.RateLimitRequest) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return tagError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if !utf8.Valid(v) {
				return errInvalidUTF8("domain")
			}
			r.Domain = d.str(v)
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if d.lim.descriptors > 0 && len(r.Descriptors) >= d.lim.descriptors {
				return &decide.InvalidError{Reason: fmt.Sprintf("more than %d descriptors, the limit", d.lim.descriptors)}
			}
			desc := d.newDescriptor(r)
			if err := d.descriptor(v, desc); err != nil {
				return err
			}
			r.Descriptors = append(r.Descriptors, desc)
			b = b[n:]
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			r.HitsAddend = uint32(v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

func errInvalidUTF8(field string) error {
	return fmt.Errorf("string field %s contains invalid UTF-8", field)
}

var errFieldNumber = errors.New("invalid field number")

// codeFieldNumber is outside protowire's negative error codes.
const codeFieldNumber = -1000

// consumeTag is protowire.ConsumeTag plus the upper bound proto.Unmarshal
// enforces.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, codeFieldNumber
	}
	return num, typ, n
}

func (d *decoder) descriptor(b []byte, desc *rlcommon.RateLimitDescriptor) error {
	// The descriptor's entries take the arena's next free pointers; appends
	// past them move to the heap, as any append does.
	a := d.arena()
	desc.Entries = a.eptrs[a.np:a.np:arenaEntries]
	defer func() {
		a.np = min(a.np+len(desc.Entries), arenaEntries)
		if len(desc.Entries) == 0 {
			desc.Entries = nil // as proto.Unmarshal leaves it
		} else {
			desc.Entries = desc.Entries[:len(desc.Entries):len(desc.Entries)]
		}
	}()
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return tagError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if d.lim.entries > 0 && len(desc.Entries) >= d.lim.entries {
				return &decide.InvalidError{Reason: fmt.Sprintf("a descriptor has more than %d entries, the limit", d.lim.entries)}
			}
			e := next(a.ents[:], &a.ne)
			if err := d.entry(v, e); err != nil {
				return err
			}
			desc.Entries = append(desc.Entries, e)
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if desc.Limit == nil {
				desc.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{}
			}
			if err := decodeOverride(v, desc.Limit); err != nil {
				return err
			}
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if desc.HitsAddend == nil {
				desc.HitsAddend = next(a.hits[:], &a.nh)
			}
			if err := decodeUInt64Value(v, desc.HitsAddend); err != nil {
				return err
			}
			b = b[n:]
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			desc.IsNegativeHits = v != 0
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

func (d *decoder) entry(b []byte, e *rlcommon.RateLimitDescriptor_Entry) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return tagError(n)
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if !utf8.Valid(v) {
				return errInvalidUTF8("entry key or value")
			}
			if num == 1 {
				e.Key = d.str(v)
			} else {
				e.Value = d.str(v)
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

func decodeOverride(b []byte, o *rlcommon.RateLimitDescriptor_RateLimitOverride) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return tagError(n)
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if num == 1 {
				o.RequestsPerUnit = uint32(v)
			} else {
				o.Unit = typev3.RateLimitUnit(int32(v))
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

func decodeUInt64Value(b []byte, w *wrapperspb.UInt64Value) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return tagError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			w.Value = v
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

func tagError(n int) error {
	if n == codeFieldNumber {
		return errFieldNumber
	}
	return protowire.ParseError(n)
}
