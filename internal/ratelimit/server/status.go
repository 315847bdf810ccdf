package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
)

// Status maps a decision error to its gRPC status: a rejected request is
// InvalidArgument with its reason, no config and a failed store under the
// error failure policy are Unavailable (Envoy then applies its own
// failure_mode_deny), a context error keeps its code; an error that already
// is a status stays as it is. nil stays nil.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ie *decide.InvalidError
	var se *decide.StoreError
	switch {
	case errors.As(err, &ie):
		return status.Error(codes.InvalidArgument, ie.Reason)
	case errors.Is(err, decide.ErrNoConfig):
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, &se):
		return status.Error(codes.Unavailable, se.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unknown, err.Error())
}
