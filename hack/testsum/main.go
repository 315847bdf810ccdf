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

// summary is the state of one summarise run. Output is kept per test only
// until the test ends; a passed test's output is dropped, so memory is
// bounded by the tests running at once.
type summary struct {
	c           counts
	pr          *printer
	out         map[string]*strings.Builder // "<package> <test>" -> output
	pkgOut      map[string]*strings.Builder // package -> output outside tests
	failedPkgs  map[string]bool
	failedTests map[string]int
}

func summarise(r io.Reader, w io.Writer) (counts, error) {
	s := &summary{pr: &printer{w: w}, out: map[string]*strings.Builder{}, pkgOut: map[string]*strings.Builder{},
		failedPkgs: map[string]bool{}, failedTests: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	nonJSON := 0
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// go test prints build errors outside the JSON stream.
			nonJSON++
			s.pr.printf("%s\n", line)
			continue
		}
		s.event(e)
	}
	if err := sc.Err(); err != nil {
		return s.c, err
	}
	s.countPackageFailures()
	if s.c.passed+s.c.failed+s.c.skipped == 0 && len(s.failedPkgs) == 0 && nonJSON > 0 {
		return s.c, fmt.Errorf("no test2json events in the input")
	}
	s.pr.printf("tests: %d passed, %d failed, %d skipped\n", s.c.passed, s.c.failed+s.c.pkgFailed, s.c.skipped)
	return s.c, s.pr.err
}

// event takes one test2json event: output is kept, a result printed.
func (s *summary) event(e event) {
	switch e.Action {
	case "output":
		b, key := s.pkgOut, e.Package
		if e.Test != "" {
			b, key = s.out, e.Package+" "+e.Test
		}
		if b[key] == nil {
			b[key] = &strings.Builder{}
		}
		if b[key].Len() < 1<<20 {
			b[key].WriteString(e.Output)
		}
	case "pass", "fail", "skip":
		if e.Test == "" {
			s.packageResult(e)
		} else {
			s.testResult(e)
		}
	}
}

// packageResult prints a package's own result, with its output if it failed.
func (s *summary) packageResult(e event) {
	switch e.Action {
	case "pass":
		s.pr.printf("ok   %s (%.1fs)\n", e.Package, e.Elapsed)
	case "fail":
		s.failedPkgs[e.Package] = true
		s.pr.printf("FAIL %s (%.1fs)\n", e.Package, e.Elapsed)
		if b := s.pkgOut[e.Package]; b != nil {
			s.pr.printf("%s", indent(b.String()))
		}
	}
	delete(s.pkgOut, e.Package)
}

// testResult counts a test's result and prints a failed test's output.
func (s *summary) testResult(e event) {
	id := e.Package + " " + e.Test
	switch e.Action {
	case "pass":
		s.c.passed++
	case "skip":
		s.c.skipped++
	case "fail":
		s.c.failed++
		s.failedTests[e.Package]++
		s.pr.printf("--- FAIL %s %s (%.2fs)\n", e.Package, e.Test, e.Elapsed)
		if b := s.out[id]; b != nil {
			s.pr.printf("%s", indent(b.String()))
		}
	}
	delete(s.out, id)
}

// countPackageFailures counts a package that failed without a failing test
// (build error, panic in TestMain, timeout) as a failure of its own.
func (s *summary) countPackageFailures() {
	names := make([]string, 0, len(s.failedPkgs))
	for p := range s.failedPkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if s.failedTests[p] == 0 {
			s.c.pkgFailed++
		}
	}
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
