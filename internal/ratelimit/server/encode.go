package server

import (
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// appendResponse encodes the RateLimitResponse fields the engine sets
// (overall_code; statuses with code, current_limit, limit_remaining and
// duration_until_reset) exactly as proto.Marshal does, field numbers in
// order. ok is false when any other field is set; the caller then falls
// back to proto.Marshal. go-control-plane's vtproto marshallers need the
// vtprotobuf build tag, so this keeps the hot path off reflection without it.
func appendResponse(b []byte, r *rlpb.RateLimitResponse) (out []byte, ok bool) {
	if len(r.ResponseHeadersToAdd) > 0 || len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 ||
		r.DynamicMetadata != nil || r.Quota != nil || len(r.ProtoReflect().GetUnknown()) > 0 {
		return nil, false
	}
	if r.OverallCode != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.OverallCode))
	}
	for _, s := range r.Statuses {
		if s == nil || s.Quota != nil || len(s.ProtoReflect().GetUnknown()) > 0 {
			return nil, false
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(s)))
		if s.Code != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(s.Code))
		}
		if l := s.CurrentLimit; l != nil {
			if len(l.ProtoReflect().GetUnknown()) > 0 {
				return nil, false
			}
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(limitSize(l)))
			b = appendLimit(b, l)
		}
		if s.LimitRemaining != 0 {
			b = protowire.AppendTag(b, 3, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(s.LimitRemaining))
		}
		if d := s.DurationUntilReset; d != nil {
			if len(d.ProtoReflect().GetUnknown()) > 0 {
				return nil, false
			}
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(durationSize(d.Seconds, d.Nanos)))
			if d.Seconds != 0 {
				b = protowire.AppendTag(b, 1, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(d.Seconds))
			}
			if d.Nanos != 0 {
				b = protowire.AppendTag(b, 2, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(int64(d.Nanos)))
			}
		}
	}
	return b, true
}

func varintField(v uint64) int { return 1 + protowire.SizeVarint(v) }

func durationSize(sec int64, nanos int32) int {
	n := 0
	if sec != 0 {
		n += varintField(uint64(sec))
	}
	if nanos != 0 {
		n += varintField(uint64(int64(nanos)))
	}
	return n
}

func limitSize(l *rlpb.RateLimitResponse_RateLimit) int {
	n := 0
	if l.RequestsPerUnit != 0 {
		n += varintField(uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		n += varintField(uint64(l.Unit))
	}
	if l.Name != "" {
		n += 1 + protowire.SizeBytes(len(l.Name))
	}
	return n
}

func appendLimit(b []byte, l *rlpb.RateLimitResponse_RateLimit) []byte {
	if l.RequestsPerUnit != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(l.Unit))
	}
	if l.Name != "" {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendString(b, l.Name)
	}
	return b
}

func statusSize(s *rlpb.RateLimitResponse_DescriptorStatus) int {
	n := 0
	if s.Code != 0 {
		n += varintField(uint64(s.Code))
	}
	if l := s.CurrentLimit; l != nil {
		ls := limitSize(l)
		n += 1 + protowire.SizeVarint(uint64(ls)) + ls
	}
	if s.LimitRemaining != 0 {
		n += varintField(uint64(s.LimitRemaining))
	}
	if d := s.DurationUntilReset; d != nil {
		ds := durationSize(d.Seconds, d.Nanos)
		n += 1 + protowire.SizeVarint(uint64(ds)) + ds
	}
	return n
}
