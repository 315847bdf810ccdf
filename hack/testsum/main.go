// Command testsum reads `go test -json` events on stdin and prints what a
// person needs from a long run: one line per package (ok/FAIL and time), the
// full output of every failed test, and a closing line "tests: N passed, N
// failed[, N skipped]" counted over top-level and sub-tests. It exits 1 when
// a test or a package failed (a build error fails its package with no test
// event, so packages are counted too), and 2 when the input is not test2json.
//
// hack/test.sh pipes each test stage through it; the per-stage counts are
// appended to the file named by -counts so the script can print one total.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type counts struct{ passed, failed, skipped, pkgFailed int }

func main() {
	countsFile := flag.String("counts", "", "append \"passed failed skipped\" to this file")
	flag.Parse()
	c, err := summarise(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	if *countsFile != "" {
		f, err := os.OpenFile(*countsFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = fmt.Fprintf(f, "%d %d %d\n", c.passed, c.failed+c.pkgFailed, c.skipped)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsum:", err)
			os.Exit(2)
		}
	}
	if c.failed > 0 || c.pkgFailed > 0 {
		os.Exit(1)
	}
}

// printer keeps the first write error so the loop stays readable and the
// error still reaches the caller.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func summarise(r io.Reader, w io.Writer) (counts, error) {
	var c counts
	pr := &printer{w: w}
	// Output is kept per test only until the test ends; a passed test's
	// output is dropped, so memory is bounded by the tests running at once.
	out := map[string]*strings.Builder{}
	pkgOut := map[string]*strings.Builder{}
	failedPkgs := map[string]bool{}
	failedTests := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	nonJSON := 0
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// go test prints build errors outside the JSON stream.
			nonJSON++
			pr.printf("%s\n", line)
			continue
		}
		id := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			b := pkgOut
			key := e.Package
			if e.Test != "" {
				b, key = out, id
			}
			if b[key] == nil {
				b[key] = &strings.Builder{}
			}
			if b[key].Len() < 1<<20 {
				b[key].WriteString(e.Output)
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				// A package's own result.
				switch e.Action {
				case "pass":
					pr.printf("ok   %s (%.1fs)\n", e.Package, e.Elapsed)
				case "fail":
					failedPkgs[e.Package] = true
					pr.printf("FAIL %s (%.1fs)\n", e.Package, e.Elapsed)
					if b := pkgOut[e.Package]; b != nil {
						pr.printf("%s", indent(b.String()))
					}
				}
				delete(pkgOut, e.Package)
				continue
			}
			switch e.Action {
			case "pass":
				c.passed++
			case "skip":
				c.skipped++
			case "fail":
				c.failed++
				failedTests[e.Package]++
				pr.printf("--- FAIL %s %s (%.2fs)\n", e.Package, e.Test, e.Elapsed)
				if b := out[id]; b != nil {
					pr.printf("%s", indent(b.String()))
				}
			}
			delete(out, id)
		}
	}
	if err := sc.Err(); err != nil {
		return c, err
	}
	// A package that failed without a failing test (build error, panic in
	// TestMain, timeout) is a failure of its own.
	names := make([]string, 0, len(failedPkgs))
	for p := range failedPkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if failedTests[p] == 0 {
			c.pkgFailed++
		}
	}
	if c.passed+c.failed+c.skipped == 0 && len(failedPkgs) == 0 && nonJSON > 0 {
		return c, fmt.Errorf("no test2json events in the input")
	}
	pr.printf("tests: %d passed, %d failed, %d skipped\n", c.passed, c.failed+c.pkgFailed, c.skipped)
	return c, pr.err
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	return b.String()
}
