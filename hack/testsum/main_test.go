package main

import (
	"strings"
	"testing"
)

func TestSummarise(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"quiet\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"boom at x_test.go:3\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB","Elapsed":0.2}`,
		`{"Action":"skip","Package":"p","Test":"TestC"}`,
		`{"Action":"fail","Package":"p","Elapsed":1}`,
		`# q [q.test]`,
		`q/x.go:1: undefined: y`,
		`{"Action":"output","Package":"q","Output":"FAIL\tq [build failed]\n"}`,
		`{"Action":"fail","Package":"q","Elapsed":0}`,
		`{"Action":"pass","Package":"r","Elapsed":0.5}`,
	}, "\n")
	var out strings.Builder
	c, err := summarise(strings.NewReader(in), &out)
	if err != nil {
		t.Fatal(err)
	}
	if c.passed != 1 || c.failed != 1 || c.skipped != 1 || c.pkgFailed != 1 {
		t.Fatalf("counts %+v, want 1 passed, 1 failed test, 1 skipped, 1 package failed without a test", c)
	}
	got := out.String()
	for _, want := range []string{"--- FAIL p TestB", "boom at x_test.go:3", "undefined: y", "FAIL q", "ok   r", "tests: 1 passed, 2 failed, 1 skipped"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passed test's output is printed:\n%s", got)
	}
}

func TestSummariseRejectsNonJSON(t *testing.T) {
	if _, err := summarise(strings.NewReader("not json\n"), &strings.Builder{}); err == nil {
		t.Fatal("plain text with no test events was accepted")
	}
}
