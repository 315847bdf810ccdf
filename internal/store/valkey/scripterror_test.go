package valkey

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestScriptErrorAfterWritesNotReplayedTwice: Valkey does not roll a script
// back when it fails midway: an error reply from a running script may come
// after its SETBIT and its INCRBYs were applied. Such a call was summed back
// into the buffer as certainly not applied and replayed under a fresh id,
// which applied its hits again, failed again and was summed back again: one
// charge of 7 hits stood at 357 after half a second, and grew until its
// window ended. Two triggers: a hold hash field that is not the script's
// layout (struct.unpack fails after the counter's INCRBY), and an ACL user
// that may not run one of the script's later commands (HDEL here: "ERR ACL
// failure in script"). Each call must be kept under its id instead: Valkey
// then holds its hits once, and the tally says so (replayed under the id and
// found applied, or given up as maybe applied when the id's window passes).
func TestScriptErrorAfterWritesNotReplayedTwice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, srv *valkeytest.Server, hash string, o *Options)
		class store.Class // how the kept call is resolved
	}{
		{"malformed hold field", func(t *testing.T, srv *valkeytest.Server, hash string, _ *Options) {
			if _, err := srv.Do("HSET", hash, "k", "not the script's layout"); err != nil {
				t.Fatal(err)
			}
		}, store.AmbiguousDropped}, // every replay fails the same way until the id's window passes
		{"ACL denies a later command", func(t *testing.T, srv *valkeytest.Server, _ string, o *Options) {
			if _, err := srv.Do("ACL", "SETUSER", "budget", "on", ">pw", "~*", "+@all", "-hdel"); err != nil {
				t.Fatal(err)
			}
			o.Username, o.Password = "budget", "pw"
		}, store.AmbiguousApplied}, // the replay reads only (bit set): no HDEL, answered
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := valkeytest.Start(t, valkeytest.Options{})
			window := time.Now().Add(time.Hour).Unix()
			hash := "bgh|" + strconv.FormatInt(window, 10)
			hold := store.Hold{Expiry: time.Minute, Window: window}
			exp := time.Unix(window, 0)
			o := Options{Addresses: []string{srv.Addr}, ReplayInterval: 5 * time.Millisecond, IdempotencyWindow: 400 * time.Millisecond}
			tc.setup(t, srv, hash, &o)
			s := mustNew(t, o)
			if tc.class == store.AmbiguousApplied {
				// A hold to release: its release deletes the field (HDEL).
				h := hold
				h.Reserve = 5
				cs := []store.Counter{{Key: "k", ExpireAt: exp, Start: true, Limit: 100, Enforce: true, Hold: h}}
				rs := make([]store.Result, 1)
				if err := s.Charge(context.Background(), cs, rs); err != nil || !rs[0].Held {
					t.Fatalf("check: %+v, %v; want held", rs[0], err)
				}
			}
			h := hold
			h.Release = 1
			cs := []store.Counter{{Key: "k", Hits: 7, ExpireAt: exp, Hold: h}}
			err := s.Charge(context.Background(), cs, make([]store.Result, 1))
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("charge: %v, want the script's error", err)
			}
			y := s.Tally()
			c := store.TargetCounter
			// Resolved within a few id windows; a call summed back under
			// fresh ids never is.
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && (y.Waiting(c) != 0 || s.Stats().BufferKeys != 0); {
				time.Sleep(5 * time.Millisecond) // poll interval
			}
			if got, _ := srv.Do("GET", "k"); got != "7" {
				t.Errorf("GET k = %s after one charge of 7 hits: counted again by replays under fresh ids (%s)", got, classes(y, c))
			}
			if y.Get(c, store.Ambiguous) != 7 || y.Get(c, tc.class) != 7 || y.Get(c, store.Buffered) != 0 {
				t.Errorf("tally %s; want the 7 hits ambiguous, then %s", classes(y, c), tc.class)
			}
		})
	}
}
