package export

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/report"
)

// specColumn is one column of the FOCUS specification.
type specColumn struct {
	id, level, dataType string
	nullable            bool
}

// focusSpec reads testdata/focus-v1.2-columns.tsv: the column list of FOCUS
// 1.2 (FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, tag v1.2,
// specification/columns/*.md, each column's Content constraints).
func focusSpec(t *testing.T) map[string]specColumn {
	t.Helper()
	f, err := os.Open("testdata/focus-v1.2-columns.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]specColumn{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "ColumnId\t") {
			continue
		}
		p := strings.Split(line, "\t")
		if len(p) != 4 {
			t.Fatalf("bad line %q", line)
		}
		out[p[0]] = specColumn{id: p[0], level: p[1], nullable: p[2] == "True", dataType: p[3]}
	}
	if len(out) != 57 {
		t.Fatalf("%d columns in the FOCUS 1.2 list, want 57", len(out))
	}
	return out
}

var (
	paris, _ = time.LoadLocation("Europe/Paris")
	budget   = func(rule string) ledger.RuleID { return ledger.RuleID{Domain: ledger.BudgetDomain, Rule: rule} }
)

// fixture: October 2026 in Paris. per-team counts the same tokens in hour,
// day and month windows, and money per month; the fleet is a shared bucket;
// big has a kilotoken month cap only.
func fixture() []ledger.Data {
	d1 := ledger.WindowAt(ledger.PeriodDay, time.Date(2026, 10, 5, 12, 0, 0, 0, paris), paris)
	d2 := d1.Next(paris)
	h := ledger.WindowAt(ledger.PeriodHour, time.Date(2026, 10, 5, 12, 0, 0, 0, paris), paris)
	oct := ledger.WindowAt(ledger.PeriodMonth, time.Date(2026, 10, 5, 12, 0, 0, 0, paris), paris)
	return []ledger.Data{
		{Rule: budget("acme/per-team"), Window: d1, Usage: map[string]uint64{"team-a": 700, "=cmd": 5}, PrincipalDenials: map[string]ledger.Denials{"team-a": {Shadow: 2, Reserve: 1}}},
		{Rule: budget("acme/per-team"), Window: d2, Usage: map[string]uint64{"team-a": 300}},
		{Rule: budget("acme/per-team"), Window: h, Usage: map[string]uint64{"team-a": 700}},
		{Rule: budget("acme/per-team"), Window: oct, Usage: map[string]uint64{"team-a": 1000, "=cmd": 5}},
		{Rule: budget("acme/per-team#cost"), Window: oct, Usage: map[string]uint64{"team-a": 123_456}},
		{Rule: budget("acme/fleet"), Window: d1, Usage: map[string]uint64{"": 9_000}},
		{Rule: budget("acme/big#ktokens"), Window: oct, Usage: map[string]uint64{"b": 6_000_000}},
	}
}

func build(t *testing.T, period string) []Row {
	t.Helper()
	rows, err := Build(fixture(), report.Mapping{}, Options{
		From: time.Date(2026, 10, 1, 0, 0, 0, 0, paris), To: time.Date(2026, 11, 1, 0, 0, 0, 0, paris),
		Period: period, Location: paris, Currency: "EUR",
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// Each budget's tokens are counted once, from one window length; money and
// kilotokens in their units; periods in UTC.
func TestBuildChargesOnce(t *testing.T) {
	got := map[string]Row{}
	for _, r := range build(t, PeriodDay) {
		got[r.Start.Format(time.RFC3339)+" "+r.Budget+" "+r.Principal] = r
	}
	// Oct 5 in Paris starts 2026-10-04T22:00Z: the day rows, not day + hour + month.
	if r := got["2026-10-04T22:00:00Z per-team team-a"]; r.Tokens != 700 || !r.HasTokens || r.HasCost || r.Denials != (ledger.Denials{Shadow: 2, Reserve: 1}) || !r.End.Equal(time.Date(2026, 10, 5, 22, 0, 0, 0, time.UTC)) {
		t.Errorf("per-team Oct 5: %+v", r)
	}
	// Money per month only: charged per month window; kilotokens in tokens.
	if r := got["2026-09-30T22:00:00Z per-team team-a"]; r.Cost != 123_456 || !r.HasCost || r.HasTokens {
		t.Errorf("per-team money: %+v", r)
	}
	if r := got["2026-09-30T22:00:00Z big b"]; r.Tokens != 6_000_000_000 || r.BudgetSet != "acme" {
		t.Errorf("big: %+v", r)
	}
	if r := got["2026-10-04T22:00:00Z fleet "]; r.Tokens != 9_000 {
		t.Errorf("fleet: %+v", r)
	}
	if len(got) != 6 {
		t.Errorf("%d rows: %v", len(got), got)
	}
	// By month: the month windows.
	var month []Row
	for _, r := range build(t, PeriodMonth) {
		if r.Budget == "per-team" && r.Principal == "team-a" {
			month = append(month, r)
		}
	}
	if len(month) != 1 || month[0].Tokens != 1000 || month[0].Cost != 123_456 {
		t.Errorf("per-team by month: %+v", month)
	}
}

var (
	decimalRE = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)
	// ServiceCategory, ChargeCategory and ChargeFrequency allowed values, FOCUS 1.2
	// specification/columns/{servicecategory,chargecategory,chargefrequency}.md.
	serviceCategories = []string{"AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases", "Developer Tools",
		"Multicloud", "Identity", "Integration", "Internet of Things", "Management and Governance", "Media", "Migration", "Mobile",
		"Networking", "Security", "Storage", "Web", "Other"}
	chargeCategories  = []string{"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
	chargeFrequencies = []string{"One-Time", "Recurring", "Usage-Based"}
)

// TestFOCUSColumnsMeetTheSpec checks the FOCUS file against the
// specification's column list: every Mandatory column present, no column
// outside the specification but x_ custom ones, every value of its data type
// (Decimal, UTC Date/Time, JSON key-value objects), no null where the column
// allows none, allowed values where the specification lists them.
func TestFOCUSColumnsMeetTheSpec(t *testing.T) {
	spec := focusSpec(t)
	for id, c := range spec {
		if c.level == "Mandatory" && !slices.Contains(FOCUSColumns, id) {
			t.Errorf("mandatory column %s missing", id)
		}
	}
	for _, id := range FOCUSColumns {
		if _, ok := spec[id]; !ok && !strings.HasPrefix(id, "x_") {
			t.Errorf("column %s is neither in FOCUS 1.2 nor a custom x_ column", id)
		}
	}
	var buf bytes.Buffer
	if err := WriteFOCUS(&buf, build(t, PeriodDay), Meta{Provider: "ai-platform"}); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 7 || !slices.Equal(recs[0], FOCUSColumns) {
		t.Fatalf("%d records, header %v", len(recs), recs[0])
	}
	for _, rec := range recs[1:] {
		v := map[string]string{}
		for i, id := range FOCUSColumns {
			v[id] = rec[i]
			checkValue(t, spec[id], id, rec[i])
		}
		checkRules(t, v)
	}
}

func checkValue(t *testing.T, c specColumn, id, val string) {
	t.Helper()
	if strings.HasPrefix(id, "x_") {
		return
	}
	if val == "" {
		if !c.nullable {
			t.Errorf("%s is null; FOCUS 1.2 allows no null", id)
		}
		return
	}
	switch c.dataType {
	case "Decimal":
		if !decimalRE.MatchString(val) {
			t.Errorf("%s = %q is not a FOCUS decimal", id, val)
		}
	case "Date/Time":
		if tm, err := time.Parse("2006-01-02T15:04:05Z", val); err != nil || tm.Location() != time.UTC {
			t.Errorf("%s = %q is not a UTC 'YYYY-MM-DDTHH:mm:ssZ' date/time", id, val)
		}
	case "JSON":
		var obj map[string]any
		if err := json.Unmarshal([]byte(val), &obj); err != nil {
			t.Errorf("%s = %q is not a JSON object: %v", id, val, err)
		}
		for k, x := range obj {
			switch x.(type) {
			case string, float64, bool, nil:
			default:
				t.Errorf("%s: key %s holds a %T, FOCUS key-value values are scalars", id, k, x)
			}
		}
	}
}

// checkRules: the conditional requirements a usage row must meet.
func checkRules(t *testing.T, v map[string]string) {
	t.Helper()
	if !slices.Contains(serviceCategories, v["ServiceCategory"]) || !slices.Contains(chargeCategories, v["ChargeCategory"]) || !slices.Contains(chargeFrequencies, v["ChargeFrequency"]) {
		t.Errorf("values outside the allowed ones: %v", v)
	}
	if v["ChargeCategory"] == "Usage" && (v["ConsumedQuantity"] == "" || v["ConsumedUnit"] == "") {
		t.Errorf("a usage charge without consumed quantity: %v", v)
	}
	if (v["PricingQuantity"] == "") != (v["PricingUnit"] == "") || !regexp.MustCompile(`^[A-Z]{3}$`).MatchString(v["BillingCurrency"]) {
		t.Errorf("pricing or currency: %v", v)
	}
	if v["ChargePeriodStart"] < v["BillingPeriodStart"] || v["ChargePeriodEnd"] <= v["ChargePeriodStart"] || v["ChargePeriodStart"] >= v["BillingPeriodEnd"] {
		t.Errorf("charge period outside its billing period: %v", v)
	}
	// A day or month charge lies within its month (a week-only budget's
	// charge may end in the next one: there is none here).
	if v["ChargePeriodEnd"] > v["BillingPeriodEnd"] {
		t.Errorf("a day or month charge ends after its billing period: %v", v)
	}
	var tags map[string]string
	if json.Unmarshal([]byte(v["Tags"]), &tags) != nil || tags["budgetgen/budget"] != v["x_Budget"] || tags["budgetgen/principal"] != v["x_Principal"] {
		t.Errorf("tags %s", v["Tags"])
	}
}

// The plain CSV keeps a principal a spreadsheet would run as a formula text.
func TestCSV(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteCSV(&buf, build(t, PeriodDay), Meta{}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"period_start,period_end,budget_set,budget,principal,tokens,cost,currency,would_be_429s,denied_429s,reservation_denials\n",
		"2026-10-04T22:00:00Z,2026-10-05T22:00:00Z,acme,per-team,'=cmd,5,,EUR,0,0,0\n",
		"2026-09-30T22:00:00Z,2026-10-31T23:00:00Z,acme,per-team,team-a,,12.3456,EUR,0,0,0\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if _, err := WriterFor("parquet"); err == nil {
		t.Error("unknown format accepted")
	}
}
