// Package schedtest measures how late this machine's scheduler runs a
// goroutine, so that a test's timing assertion can be relative to the same
// run (bound + the lag measured meanwhile) instead of an absolute bound
// that a loaded machine breaks.
package schedtest

import (
	"slices"
	"sync"
	"time"
)

// tick is how long the probe sleeps between measurements.
const tick = time.Millisecond

// maxSamples bounds the probe's record (about 15 minutes of ticks on an
// idle machine); later lags still count towards the worst.
const maxSamples = 1 << 20

// Probe sleeps tick in a loop and records how much later than asked it
// woke. Start it before the timed work, Stop it after.
type Probe struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once

	lags  []time.Duration // written by the probe goroutine until done
	worst time.Duration
	p99   time.Duration
}

// Start starts a probe.
func Start() *Probe {
	p := &Probe{stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *Probe) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		t0 := time.Now()
		time.Sleep(tick)
		lag := max(time.Since(t0)-tick, 0)
		p.worst = max(p.worst, lag)
		if len(p.lags) < maxSamples {
			p.lags = append(p.lags, lag)
		}
	}
}

// Stop ends the probe and returns the 99th percentile and the worst lag it
// saw. Calling it again returns the same values.
func (p *Probe) Stop() (p99, worst time.Duration) {
	p.once.Do(func() {
		close(p.stop)
		<-p.done
		if len(p.lags) > 0 {
			slices.Sort(p.lags)
			p.p99 = p.lags[min(len(p.lags)*99/100, len(p.lags)-1)]
		}
	})
	return p.p99, p.worst
}
