package decide

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
)

// Defaults for Limits.
const (
	// DefaultMaxDescriptors bounds descriptors per request.
	DefaultMaxDescriptors = 512
	// DefaultMaxEntries bounds entries per descriptor.
	DefaultMaxEntries = 256
	// DefaultMaxStringBytes bounds the domain and each entry key (the
	// gateway's configuration). Values are not bounded here: a value longer
	// than key.MaxValueBytes is counted under its digest (refusing it would
	// let its principal through unbudgeted: Envoy and agentgateway fail open
	// on an error); the transport bounds the message.
	DefaultMaxStringBytes = 8192
)

// Limits bound the shape of a request. Zero values mean the defaults.
type Limits struct {
	MaxDescriptors, MaxEntries, MaxStringBytes int
}

// WithDefaults returns l with its zero values replaced by the defaults.
func (l Limits) WithDefaults() Limits { return l.withDefaults() }

func (l Limits) withDefaults() Limits {
	if l.MaxDescriptors <= 0 {
		l.MaxDescriptors = DefaultMaxDescriptors
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxStringBytes <= 0 {
		l.MaxStringBytes = DefaultMaxStringBytes
	}
	return l
}

// InvalidError is a request the service rejects; the transport answers it
// with InvalidArgument (gRPC) or 400 (HTTP). Reason never holds request
// values, only their sizes and positions.
type InvalidError struct {
	Reason string
}

func (e *InvalidError) Error() string { return e.Reason }

// ErrNoConfig means no rate limit configuration is loaded yet; the transport
// answers Unavailable.
var ErrNoConfig = errors.New("no rate limit configuration loaded")

// ErrDenied is wrapped by a store error after which every limited descriptor
// is denied whatever the failure policy: a bounded store refusing a new
// counter (store.ErrFull), where allowing would let every new principal past
// the bound through uncounted.
var ErrDenied = errors.New("denied at the store's bound")

// StoreError is the answer under FailError when the store failed: the
// transport answers Unavailable and Envoy applies its own failure mode.
type StoreError struct {
	Err error
}

func (e *StoreError) Error() string { return "rate limit store: " + e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

func invalid(format string, args ...any) error {
	return &InvalidError{Reason: fmt.Sprintf(format, args...)}
}

// Validate checks a request's shape: what the reference rejects (empty domain,
// no descriptors) and what it would choke on (too many or too large entries,
// invalid UTF-8, out-of-range hits_addend, a limit override without a unit).
// Errors are *InvalidError.
func Validate(req *rlpb.RateLimitRequest, lim Limits) error {
	if req == nil {
		return invalid("nil request")
	}
	lim = lim.withDefaults()
	max := lim.MaxStringBytes
	if req.GetDomain() == "" {
		return invalid("rate limit domain must not be empty")
	}
	if len(req.Domain) > max {
		return invalid("domain is %d bytes, above the %d-byte limit", len(req.Domain), max)
	}
	if !utf8.ValidString(req.Domain) {
		return invalid("domain is not valid UTF-8")
	}
	if len(req.GetDescriptors()) == 0 {
		return invalid("rate limit descriptor list must not be empty")
	}
	if len(req.Descriptors) > lim.MaxDescriptors {
		return invalid("%d descriptors, above the limit of %d", len(req.Descriptors), lim.MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if d == nil {
			return invalid("descriptor %d is null", i)
		}
		if len(d.Entries) > lim.MaxEntries {
			return invalid("descriptor %d has %d entries, above the limit of %d", i, len(d.Entries), lim.MaxEntries)
		}
		for j, en := range d.Entries {
			if en == nil {
				return invalid("descriptor %d entry %d is null", i, j)
			}
			if len(en.Key) > max {
				return invalid("descriptor %d entry %d: key above %d bytes", i, j, max)
			}
			if !utf8.ValidString(en.Key) || !utf8.ValidString(en.Value) {
				return invalid("descriptor %d entry %d: key or value is not valid UTF-8", i, j)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > math.MaxInt64 {
			return invalid("descriptor %d: hits_addend %d above %d", i, h.Value, int64(math.MaxInt64))
		}
		if o := d.GetLimit(); o != nil && config.Divider(config.Unit(o.GetUnit())) == 0 {
			return invalid("descriptor %d: limit override has no valid unit", i)
		}
	}
	return nil
}
