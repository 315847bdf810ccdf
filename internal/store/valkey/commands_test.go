package valkey

import (
	"slices"
	"testing"

	"github.com/valkey-io/valkey-go"
)

// TestCommandsSameWireForm: the unslotted commands used off a cluster are the
// exact commands the typed builders produce, so skipping the slot hash
// changes nothing Valkey sees.
func TestCommandsSameWireForm(t *testing.T) {
	b := (&fakeClient{}).B() // a standalone client's builder
	plain, slotted := commands{b: b}, commands{b: b, slotted: true}
	cases := []struct {
		name string
		f    func(commands) valkey.Completed
		want []string
	}{
		{"get", func(c commands) valkey.Completed { return c.get("k_a{x}") }, []string{"GET", "k_a{x}"}},
		{"hincrby", func(c commands) valkey.Completed { return c.hincrby("h", "f", 7) }, []string{"HINCRBY", "h", "f", "7"}},
	}
	for _, tc := range cases {
		pc, sc := tc.f(plain), tc.f(slotted)
		p, s := pc.Commands(), sc.Commands()
		if !slices.Equal(p, tc.want) || !slices.Equal(s, tc.want) {
			t.Errorf("%s: unslotted %q, slotted %q, want %q", tc.name, p, s, tc.want)
		}
	}
	// The slotted form carries the key's slot, which a cluster client needs.
	pg, sg := plain.get("a"), slotted.get("a")
	if pg.Slot() == sg.Slot() {
		t.Errorf("slotted and unslotted GET carry the same slot %d; the cluster form should hash the key", pg.Slot())
	}
}
