package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestRenderStoppedMidwayWritesNothing: a signal (Ctrl-C, SIGTERM) that
// arrives while render is rendering stops it with exit 130, at once, and no
// file of -o, --ratelimit-config or --budget-map is written, not even one
// render finished before it noticed.
func TestRenderStoppedMidwayWritesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish bool // the render completes after the signal (else it never returns)
	}{
		{"signal during a render that then completes", true},
		{"signal during a render that takes long", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			release := make(chan struct{})
			defer close(release)
			renderSpec = func(bs *spec.BudgetSet) (*render.Result, error) {
				cancel(errors.New("interrupt"))
				if !tc.finish {
					<-release
				}
				return render.Render(bs)
			}
			defer func() { renderSpec = render.Render }()
			dir := t.TempDir()
			out, rls, bm := filepath.Join(dir, "out"), filepath.Join(dir, "rls"), filepath.Join(dir, "map.yaml")
			var stdout, stderr bytes.Buffer
			done := make(chan int, 1)
			go func() {
				done <- Run(ctx, []string{"render", "../../examples/budgets.yaml", "-o", out, "--ratelimit-config", rls, "--budget-map", bm}, strings.NewReader(""), &stdout, &stderr)
			}()
			select {
			case code := <-done:
				if code != ExitInterrupted {
					t.Errorf("exit %d, want %d; stderr: %s", code, ExitInterrupted, stderr.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("render ignored the signal: still running after 10 s")
			}
			if !strings.Contains(stderr.String(), "stopped") {
				t.Errorf("stderr does not say it stopped: %s", stderr.String())
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				t.Errorf("%s written after the signal", e.Name())
			}
		})
	}
}
