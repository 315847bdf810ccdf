package valkey

import (
	"strconv"

	"github.com/valkey-io/valkey-go"
)

// commands builds the store's Valkey commands.
//
// valkey-go's typed builders hash every key for its cluster slot (CRC16) even
// on a client that talks to one server, where the slot is never used: about
// 4% of the service's CPU per decision in the scenario-A profile
// (docs/benchmarks.md). Off a cluster the same commands are built as
// arbitrary commands with the key as a plain argument: identical bytes on the
// wire, no hashing. In a cluster the typed builders stay, because valkey-go
// routes each command by its key's slot.
type commands struct {
	b       valkey.Builder
	slotted bool
}

func (c commands) get(key string) valkey.Completed {
	if c.slotted {
		return c.b.Get().Key(key).Build()
	}
	return c.b.Arbitrary("GET").Args(key).Build()
}

func (c commands) hincrby(key, field string, n uint64) valkey.Completed {
	if c.slotted {
		return c.b.Hincrby().Key(key).Field(field).Increment(int64(n)).Build()
	}
	return c.b.Arbitrary("HINCRBY").Args(key, field, strconv.FormatInt(int64(n), 10)).Build()
}
