//go:build !race

package valkey

import "time"

// raceSlack widens timing bounds under the race detector only.
const raceSlack = 0 * time.Millisecond
