package server

import (
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Health components, as in the reference's HealthChecker.
const (
	ComponentConfig   = "config"
	ComponentStore    = "redis"
	ComponentShutdown = "sigterm"
)

// defaultReasons say why a component is unhealthy when Fail gives no reason.
var defaultReasons = map[string]string{
	ComponentConfig:   "no rate limit config loaded yet (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED is set)",
	ComponentStore:    "the counter store is not reachable",
	ComponentShutdown: "shutting down",
}

// Health is healthy when every component is: HTTP /healthcheck answers 200
// "OK", or 500 with one line per unhealthy component saying why; the gRPC
// health service reports SERVING or NOT_SERVING for "" and "ratelimit"
// (Check and Watch).
type Health struct {
	mu      sync.Mutex
	comps   map[string]bool
	reasons map[string]string // of unhealthy components
	ok      atomic.Bool
	changed chan struct{} // closed and replaced when ok changes (Watch)
	done    chan struct{} // closed at shutdown: Watch streams end
	once    sync.Once
}

func newHealth(requireConfig bool) *Health {
	h := &Health{changed: make(chan struct{}), done: make(chan struct{}), comps: map[string]bool{ComponentStore: true, ComponentShutdown: true}, reasons: map[string]string{}}
	if requireConfig {
		h.comps[ComponentConfig] = false
		h.reasons[ComponentConfig] = defaultReasons[ComponentConfig]
	}
	h.update()
	return h
}

func (h *Health) update() {
	all := true
	for _, v := range h.comps {
		all = all && v
	}
	if h.ok.Swap(all) != all {
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

// watch returns the state and a channel closed at its next change.
func (h *Health) watch() (bool, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ok.Load(), h.changed
}

// endWatches ends the Watch streams (at shutdown, after the last status
// change was sent), so a graceful stop does not wait for them.
func (h *Health) endWatches() { h.once.Do(func() { close(h.done) }) }

// OK marks a component healthy.
func (h *Health) OK(component string) { h.set(component, true, "") }

// Fail marks a component unhealthy, with its default reason.
func (h *Health) Fail(component string) { h.set(component, false, defaultReasons[component]) }

// FailBecause marks a component unhealthy; /healthcheck says reason (keep
// secrets out of it: probes and their logs read it).
func (h *Health) FailBecause(component, reason string) { h.set(component, false, reason) }

func (h *Health) set(component string, v bool, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, tracked := h.comps[component]; !tracked && component == ComponentConfig {
		return // config health only matters when required
	}
	h.comps[component] = v
	if v {
		delete(h.reasons, component)
	} else {
		if reason == "" {
			reason = "unhealthy"
		}
		h.reasons[component] = reason
	}
	h.update()
}

// Why returns one "component: reason" line per unhealthy component, sorted;
// empty when healthy.
func (h *Health) Why() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	lines := make([]string, 0, len(h.reasons))
	for c, r := range h.reasons {
		lines = append(lines, c+": "+r+"\n")
	}
	sort.Strings(lines)
	return strings.Join(lines, "")
}

// Healthy reports the overall state.
func (h *Health) Healthy() bool { return h.ok.Load() }

// ServeHTTP is the reference's /healthcheck: 200 "OK", or 500 with a body
// that says which component is unhealthy and why (the reference's is
// empty).
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if h.ok.Load() {
		_, _ = w.Write([]byte("OK"))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = w.Write([]byte("unhealthy\n" + h.Why()))
}
