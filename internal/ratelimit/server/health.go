package server

import (
	"net/http"
	"sync"
	"sync/atomic"
)

// Health components, as in the reference's HealthChecker.
const (
	ComponentConfig   = "config"
	ComponentStore    = "redis"
	ComponentShutdown = "sigterm"
)

// Health is healthy when every component is: HTTP /healthcheck answers 200
// "OK" or 500, and the gRPC health service reports SERVING or NOT_SERVING for
// "" and "ratelimit" (Check and Watch).
type Health struct {
	mu      sync.Mutex
	comps   map[string]bool
	ok      atomic.Bool
	changed chan struct{} // closed and replaced when ok changes (Watch)
	done    chan struct{} // closed at shutdown: Watch streams end
	once    sync.Once
}

func newHealth(requireConfig bool) *Health {
	h := &Health{changed: make(chan struct{}), done: make(chan struct{}), comps: map[string]bool{ComponentStore: true, ComponentShutdown: true}}
	if requireConfig {
		h.comps[ComponentConfig] = false
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
func (h *Health) OK(component string) { h.set(component, true) }

// Fail marks a component unhealthy.
func (h *Health) Fail(component string) { h.set(component, false) }

func (h *Health) set(component string, v bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, tracked := h.comps[component]; !tracked && component == ComponentConfig {
		return // config health only matters when required
	}
	h.comps[component] = v
	h.update()
}

// Healthy reports the overall state.
func (h *Health) Healthy() bool { return h.ok.Load() }

// ServeHTTP is the reference's /healthcheck.
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if h.ok.Load() {
		_, _ = w.Write([]byte("OK"))
		return
	}
	w.WriteHeader(http.StatusInternalServerError)
}
