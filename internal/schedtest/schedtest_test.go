package schedtest

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestProbeSeesABusyScheduler: with GOMAXPROCS 1 and a goroutine that
// spins without yielding for 30 ms, the probe's worst lag covers most of
// the spin (it cannot be woken while the spinner holds the only P until
// the runtime preempts it, after about 10 ms); p99 is never above worst.
func TestProbeSeesABusyScheduler(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	p := Start()
	time.Sleep(5 * time.Millisecond) // stays: the probe runs before the spin
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
		}
	}()
	wg.Wait()
	time.Sleep(5 * time.Millisecond) // stays: and after it
	p99, worst := p.Stop()
	if p99 > worst {
		t.Fatalf("p99 %v above worst %v", p99, worst)
	}
	// Load only makes the lag longer, so this lower bound holds on a busy
	// machine too.
	if worst < 5*time.Millisecond {
		t.Fatalf("worst lag %v while a spinner held the only P for 30 ms", worst)
	}
	if a, b := p.Stop(); a != p99 || b != worst {
		t.Fatalf("second Stop: %v %v, want %v %v", a, b, p99, worst)
	}
}
