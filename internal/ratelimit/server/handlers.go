package server

import (
	"context"
	"errors"
	"sync"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/unarygrpc"
)

// Full gRPC method names served on the gRPC port.
const (
	methodShouldRateLimit = rlpb.RateLimitService_ShouldRateLimit_FullMethodName
	methodHealthCheck     = healthpb.Health_Check_FullMethodName
	methodHealthWatch     = healthpb.Health_Watch_FullMethodName
)

// serveShouldRateLimit is the wire handler of ShouldRateLimit: our decoder
// (a malformed request, for example invalid UTF-8, which proto3 rejects, is
// answered with InvalidArgument) and our encoder (no reflection).
func (s *Server) serveShouldRateLimit(ctx context.Context, req, dst []byte) ([]byte, error) {
	r, err := s.decodeRequest(req)
	if err != nil {
		return nil, err
	}
	resp, err := s.d.ShouldRateLimit(ctx, r)
	if err != nil {
		return nil, Status(err)
	}
	return marshalResponse(dst, resp)
}

// decodeRequest decodes a ShouldRateLimit request; its error is the call's
// status.
func (s *Server) decodeRequest(req []byte) (*rlpb.RateLimitRequest, error) {
	r, err := newBoundedRequest(req, s.shape)
	if err != nil {
		var ie *decide.InvalidError
		if errors.As(err, &ie) {
			return nil, Status(err) // past the engine's bounds
		}
		return nil, status.Errorf(codes.InvalidArgument, "malformed RateLimitRequest: %v", err)
	}
	return r, nil
}

// asyncDecider is a Decider that answers without a waiting goroutine
// (engine.Engine): the lean transport starts its calls on the connection's
// read loop and answers them from the goroutine that ends their store call.
type asyncDecider interface {
	Decide(ctx context.Context, req *rlpb.RateLimitRequest, r decide.Replier)
}

// startShouldRateLimit is serveShouldRateLimit for the lean transport with
// an asyncDecider: it decodes the request and starts its decision, whose
// reply encodes and writes the answer.
func (s *Server) startShouldRateLimit(a asyncDecider) unarygrpc.AsyncHandler {
	return func(ctx context.Context, req []byte, reply unarygrpc.Reply) {
		r, err := s.decodeRequest(req)
		if err != nil {
			reply.Respond(nil, err)
			return
		}
		lr := leanReplies.Get().(*leanReply)
		lr.r = reply
		a.Decide(ctx, r, lr)
	}
}

// leanReply is a decision's decide.Replier on the lean transport.
type leanReply struct{ r unarygrpc.Reply }

var leanReplies = sync.Pool{New: func() any { return new(leanReply) }}

func (l *leanReply) Reply(resp *rlpb.RateLimitResponse, err error) {
	r := l.r
	l.r = nil
	leanReplies.Put(l)
	if err != nil {
		r.Respond(nil, Status(err))
		return
	}
	out, err := marshalResponse(r.Buffer(), resp)
	r.Respond(out, err)
}

// marshalResponse appends r's wire form to dst: appendResponse for the
// shapes the engine produces, proto.Marshal for anything else.
func marshalResponse(dst []byte, r *rlpb.RateLimitResponse) ([]byte, error) {
	if b, ok := appendResponse(dst, r); ok {
		return b, nil
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, r)
}

// serveHealthCheck is grpc.health.v1.Health/Check as grpc-go's health
// server answers it: SERVING or NOT_SERVING for "" and "ratelimit",
// NotFound for any other service name.
func (h *Health) serveHealthCheck(_ context.Context, req, dst []byte) ([]byte, error) {
	var in healthpb.HealthCheckRequest
	if err := proto.Unmarshal(req, &in); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed HealthCheckRequest: %v", err)
	}
	if in.Service != "" && in.Service != HealthServiceName {
		return nil, status.Error(codes.NotFound, "unknown service")
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.Healthy() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, &healthpb.HealthCheckResponse{Status: st})
}

// serveHealthWatch is grpc.health.v1.Health/Watch as grpc-go's health server
// answers it: the current status at once, then every change, until the
// client cancels (or the service shuts down, after NOT_SERVING is sent). An
// unknown service name gets SERVICE_UNKNOWN and no further message.
func (h *Health) serveHealthWatch(ctx context.Context, req []byte, send func([]byte) error) error {
	var in healthpb.HealthCheckRequest
	if err := proto.Unmarshal(req, &in); err != nil {
		return status.Errorf(codes.InvalidArgument, "malformed HealthCheckRequest: %v", err)
	}
	sendStatus := func(st healthpb.HealthCheckResponse_ServingStatus) error {
		b, err := proto.Marshal(&healthpb.HealthCheckResponse{Status: st})
		if err != nil {
			return err
		}
		return send(b)
	}
	if in.Service != "" && in.Service != HealthServiceName {
		if err := sendStatus(healthpb.HealthCheckResponse_SERVICE_UNKNOWN); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-h.done:
			return nil
		}
	}
	sent := false
	var last bool
	for {
		ok, changed := h.watch()
		if !sent || ok != last {
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if ok {
				st = healthpb.HealthCheckResponse_SERVING
			}
			if err := sendStatus(st); err != nil {
				return err
			}
			sent, last = true, ok
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-changed:
		case <-h.done:
			if ok, _ := h.watch(); ok != last {
				continue // send the last change first
			}
			return nil
		}
	}
}
