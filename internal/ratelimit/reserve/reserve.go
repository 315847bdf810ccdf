// Package reserve sizes the holds of reserving budgets: how many tokens a
// check holds for each admitted, unfinished request. A budget's reserve is
// either fixed (the spec's `reserve: 50000`) or learned (`reserve: auto`):
// a high percentile of the budget's recent charges, the spec's
// reserveInitial until enough charges were seen.
//
// Learning is per replica and per budget bucket, from the charges this
// replica sees: replicas behind one load balancer see the same distribution,
// so their estimates agree closely; a hold is always released by the count
// it held, wherever it was placed, so estimates never need to agree exactly.
package reserve

import (
	"sync"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
)

// Learning parameters.
const (
	// Window is how many recent charges per budget the estimate looks at.
	Window = 512
	// MinSamples is how many charges a budget needs before its estimate
	// replaces reserveInitial.
	MinSamples = 20
	// Percentile of the recent charges an auto reserve holds: a request
	// larger than 95% of recent ones is rare, and one that is larger is
	// still charged its real count when it ends.
	Percentile = 95
	// refresh: the estimate is recomputed every refresh charges (and at
	// MinSamples), so a check costs a map lookup and a lock, not a sort.
	refresh = 32
)

// Learner learns auto reserves. The zero value is ready; safe for
// concurrent use.
type Learner struct {
	budgets sync.Map // bucket -> *history
}

// history is one budget's recent charges.
type history struct {
	mu       sync.Mutex
	ring     [Window]uint64
	scratch  [Window]uint64 // percentile's working copy: no allocation per refresh
	n        int            // charges seen (capped at a large value)
	next     int
	estimate uint64
}

// Size returns the tokens a check of budget b holds: its fixed reserve, or
// for auto the learned estimate (Initial until MinSamples charges were
// seen). 0 means b does not reserve.
func (l *Learner) Size(b *config.Budget) uint64 {
	if b == nil || !b.Reserve.On() {
		return 0
	}
	if !b.Reserve.Auto {
		return b.Reserve.Tokens
	}
	v, ok := l.budgets.Load(b.Learns())
	if !ok {
		return max(b.Reserve.Initial, 1)
	}
	h := v.(*history)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n < MinSamples {
		return max(b.Reserve.Initial, 1)
	}
	return max(h.estimate, 1)
}

// Observe records a charge of tokens for budget b (auto reserves only).
func (l *Learner) Observe(b *config.Budget, tokens uint64) {
	if b == nil || !b.Reserve.Auto || tokens == 0 {
		return
	}
	v, ok := l.budgets.Load(b.Learns())
	if !ok {
		v, _ = l.budgets.LoadOrStore(b.Learns(), new(history))
	}
	h := v.(*history)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring[h.next] = tokens
	h.next = (h.next + 1) % Window
	if h.n < 1<<30 {
		h.n++
	}
	if h.n <= MinSamples || h.n%refresh == 0 {
		h.estimate = h.percentile()
	}
}

// percentile is the Percentile-th percentile of the recent charges
// (nearest rank, rounded up), selected in linear time: a sort of the window
// at every refresh cost more than the rest of a charge's decision.
func (h *history) percentile() uint64 {
	s := h.scratch[:min(h.n, Window)]
	copy(s, h.ring[:len(s)])
	rank := (Percentile*len(s) + 99) / 100
	return selectNth(s, max(rank-1, 0))
}

// selectNth returns the value that would be at index k if s were sorted
// (Hoare's quickselect with a median-of-three pivot; s is reordered).
func selectNth(s []uint64, k int) uint64 {
	lo, hi := 0, len(s)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		if s[mid] < s[lo] {
			s[mid], s[lo] = s[lo], s[mid]
		}
		if s[hi] < s[lo] {
			s[hi], s[lo] = s[lo], s[hi]
		}
		if s[hi] < s[mid] {
			s[hi], s[mid] = s[mid], s[hi]
		}
		pivot := s[mid]
		i, j := lo, hi
		for i <= j {
			for s[i] < pivot {
				i++
			}
			for s[j] > pivot {
				j--
			}
			if i <= j {
				s[i], s[j] = s[j], s[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return s[k]
		}
	}
	return s[k]
}

// Forget drops what was learned of rules no longer configured (a config
// reload), so memory follows the config; keep is given config.Budget.Learns.
func (l *Learner) Forget(keep func(learns string) bool) {
	l.budgets.Range(func(k, _ any) bool {
		if !keep(k.(string)) {
			l.budgets.Delete(k)
		}
		return true
	})
}
