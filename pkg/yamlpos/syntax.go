package yamlpos

import (
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
