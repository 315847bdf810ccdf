package yamlpos

import (
	"bytes"
	"strconv"
	"strings"
)

// splitLine takes the line out of the text of a yaml.v3 syntax error. The
// parser gives no structured position: its failures are fmt.Errorf("yaml: "
// + "line N: " + problem) texts (parser.fail and failf in yaml.v3's
// decode.go and yaml.go, v3.0.1), the line part absent when it knows none.
// This is the one place that reads it; line is 0 when the text has none,
// and msg is the problem without the "yaml: " and line prefixes.
func splitLine(text string) (line int, msg string) {
	msg = strings.TrimPrefix(text, "yaml: ")
	rest, ok := strings.CutPrefix(msg, "line ")
	if !ok {
		return 0, msg
	}
	digits, problem, ok := strings.Cut(rest, ": ")
	if !ok || digits == "" || digits[0] == '0' || len(digits) > 9 || strings.Trim(digits, "0123456789") != "" {
		return 0, msg
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n <= 0 {
		return 0, msg
	}
	return n, problem
}

// syntaxHint adds what to do to a yaml.v3 syntax error where its own words
// do not say it, and returns the line it is at: a tab in the indentation
// ("found character that cannot start any token"; "found a tab character
// that violates indentation", which yaml.v3 puts on the line before the
// tab's), or bytes that are not UTF-8 text (a binary file, which yaml.v3
// reports with no line).
func syntaxHint(data []byte, line int, msg string) (int, string) {
	hasTab := func(n int) bool {
		text, ok := lineOf(data, n)
		return ok && strings.Contains(text, "\t")
	}
	switch {
	case strings.Contains(msg, "invalid leading UTF-8 octet"), strings.Contains(msg, "invalid trailing UTF-8 octet"),
		strings.Contains(msg, "incomplete UTF-8 octet sequence"), strings.Contains(msg, "control characters are not allowed"):
		return line, msg + " (the file is not UTF-8 text: is it the right file?)"
	case line > 0 && strings.Contains(msg, "tab character"):
		if !hasTab(line) && hasTab(line+1) {
			line++
		}
		return line, msg + ": YAML indents with spaces"
	case line > 0 && strings.Contains(msg, "cannot start any token") && hasTab(line):
		return line, msg + " (the line holds a tab: YAML indents with spaces)"
	}
	return line, msg
}

// lineOf returns line n (from 1) of data.
func lineOf(data []byte, n int) (string, bool) {
	for i := 1; len(data) > 0; i++ {
		end := bytes.IndexByte(data, '\n')
		if end < 0 {
			end = len(data)
		}
		if i == n {
			return string(data[:end]), true
		}
		data = data[min(end+1, len(data)):]
	}
	return "", false
}
