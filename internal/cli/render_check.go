package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/pkg/render"
)

// addCheckFlag registers render's --check.
func addCheckFlag(cmd *cobra.Command, check *bool) {
	cmd.Flags().BoolVar(check, "check", false, "write nothing; print a diff of every file -o, --ratelimit-config and --budget-map would create, change or remove, and exit 1 if there is one (a drift check for CI and pre-commit that also sees new and removed files)")
}

// maxDiffLines bounds the diff printed per file: enough to see what
// drifted in a CI log; the command without --check shows the rest.
const maxDiffLines = 200

// renderOutput is one output of render as WriteDir would write it.
type renderOutput struct {
	dir   string
	files map[string][]byte
	opts  atomicfile.Options
}

// renderOutputs lists the outputs o asks for, with the stale-file rules
// runRender writes them with.
func renderOutputs(o renderOptions, res *render.Result, rlsFiles map[string][]byte, mapFile []byte) []renderOutput {
	var outs []renderOutput
	if o.outDir != "" {
		outs = append(outs, renderOutput{o.outDir, res.Files(), manifestOptions(o)})
	}
	if o.rlsDir != "" {
		outs = append(outs, renderOutput{o.rlsDir, rlsFiles, rateLimitFileOpts})
	}
	if o.mapPath != "" {
		outs = append(outs, renderOutput{filepath.Dir(o.mapPath), map[string][]byte{filepath.Base(o.mapPath): mapFile}, atomicfile.Options{}})
	}
	return outs
}

// The stale-file rules of -o and --ratelimit-config, for writing and for
// --check alike: files of objects or domains no longer rendered are
// removed, never files budgetgen did not write.
var (
	manifestFileOpts  = generatedOnly(render.IsGenerated)
	rateLimitFileOpts = generatedOnly(rlsconfig.IsGenerated)
)

// manifestOptions are the stale-file rules of -o for the command line o: a
// budget map this run writes into the -o directory starts with render's
// generated header too, but it is an output of the run, not a file of an
// object no longer rendered.
func manifestOptions(o renderOptions) atomicfile.Options {
	if o.mapPath == "" || !sameDir(o.outDir, filepath.Dir(o.mapPath)) {
		return manifestFileOpts
	}
	keep := filepath.Base(o.mapPath)
	return atomicfile.Options{RemoveStale: func(name string, content []byte) bool {
		return name != keep && render.IsGenerated(content)
	}}
}

// sameDir reports whether two directory paths name one directory.
func sameDir(a, b string) bool {
	if ia, err := os.Stat(a); err == nil {
		if ib, err := os.Stat(b); err == nil {
			return os.SameFile(ia, ib)
		}
	}
	aa, errA := filepath.Abs(a)
	ab, errB := filepath.Abs(b)
	return errA == nil && errB == nil && aa == ab
}

func generatedOnly(generated func([]byte) bool) atomicfile.Options {
	return atomicfile.Options{RemoveStale: func(_ string, content []byte) bool { return generated(content) }}
}

// checkRender compares what render would write with what is on disk and
// prints a unified diff of each difference to w. It writes no file.
func checkRender(w io.Writer, outs []renderOutput) error {
	n := 0
	for _, out := range outs {
		changes, err := atomicfile.CompareDir(out.dir, out.files, out.opts)
		if err != nil {
			return failure(fmt.Errorf("render --check: %w", err))
		}
		for _, c := range changes {
			n++
			if err := writeChange(w, filepath.Join(out.dir, c.Name), c); err != nil {
				return failure(fmt.Errorf("write stdout: %w", err))
			}
		}
	}
	if n > 0 {
		return failure(fmt.Errorf("render --check: %d %s not what render writes: run the same command without --check and commit the result", n, plural(n, "file is", "files are")))
	}
	return nil
}

// writeChange prints one change as a unified diff (git's /dev/null for a
// created or removed file), cut after maxDiffLines lines.
func writeChange(w io.Writer, path string, c atomicfile.Change) error {
	from, to := path, path
	switch c.Kind {
	case atomicfile.Create:
		from = "/dev/null"
	case atomicfile.Remove:
		to = "/dev/null"
	}
	text, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: splitLines(c.Old), B: splitLines(c.New),
		FromFile: from, ToFile: to, Context: 3,
	})
	if err != nil {
		return err
	}
	lines := strings.SplitAfter(text, "\n")
	if len(lines) > maxDiffLines {
		lines = append(lines[:maxDiffLines], fmt.Sprintf("... %d more diff lines in %s\n", len(lines)-maxDiffLines, path))
	}
	if _, err := fmt.Fprintf(w, "%s: would %s\n", path, c.Kind); err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := io.WriteString(w, l); err != nil {
			return err
		}
	}
	return nil
}

// splitLines is difflib.SplitLines, but an empty file has no lines (not
// one empty line).
func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return difflib.SplitLines(string(b))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
