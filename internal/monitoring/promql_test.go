package monitoring

import (
	"regexp"
	"strings"
	"testing"
)

var promqlCases = []struct {
	expr string
	want string // names, comma-separated; "error" for an error
}{
	{`up`, "up"},
	{`rate(ratelimit_requests_total{code="ok"}[5m])`, "ratelimit_requests_total"},
	{`sum by (budget, gateway) (rate(a_total{budget=~"$budget", gateway=~"$gateway"}[$__rate_interval]))`, "a_total"},
	{`sum(rate(a[5m])) by (le) / ignoring(code) group_left(x) sum without (op) (b)`, "a,b"},
	{`histogram_quantile(0.99, sum by (le, op) (rate(x_bucket[1m])))`, "x_bucket"},
	{`max by (budget) (u) >= 0.8 and on (budget) v offset 1h unless w`, "u,v,w"},
	{`a > bool 1 or vector(0) or time() > Inf or NaN`, "a"},
	{`label_replace(m, "dst", "$1 and by (x)", "src", "(.*)")`, "m"},
	{`{__name__="by_name", job="x"} + {__name__=~"re.*"}`, "by_name"},
	{`increase(c_total[10m:1m]) + 1e-3 + 0x1f + .5 + 1h30m`, "c_total"},
	{"a[5m] @ start() + `raw`", "a"},
	{`topk(5, x) + count_values("lbl", y) + abs(-z)`, "x,y,z"},
	{`${datasource}_not_a_metric + ns:rule:ratio`, "ns:rule:ratio"},
	{`sum(a{b="}"}`, "error"},
	{`rate(a[5m)`, "error"},
	{`a{b="c`, "error"},
	{`a}`, "error"},
}

// TestMetricNames: names are told apart from functions, keywords, labels,
// durations, strings and Grafana variables; malformed input is an error.
func TestMetricNames(t *testing.T) {
	for _, c := range promqlCases {
		got, err := MetricNames(c.expr)
		if c.want == "error" {
			if err == nil {
				t.Errorf("%s: no error (got %v)", c.expr, got)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != c.want {
			t.Errorf("%s: %v %v, want %s", c.expr, got, err, c.want)
		}
	}
}

var metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// FuzzMetricNames: any input ends (no panic, no endless loop) and every
// name returned is a valid metric name or a __name__ matcher's value.
func FuzzMetricNames(f *testing.F) {
	for _, c := range promqlCases {
		f.Add(c.expr)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		names, err := MetricNames(expr)
		if err != nil {
			return
		}
		for _, n := range names {
			if !metricName.MatchString(n) && !strings.Contains(expr, "__name__") {
				t.Fatalf("%q: %q is not a metric name", expr, n)
			}
		}
	})
}
