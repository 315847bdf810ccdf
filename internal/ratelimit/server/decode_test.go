package server

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func fullRequest() *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: "default/policy", HitsAddend: 7, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "default/policy/rule/0"}, {Key: "rule-0-match-0", Value: "alice é"}}},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k"}}, HitsAddend: wrapperspb.UInt64(0),
			Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: typev3.RateLimitUnit_YEAR}, IsNegativeHits: true},
		{},
	}}
}

// FuzzDecodeMatchesProto: the hand-written decoder accepts exactly the
// inputs proto.Unmarshal accepts and yields an equal message.
func FuzzDecodeMatchesProto(f *testing.F) {
	b, _ := proto.Marshal(fullRequest())
	f.Add(b)
	f.Add(invalidUTF8Request())
	var dup []byte
	dup = protowire.AppendTag(dup, 3, protowire.VarintType)
	dup = protowire.AppendVarint(dup, 1)
	dup = protowire.AppendTag(dup, 3, protowire.VarintType)
	dup = protowire.AppendVarint(dup, 2)
	dup = protowire.AppendTag(dup, 1, protowire.VarintType) // wrong wire type: unknown
	dup = protowire.AppendVarint(dup, 5)
	dup = protowire.AppendTag(dup, 99, protowire.Fixed64Type)
	dup = protowire.AppendFixed64(dup, 5)
	f.Add(dup)
	f.Add([]byte{0x12, 0x02, 0x1a, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got rlpb.RateLimitRequest
		errWant := proto.Unmarshal(data, &want)
		errGot := decodeRequest(data, &got)
		arena, errArena := newRequest(data)
		if (errWant == nil) != (errGot == nil) || (errWant == nil) != (errArena == nil) {
			t.Fatalf("proto err %v, ours %v, ours in an arena %v", errWant, errGot, errArena)
		}
		if errWant != nil {
			return
		}
		want.ProtoReflect().SetUnknown(nil)
		clearUnknown(&want)
		for _, r := range []*rlpb.RateLimitRequest{&got, arena} {
			if !proto.Equal(&want, r) {
				t.Fatalf("decoded differently:\n proto %v\n ours  %v", &want, r)
			}
			// proto.Equal does not tell nil from empty; a caller may.
			if (want.Descriptors == nil) != (r.Descriptors == nil) {
				t.Fatalf("descriptors nil: proto %v, ours %v", want.Descriptors == nil, r.Descriptors == nil)
			}
			for i, d := range want.Descriptors {
				if (d.Entries == nil) != (r.Descriptors[i].Entries == nil) {
					t.Fatalf("descriptor %d entries nil: proto %v, ours %v", i, d.Entries == nil, r.Descriptors[i].Entries == nil)
				}
			}
		}
	})
}

func clearUnknown(r *rlpb.RateLimitRequest) {
	for _, d := range r.Descriptors {
		d.ProtoReflect().SetUnknown(nil)
		for _, e := range d.Entries {
			e.ProtoReflect().SetUnknown(nil)
		}
		if d.Limit != nil {
			d.Limit.ProtoReflect().SetUnknown(nil)
		}
		if d.HitsAddend != nil {
			d.HitsAddend.ProtoReflect().SetUnknown(nil)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	data, _ := proto.Marshal(fullRequest())
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			var r rlpb.RateLimitRequest
			if err := proto.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			var r rlpb.RateLimitRequest
			if err := decodeRequest(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestAppendResponseMatchesProto(t *testing.T) {
	for _, r := range []*rlpb.RateLimitResponse{
		{},
		{OverallCode: rlpb.RateLimitResponse_OVER_LIMIT},
		{OverallCode: rlpb.RateLimitResponse_OK, Statuses: []*rlpb.RateLimitResponse_DescriptorStatus{
			{Code: rlpb.RateLimitResponse_OK},
			{Code: rlpb.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: 300, Unit: rlpb.RateLimitResponse_RateLimit_WEEK, Name: "per_user"},
				DurationUntilReset: durationpb.New(86399 * time.Second)},
			{Code: rlpb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32},
			{Code: rlpb.RateLimitResponse_OK, CurrentLimit: &rlpb.RateLimitResponse_RateLimit{}, DurationUntilReset: &durationpb.Duration{}, LimitRemaining: 7},
			{DurationUntilReset: &durationpb.Duration{Seconds: -5, Nanos: -3}},
		}},
	} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendResponse(nil, r)
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("appendResponse(%v) = %x (ok %v), proto.Marshal = %x", r, got, ok, want)
		}
	}
	withHeaders := &rlpb.RateLimitResponse{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "a", Value: "b"}}}
	if _, ok := appendResponse(nil, withHeaders); ok {
		t.Fatal("a response with headers must fall back to proto.Marshal")
	}
	b, err := marshalResponse(nil, withHeaders)
	if err != nil {
		t.Fatal(err)
	}
	var back rlpb.RateLimitResponse
	if err := proto.Unmarshal(b, &back); err != nil || !proto.Equal(&back, withHeaders) {
		t.Fatalf("fallback marshal: %v", err)
	}
}

// BenchmarkDecodeEG decodes Envoy Gateway's token budget request shape: two
// descriptors (a budget and the frontier cap) of two entries each.
func BenchmarkDecodeEG(b *testing.B) {
	data, _ := proto.Marshal(egRequest())
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var r rlpb.RateLimitRequest
		if err := decodeRequest(data, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func egRequest() *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: "default/gateway", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "default/budgets/rule/0"}, {Key: "rule-0-match-0", Value: "alice@example.com"}}, HitsAddend: wrapperspb.UInt64(0)},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "default/budgets/rule/1"}, {Key: "rule-1-match-0", Value: "gpt-5"}}, HitsAddend: wrapperspb.UInt64(0)},
	}}
}

// TestNewRequestAllocations: Envoy Gateway's request shape decodes with two
// allocations (the arena and the string copy of the bytes), whatever its
// descriptors hold.
func TestNewRequestAllocations(t *testing.T) {
	data, _ := proto.Marshal(egRequest())
	n := testing.AllocsPerRun(100, func() {
		if _, err := newRequest(data); err != nil {
			t.Fatal(err)
		}
	})
	if n > 2 {
		t.Fatalf("newRequest allocates %.0f times per request, want 2", n)
	}
}

// TestDecodedStringsOutliveTheWireBytes: the transport reuses a request's
// buffer once the call returns; a string the engine keeps must not change
// with it.
func TestDecodedStringsOutliveTheWireBytes(t *testing.T) {
	data, _ := proto.Marshal(egRequest())
	r, err := newRequest(data)
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = 'x'
	}
	if !proto.Equal(r, egRequest()) {
		t.Fatalf("decoded request changed with its wire bytes: %v", r)
	}
}

// TestLargeRequestsCopyTheirStrings: a request past maxSharedText copies
// each string on its own, so a kept string does not keep the whole request.
func TestLargeRequestsCopyTheirStrings(t *testing.T) {
	for _, size := range []int{maxSharedText / 2, 4 * maxSharedText} {
		in := egRequest()
		in.Descriptors = append(in.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "pad", Value: strings.Repeat("x", size)}}})
		data, _ := proto.Marshal(in)
		r, err := newRequest(data)
		if err != nil {
			t.Fatal(err)
		}
		a, b := r.Descriptors[0].Entries[1].Value, r.Descriptors[1].Entries[1].Value
		// Two strings of one copy lie at their offsets in the wire bytes.
		// (Compared as integers: pointer arithmetic across allocations is
		// what -race's checkptr refuses.)
		gap := uintptr(unsafe.Pointer(unsafe.StringData(b))) - uintptr(unsafe.Pointer(unsafe.StringData(a)))
		shared := gap == uintptr(strings.Index(string(data), b)-strings.Index(string(data), a))
		if want := len(data) <= maxSharedText; shared != want {
			t.Fatalf("request of %d bytes: strings share one copy %v, want %v", len(data), shared, want)
		}
	}
}

// TestDecodeBeyondTheArena: a request larger than the arena (more
// descriptors, more entries, a descriptor repeated field by field) decodes
// as proto.Unmarshal does, and no descriptor's entries overlap another's.
func TestDecodeBeyondTheArena(t *testing.T) {
	in := &rlpb.RateLimitRequest{Domain: "d"}
	for i := 0; i < 7; i++ {
		d := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(uint64(i))}
		for j := 0; j <= i%4; j++ {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: fmt.Sprintf("k%d", j), Value: fmt.Sprintf("v%d-%d", i, j)})
		}
		in.Descriptors = append(in.Descriptors, d)
	}
	in.Descriptors = append(in.Descriptors, &rlcommon.RateLimitDescriptor{})
	data, _ := proto.Marshal(in)
	for _, decode := range []func() (*rlpb.RateLimitRequest, error){
		func() (*rlpb.RateLimitRequest, error) { return newRequest(data) },
		func() (*rlpb.RateLimitRequest, error) {
			var r rlpb.RateLimitRequest
			return &r, decodeRequest(data, &r)
		},
	} {
		got, err := decode()
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, in) {
			t.Fatalf("decoded %v, want %v", got, in)
		}
		got.Descriptors[0].Entries = append(got.Descriptors[0].Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "appended"})
		if !proto.Equal(got.Descriptors[1], in.Descriptors[1]) {
			t.Fatalf("an append to descriptor 0's entries changed descriptor 1: %v", got.Descriptors[1])
		}
	}
}
