package valkey

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// New connects to Valkey and returns a store. It fails if the first
// connection cannot be made, unless ConnectInBackground is set (the error
// never contains the password).
func New(opts Options) (*Store, error) {
	co, err := clientOption(&opts)
	if err != nil {
		return nil, err
	}
	first := co
	if opts.ConnectInBackground {
		// A black-holed address must not hold the start for DialTimeout.
		first.Dialer.Timeout = min(first.Dialer.Timeout, time.Second)
	}
	c, err := valkey.NewClient(first)
	if err == nil {
		return NewWithClient(c, opts)
	}
	cerr := fmt.Errorf("connect to valkey %s (%s): %w: %s", strings.Join(opts.Addresses, ","), opts.Mode, store.ErrUnavailable, redact(err.Error(), opts))
	if !opts.ConnectInBackground || !unreachable(err) {
		// A refused password or certificate is a setting to fix, not an
		// outage to wait out.
		return nil, cerr
	}
	s, err := newStore(opts)
	if err != nil {
		return nil, err
	}
	s.log.Warn("valkey store: valkey unreachable at start; buffering charges and connecting in the background", "err", cerr)
	s.wg.Add(1)
	go s.connectLoop(co, opts)
	return s, nil
}

// unreachable reports whether a connection error means nothing answered
// (refused, timed out, no route): an outage, unlike a refused password or
// certificate.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// connectLoop retries the first connection with backoff until it succeeds
// or the store is closed.
func (s *Store) connectLoop(co valkey.ClientOption, opts Options) {
	defer s.wg.Done()
	delay := 100 * time.Millisecond
	var lastLog atomic.Int64
	for {
		t := time.NewTimer(delay)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-t.C:
		}
		c, err := valkey.NewClient(co)
		if err == nil {
			select {
			case <-s.stop: // closed meanwhile: Close no longer looks
				c.Close()
				return
			default:
			}
			s.attach(c)
			s.log.Info("valkey store: connected", "buffer_keys", s.Stats().BufferKeys)
			return
		}
		if every(&lastLog, 10*time.Second) {
			s.log.Warn("valkey store: still unreachable; retrying", "retry_in", (2 * delay).String(), "err", redact(err.Error(), opts))
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// clientOption validates opts, fills defaults in place and maps them to valkey-go.
func clientOption(opts *Options) (valkey.ClientOption, error) {
	if err := defaults(opts); err != nil {
		return valkey.ClientOption{}, err
	}
	if len(opts.Addresses) == 0 {
		return valkey.ClientOption{}, errors.New("valkey: no address")
	}
	for _, a := range opts.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return valkey.ClientOption{}, fmt.Errorf("valkey: address %q: %w", a, err)
		}
	}
	co := valkey.ClientOption{
		InitAddress:       append([]string(nil), opts.Addresses...),
		Username:          opts.Username,
		Password:          opts.Password,
		TLSConfig:         opts.TLS,
		Dialer:            net.Dialer{Timeout: opts.DialTimeout, KeepAlive: opts.PingInterval},
		ConnWriteTimeout:  opts.ConnWriteTimeout,
		PipelineMultiplex: opts.PipelineMultiplex,
		MaxFlushDelay:     opts.MaxFlushDelay,
		RingScaleEachConn: opts.RingScale,
		// Counters change on every hit: client-side caching gains nothing,
		// and an ACL user without +client could not enable tracking.
		DisableCache: true,
		// Never retry: the caller has a deadline of a few ms, and a retried
		// read would outlive it. The next request asks again.
		DisableRetry: true,
		// A background reader on every connection notices a closed server
		// at once, so the next call redials (and a refused dial is known
		// not to have sent anything) instead of writing into a dead socket.
		AlwaysPipelining: true,
		DialCtxFn:        dial,
		ClientName:       "budgetgen",
	}
	switch opts.Mode {
	case Standalone:
		if opts.MasterSet != "" {
			return co, errors.New("valkey: MasterSet is only for sentinel mode")
		}
		if len(opts.Addresses) != 1 {
			return co, fmt.Errorf("valkey: standalone mode takes one address, got %d", len(opts.Addresses))
		}
		co.ForceSingleClient = true
	case Cluster:
		if opts.MasterSet != "" {
			return co, errors.New("valkey: MasterSet is only for sentinel mode")
		}
		co.ClusterOption.MaxMovedRedirections = 16
	case Sentinel:
		if opts.MasterSet == "" {
			return co, errors.New("valkey: sentinel mode needs MasterSet")
		}
		co.Sentinel = valkey.SentinelOption{
			MasterSet:               opts.MasterSet,
			Username:                opts.SentinelUsername,
			Password:                opts.SentinelPassword,
			TLSConfig:               opts.TLS,
			Dialer:                  co.Dialer,
			TopologyRefreshInterval: opts.SentinelRefresh,
		}
	default:
		return co, fmt.Errorf("valkey: unknown mode %q (want standalone, cluster or sentinel)", opts.Mode)
	}
	return co, nil
}
