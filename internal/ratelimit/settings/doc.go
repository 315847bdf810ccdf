package settings

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// group is one concern of --help and docs/settings.md. A setting belongs to
// the first group that names it or whose prefix its first environment
// variable has; TestEverySettingHasAGroup fails on a setting in none.
type group struct {
	title    string
	names    []string
	prefixes []string
}

var groups = []group{
	{title: "Listeners", names: []string{"HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST", "DEBUG_PORT", "HTTP_JSON"}},
	{title: "gRPC server", names: []string{"GRPC_SERVER_IMPL", "GRPC_STREAM_WORKERS", "GRPC_MAX_CONNECTIONS", "GRPC_IDLE_TIMEOUT",
		"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"}},
	{title: "Stopping", names: []string{"SHUTDOWN_DELAY"}},
	{title: "TLS of the gRPC port", names: []string{"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"}},
	{title: "Rate limit config", names: []string{"CONFIG_TYPE", "CONFIG_DIR", "BUDGET_MAP_PATH", "CONFIG_POLL_INTERVAL",
		"FORCE_START_WITHOUT_INITIAL_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"}, prefixes: []string{"RUNTIME_"}},
	{title: "xDS config source (CONFIG_TYPE=GRPC_XDS_SOTW)", names: []string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"}, prefixes: []string{"CONFIG_GRPC_XDS_"}},
	{title: "Decisions and counters", names: []string{"CACHE_KEY_PREFIX", "KEY_FORMAT", "WINDOW_MODE", "RESET_TIME_ZONE", "EXPIRATION_JITTER_MAX_SECONDS",
		"NEAR_LIMIT_RATIO", "SHADOW_MODE", "FAILURE_POLICY", "STORE_TIMEOUT", "STORE_BATCH_WORKERS", "OVER_LIMIT_CACHE_SIZE"}, prefixes: []string{"RESERV"}},
	{title: "Valkey store (REDIS_URL set)", prefixes: []string{"REDIS_", "VALKEY_"}},
	{title: "Embedded memory store (no REDIS_URL)", prefixes: []string{"MEMORY_MAX_", "MEMORY_FULL_", "MEMORY_SNAPSHOT_"}},
	{title: "Shadow-week ledger and threshold events", names: []string{"LEDGER_RETENTION_DAYS", "THRESHOLD_EVENTS_URL"}, prefixes: []string{"LEDGER_", "THRESHOLD_"}},
	{title: "Metrics and logs", names: []string{"USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH", "BUDGET_USAGE_TOP_PRINCIPALS", "LOG_LEVEL", "LOG_FORMAT"}},
	{title: "Go runtime", names: []string{"GC_PERCENT", "MEMORY_LIMIT_RATIO"}},
}

// otherGroup holds settings no group claims (a test fails on any).
const otherGroup = "Other"

func (g group) has(env string) bool {
	if slices.Contains(g.names, env) {
		return true
	}
	for _, p := range g.prefixes {
		if strings.HasPrefix(env, p) {
			return true
		}
	}
	return false
}

// Doc is one setting as --help and docs/settings.md show it.
type Doc struct {
	// Env lists its environment variables (a later one that is set wins);
	// Flag is its flag without dashes, "" when it has none.
	Env  []string
	Flag string
	// Default is the value's text form when nothing sets it.
	Default string
	// Doc is its one-line description.
	Doc string
	// Group is the concern it is listed under.
	Group string
}

// Docs returns every setting of the table with its default, in group order
// (settings keep the table's order within a group).
func Docs() []Doc {
	d := Defaults()
	r := newRaw(d)
	var out []Doc
	titles := make([]string, 0, len(groups)+1)
	for _, g := range groups {
		titles = append(titles, g.title)
	}
	titles = append(titles, otherGroup)
	byGroup := map[string][]Doc{}
	for _, st := range table(&d, &r) {
		g := groupOf(st)
		byGroup[g] = append(byGroup[g], Doc{Env: st.env, Flag: st.flag, Default: defaultText(st, d), Doc: st.doc, Group: g})
	}
	for _, t := range titles {
		out = append(out, byGroup[t]...)
	}
	return out
}

func groupOf(st setting) string {
	name := st.flag
	if len(st.env) > 0 {
		name = st.env[0]
	}
	for _, g := range groups {
		if g.has(name) {
			return g.title
		}
	}
	return otherGroup
}

// defaultText is a setting's default as a user would write it. WINDOW_MODE's
// raw text is empty until set (so its alias can tell "unset" apart): its
// default is the parsed mode's name.
func defaultText(st setting, d Settings) string {
	if len(st.env) > 0 && st.env[0] == "WINDOW_MODE" {
		return d.WindowMode.String()
	}
	return st.v.String()
}

// Accepted lists the reference's settings read here apart from the table:
// an alias, and those accepted with no effect (Load reports them at start
// when set to a value that would matter).
func Accepted() [][2]string {
	out := [][2]string{{"USE_CALENDAR_MONTH_RATE_LIMIT", "the reference's calendar month switch: true is WINDOW_MODE=calendar, false epoch; conflicts with a different WINDOW_MODE"}}
	for _, u := range unsupported {
		out = append(out, [2]string{u.name, "no effect: " + u.reason})
	}
	return out
}

// WriteHelp prints --help: the description, then every setting by concern
// with its environment variables, flag, default and description, then the
// reference's settings that are accepted apart from the table.
func WriteHelp(w io.Writer) error {
	var b strings.Builder
	b.WriteString(Description)
	group := ""
	for _, d := range Docs() {
		if d.Group != group {
			group = d.Group
			fmt.Fprintf(&b, "\n%s:\n", group)
		}
		names := strings.Join(d.Env, ", ")
		if d.Flag != "" {
			if names != "" {
				names += ", "
			}
			names += "--" + d.Flag
		}
		fmt.Fprintf(&b, "  %s (default %s)\n", names, quoteEmpty(d.Default))
		wrap(&b, d.Doc, "      ", 78)
	}
	b.WriteString("\nReference settings read apart from the above:\n")
	for _, a := range Accepted() {
		fmt.Fprintf(&b, "  %s\n", a[0])
		wrap(&b, a[1], "      ", 78)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// wrap writes text as lines of at most width columns, each indented.
func wrap(b *strings.Builder, text, indent string, width int) {
	line := indent
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
}

// WriteMarkdown writes docs/settings.md from the table.
func WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString(markdownHead)
	group := ""
	for _, d := range Docs() {
		if d.Group != group {
			group = d.Group
			fmt.Fprintf(&b, "\n## %s\n\n| Environment | Flag | Default | Description |\n|---|---|---|---|\n", group)
		}
		env := make([]string, len(d.Env))
		for i, e := range d.Env {
			env[i] = "`" + e + "`"
		}
		flag := ""
		if d.Flag != "" {
			flag = "`--" + d.Flag + "`"
		}
		def := "*empty*"
		if d.Default != "" {
			def = "`" + d.Default + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", strings.Join(env, ", "), flag, def, cell(d.Doc))
	}
	b.WriteString("\n## Reference settings read apart from the table\n\n| Environment | Meaning here |\n|---|---|\n")
	for _, a := range Accepted() {
		fmt.Fprintf(&b, "| `%s` | %s |\n", a[0], cell(a[1]))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell escapes a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

const markdownHead = `<!-- Generated from internal/ratelimit/settings (table.go, doc.go) by
     go test ./internal/ratelimit/settings -run TestSettingsDoc -update
     Do not edit: TestSettingsDoc fails when this file and the table differ. -->
# ratelimit settings

Every setting of the rate limit service, by concern. Each is read once at start from its environment
variables (the reference's names, envoyproxy/ratelimit's, where it has one) and from its flag, which
wins; ` + "`ratelimit --help`" + ` prints the same list. Durations are Go durations (` + "`15ms`, `1h`" + `);
booleans are ` + "`true`/`false`" + `. Invalid values stop the start with an error naming the setting.

Metrics never carry a principal: see [monitoring.md](monitoring.md#metrics) for the series and their labels.
`
