//go:build race

package valkey

import "time"

// raceSlack widens timing bounds under the race detector, which slows the
// store's code (but not a goroutine that only waits) several-fold.
const raceSlack = 100 * time.Millisecond
