package docs

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/cli"
)

// docCommand is one budgetgen command line a document shows.
type docCommand struct {
	file string
	line int
	text string // from "budgetgen" to the end of the command
}

// codeSpans returns the code of a Markdown file with its line numbers: the
// lines of fenced blocks (a line ending in a backslash joined with the next)
// and every inline `code span` of the other lines.
func codeSpans(t *testing.T, file string) (lines []int, code []string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	inline := regexp.MustCompile("`([^`]+)`")
	fenced, cont := false, ""
	for n, l := range strings.Split(string(data), "\n") {
		block := fenced || strings.HasPrefix(l, "    ") // fenced or indented
		if block {
			if i := strings.Index(l, " #"); i >= 0 || strings.HasPrefix(strings.TrimSpace(l), "#") {
				l = l[:max(i, 0)] // a shell comment is prose
			}
		}
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "```"):
			fenced = !fenced
		case block && strings.HasSuffix(l, `\`):
			cont += strings.TrimSuffix(l, `\`) + " "
		case block:
			lines, code = append(lines, n+1), append(code, cont+l)
			cont = ""
		default:
			for _, m := range inline.FindAllStringSubmatch(l, -1) {
				lines, code = append(lines, n+1), append(code, m[1])
			}
		}
	}
	return lines, code
}

// budgetgenCommands finds the budgetgen command lines in the code of the
// given Markdown files.
func budgetgenCommands(t *testing.T, files []string) []docCommand {
	t.Helper()
	start := regexp.MustCompile(`(?:^|[\s(|$;&/])budgetgen(?:\s|$)`) // also go run ./cmd/budgetgen
	var out []docCommand
	for _, f := range files {
		lines, code := codeSpans(t, f)
		for i, c := range code {
			for _, loc := range start.FindAllStringIndex(c, -1) {
				text := c[loc[0]:]
				text = text[strings.Index(text, "budgetgen"):]
				// The command ends at a shell operator or a comment.
				if j := strings.IndexAny(text, "|;&#)<>"); j >= 0 {
					text = text[:j]
				}
				out = append(out, docCommand{file: f, line: lines[i], text: text})
			}
		}
	}
	return out
}

// TestCommandsInDocsExist: every budgetgen command line the README, docs/
// and the examples' READMEs show names a subcommand budgetgen has and only
// flags that subcommand takes, so a reader who copies one gets no "unknown
// command" or "unknown flag". Placeholders (SPEC, FILE, DIR) are arguments,
// not checked.
func TestCommandsInDocsExist(t *testing.T) {
	files := append(markdownFiles(t), globs(t, "../examples/*/README.md", "../examples/*/*/README.md", "../deploy/*/README.md")...)
	cmds := budgetgenCommands(t, files)
	if len(cmds) < 50 {
		t.Fatalf("found %d budgetgen command lines in the docs: the test lost its subject", len(cmds))
	}
	root := cli.Command()
	flag := regexp.MustCompile(`^--?([A-Za-z][\w-]*)(?:=.*)?$`)
	for _, c := range cmds {
		cmd, words := root, strings.Fields(c.text)[1:]
		for len(words) > 0 {
			sub := findSub(cmd, words[0])
			if sub == nil {
				break
			}
			cmd, words = sub, words[1:]
		}
		if cmd == root && len(words) > 0 && regexp.MustCompile(`^[a-z]+$`).MatchString(words[0]) {
			t.Errorf("%s:%d: %q: budgetgen has no command %q", c.file, c.line, c.text, words[0])
			continue
		}
		for _, w := range words {
			m := flag.FindStringSubmatch(w)
			if m == nil || w == "-" || w == "--" {
				continue
			}
			name := m[1]
			var ok bool
			if strings.HasPrefix(w, "--") {
				ok = cmd.Flags().Lookup(name) != nil || name == "help"
			} else {
				ok = len(name) == 1 && (cmd.Flags().ShorthandLookup(name) != nil || name == "h")
			}
			if !ok {
				t.Errorf("%s:%d: %q: %s has no flag %s", c.file, c.line, strings.TrimSpace(c.text), cmd.CommandPath(), w)
			}
		}
	}
}

func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, s := range cmd.Commands() {
		if s.Name() == name || s.HasAlias(name) {
			return s
		}
	}
	return nil
}

// TestExitStatusTable: the README's table of exit statuses lists exactly the
// statuses budgetgen exits with (internal/cli/exit.go).
func TestExitStatusTable(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| (\d+) \| `)
	got := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(data), -1) {
		got[m[1]] = true
	}
	want := map[string]bool{}
	for _, code := range []int{cli.ExitOK, cli.ExitFailure, cli.ExitUsage, cli.ExitInterrupted} {
		want[strconv.Itoa(code)] = true
	}
	if !maps.Equal(got, want) {
		t.Errorf("README.md's exit status table lists %v, budgetgen exits with %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}
