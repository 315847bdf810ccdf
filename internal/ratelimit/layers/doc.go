// Package layers holds no code. Its tests keep the rate limit service's
// packages as docs/architecture.md draws them: imports point down (settings
// are plain values, a store and its test suites sit below the decision,
// decide is pure), and no function of internal/ratelimit or internal/store
// is over 80 lines.
package layers
