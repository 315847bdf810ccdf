package server

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
)

// floods are 4 MiB requests of empty descriptors, and of one descriptor of
// empty entries: 2 wire bytes for each, about 100 bytes each decoded.
func floods() map[string][]byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, "d")
	for len(b) < 4<<20-2 {
		b = append(b, 0x12, 0) // descriptors: field 2, empty
	}
	var inner []byte
	for len(inner) < 4<<20-16 {
		inner = append(inner, 0x0a, 0) // entries: field 1, empty
	}
	e := protowire.AppendTag(nil, 1, protowire.BytesType)
	e = protowire.AppendString(e, "d")
	e = protowire.AppendTag(e, 2, protowire.BytesType)
	e = protowire.AppendBytes(e, inner)
	return map[string][]byte{"descriptors": b, "entries": e}
}

func allocated(f func()) uint64 {
	var a, z runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&z)
	return z.TotalAlloc - a.TotalAlloc
}

// TestDecoderStopsPastTheEngineBounds: a request with more descriptors, or
// entries in a descriptor, than the engine accepts is refused while it is
// decoded, with what it built so far bounded by those limits. Before, the
// decoder built all of them first: 290 MB for 4 MiB of empty descriptors,
// 256 MB for 4 MiB of empty entries, per request in flight.
func TestDecoderStopsPastTheEngineBounds(t *testing.T) {
	lim := shape{descriptors: decide.DefaultMaxDescriptors, entries: decide.DefaultMaxEntries}
	for name, m := range floods() {
		var err error
		n := allocated(func() { _, err = newBoundedRequest(m, lim) })
		var ie *decide.InvalidError
		if !errors.As(err, &ie) {
			t.Errorf("%s: error %v, want an InvalidError", name, err)
		}
		t.Logf("%s: %d bytes in, %d allocated, %v", name, len(m), n, err)
		if n > 1<<20 {
			t.Errorf("%s: %d bytes allocated decoding %d bytes, want at most 1 MiB", name, n, len(m))
		}
	}
	// At the bounds: decoded as proto.Unmarshal decodes it.
	in := &rlpb.RateLimitRequest{Domain: "d"}
	for i := 0; i < lim.descriptors; i++ {
		in.Descriptors = append(in.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}})
	}
	for i := 1; i < lim.entries; i++ {
		in.Descriptors[0].Entries = append(in.Descriptors[0].Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	data, _ := proto.Marshal(in)
	got, err := newBoundedRequest(data, lim)
	if err != nil || !proto.Equal(got, in) {
		t.Fatalf("a request at the bounds: %v", err)
	}
}

// TestShouldRateLimitRefusesFloodsEarly: through the gRPC handler, with the
// engine's bounds, a flood is InvalidArgument naming the bound.
func TestShouldRateLimitRefusesFloodsEarly(t *testing.T) {
	r := start(t, Options{}, nil)
	for name, m := range floods() {
		_, err := r.srv.serveShouldRateLimit(context.Background(), m, nil)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "more than") {
			t.Errorf("%s: %v, want InvalidArgument from the decoder (more than ...)", name, err)
		} else {
			t.Logf("%s: %s", name, st.Message())
		}
	}
}

// TestJSONShapeBoundedBeforeDecode: /json counts a body's JSON objects
// before protojson builds them. Before, a 4 MiB body of empty descriptors
// ("{}," each) made 1.4 million descriptors, 228 MB, per request; the
// engine refused it only then. A request at the bounds is still served.
func TestJSONShapeBoundedBeforeDecode(t *testing.T) {
	r := start(t, Options{}, nil)
	var b strings.Builder
	b.WriteString(`{"domain":"d","descriptors":[{}`)
	for b.Len() < 4<<20-10 {
		b.WriteString(`,{}`)
	}
	b.WriteString(`]}`)
	flood := b.String()
	var code int
	n := allocated(func() {
		resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(flood))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		code = resp.StatusCode
	})
	t.Logf("%d-byte body: %d, %d bytes allocated (client and server)", len(flood), code, n)
	if code != http.StatusBadRequest {
		t.Errorf("flood: %d, want 400", code)
	}
	if n > 64<<20 {
		t.Errorf("%d bytes allocated for a %d-byte body, want at most 64 MiB", n, len(flood))
	}
	// At the bounds: 512 descriptors, one of 256 entries, each with a
	// limit override object: answered, not refused as a flood.
	b.Reset()
	b.WriteString(`{"domain":"d","descriptors":[`)
	for i := 0; i < decide.DefaultMaxDescriptors; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"entries":[{"key":"user","value":"u"}`)
		if i == 0 {
			for j := 1; j < decide.DefaultMaxEntries; j++ {
				b.WriteString(`,{"key":"k","value":"v"}`)
			}
		}
		b.WriteString(`],"limit":{"requests_per_unit":5,"unit":"DAY"}}`)
	}
	b.WriteString(`]}`)
	resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusBadRequest {
		t.Errorf("a request at the bounds: %d", resp.StatusCode)
	}
}
