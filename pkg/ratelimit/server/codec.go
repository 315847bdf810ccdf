package server

import (
	"context"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// codec is the gRPC server codec. It differs from grpc's proto codec in two
// ways: ShouldRateLimit requests are decoded by our handler so a malformed
// request (for example invalid UTF-8, which proto3 rejects) is answered with
// InvalidArgument rather than grpc's Internal; and responses are marshalled
// without reflection (appendResponse).
type codec struct{}

var _ encoding.Codec = codec{}

func (codec) Name() string { return "proto" }

type vtMarshaler interface {
	MarshalVTStrict() ([]byte, error)
}

func (codec) Marshal(v any) ([]byte, error) {
	if r, ok := v.(*rlpb.RateLimitResponse); ok {
		if b, ok := appendResponse(make([]byte, 0, 64+24*len(r.Statuses)), r); ok {
			return b, nil
		}
	}
	if m, ok := v.(vtMarshaler); ok {
		return m.MarshalVTStrict() // with the vtprotobuf build tag
	}
	return proto.Marshal(v.(proto.Message))
}

// request carries a decoded request or its decoding error to the handler.
type request struct {
	req rlpb.RateLimitRequest
	err error
}

func (codec) Unmarshal(data []byte, v any) error {
	if r, ok := v.(*request); ok {
		r.err = decodeRequest(data, &r.req)
		return nil
	}
	return proto.Unmarshal(data, v.(proto.Message))
}

// serviceDesc is RateLimitService with a handler that decodes into *request.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: rlpb.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*rlpb.RateLimitServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler:    shouldRateLimitHandler,
	}},
	Streams:  []grpc.StreamDesc{},
	Metadata: rlpb.RateLimitService_ServiceDesc.Metadata,
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	r := new(request)
	if err := dec(r); err != nil {
		return nil, err
	}
	if r.err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed RateLimitRequest: %v", r.err)
	}
	s := srv.(rlpb.RateLimitServiceServer)
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, &r.req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlpb.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, &r.req, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlpb.RateLimitRequest))
	})
}
