package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
)

// TestStatusMapsDecisionErrors: the decision's typed errors become the gRPC
// codes Envoy acts on; a status passes through; nil stays nil.
func TestStatusMapsDecisionErrors(t *testing.T) {
	already := status.Error(codes.ResourceExhausted, "too big")
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{&decide.InvalidError{Reason: "descriptor 3 is null"}, codes.InvalidArgument, "descriptor 3 is null"},
		{fmt.Errorf("wrapped: %w", &decide.InvalidError{Reason: "r"}), codes.InvalidArgument, "r"},
		{decide.ErrNoConfig, codes.Unavailable, "no rate limit configuration loaded"},
		{&decide.StoreError{Err: store.ErrUnavailable}, codes.Unavailable, "rate limit store: store unavailable"},
		{context.DeadlineExceeded, codes.DeadlineExceeded, ""},
		{already, codes.ResourceExhausted, "too big"},
		{errors.New("boom"), codes.Unknown, "boom"},
	} {
		st := status.Convert(Status(tc.err))
		if st.Code() != tc.code || (tc.msg != "" && st.Message() != tc.msg) {
			t.Errorf("Status(%v) = %s %q, want %s %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
	if Status(nil) != nil {
		t.Error("Status(nil) is not nil")
	}
}
