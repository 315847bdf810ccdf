package export

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Format names for --format.
const (
	FormatFOCUS = "focus"
	FormatCSV   = "csv"
)

// Formats lists the format names, for the flag's help.
var Formats = []string{FormatFOCUS, FormatCSV}

// Writer writes rows in one format.
type Writer func(w io.Writer, rows []Row, meta Meta) error

// Meta is what a FOCUS file says of its origin.
type Meta struct {
	// Provider names the provider, publisher and invoice issuer: the
	// platform that runs the gateways. Default "budgetgen".
	Provider string
}

// WriterFor returns the writer of a format, or an error naming the known
// ones (an unknown format never falls back to another).
func WriterFor(format string) (Writer, error) {
	switch format {
	case FormatFOCUS:
		return WriteFOCUS, nil
	case FormatCSV:
		return WriteCSV, nil
	}
	return nil, fmt.Errorf("unknown format %q (known: %s)", format, strings.Join(Formats, ", "))
}

// FOCUSColumns are the columns of the FOCUS file, in order: every column the
// FOCUS 1.2 specification makes Mandatory, the Conditional and Recommended
// ones a token charge has (ChargeFrequency, ConsumedQuantity, ConsumedUnit,
// ServiceSubcategory, Tags), then custom columns (x_ prefix, as the
// specification's custom columns require).
var FOCUSColumns = []string{
	"BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart",
	"ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
	"ConsumedQuantity", "ConsumedUnit", "ContractedCost", "EffectiveCost", "InvoiceIssuerName", "ListCost",
	"PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
	"ServiceSubcategory", "Tags",
	"x_Budget", "x_Principal", "x_WouldBe429s", "x_Denied429s", "x_ReservationDenials",
}

// focusTime is FOCUS's date/time format: UTC, 'YYYY-MM-DDTHH:mm:ssZ'.
const focusTime = "2006-01-02T15:04:05Z"

// WriteFOCUS writes a FOCUS 1.2 cost-and-usage CSV: a charge per row, of
// category Usage, usage-based; tokens are the consumed (and pricing)
// quantity in Tokens; a budget with a money cap but no token cap consumes
// its cost, in its currency. Costs are the spec's prices as AI Gateway
// computed them (0 without a money cap): billed, effective, list and
// contracted alike, as no discount applies. The billing period is the
// calendar month (in the service's zone) the charge period starts in; the
// billing account is the budget set; the budget and principal are tags.
func WriteFOCUS(w io.Writer, rows []Row, meta Meta) error {
	if meta.Provider == "" {
		meta.Provider = "budgetgen"
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(FOCUSColumns); err != nil {
		return err
	}
	for _, r := range rows {
		if err := cw.Write(focusRecord(r, meta)); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func focusRecord(r Row, meta Meta) []string {
	cost := money(r.Cost)
	qty, unit := strconv.FormatUint(r.Tokens, 10), "Tokens"
	if !r.HasTokens {
		qty, unit = cost, r.Currency
	}
	tags, _ := json.Marshal(map[string]string{ // map keys marshal sorted; strings cannot fail
		"budgetgen/budget-set": r.BudgetSet, "budgetgen/budget": r.Budget, "budgetgen/principal": r.Principal,
	})
	desc := fmt.Sprintf("LLM tokens through budget %s by %s", r.Budget, orShared(r.Principal))
	return []string{
		cost, r.BudgetSet, r.BudgetSet, r.Currency, r.BillingEnd.Format(focusTime), r.BillingStart.Format(focusTime),
		"Usage", "", desc, "Usage-Based", r.End.Format(focusTime), r.Start.Format(focusTime),
		qty, unit, cost, cost, meta.Provider, cost,
		qty, unit, meta.Provider, meta.Provider, "AI and Machine Learning", "LLM inference through " + meta.Provider,
		"Generative AI", string(tags),
		r.Budget, r.Principal, strconv.FormatUint(r.Denials.Shadow, 10), strconv.FormatUint(r.Denials.Enforce, 10), strconv.FormatUint(r.Denials.Reserve, 10),
	}
}

func orShared(p string) string {
	if p == "" {
		return "the shared bucket"
	}
	return p
}

// money writes 1/10,000 units as a decimal of the currency: 123456 -> 12.3456.
func money(v uint64) string { return fmt.Sprintf("%d.%04d", v/10000, v%10000) }

// cell keeps a value a spreadsheet would run as a formula (a leading =, +,
// -, @, tab or carriage return: principals come from request identities)
// text, by a leading apostrophe (OWASP's CSV injection advice).
func cell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// CSVColumns are the plain CSV's columns.
var CSVColumns = []string{"period_start", "period_end", "budget_set", "budget", "principal", "tokens", "cost", "currency", "would_be_429s", "denied_429s", "reservation_denials"}

// WriteCSV writes one plain row per principal, budget and charge period, for
// spreadsheets; tokens or cost is empty when the budget has no such cap.
func WriteCSV(w io.Writer, rows []Row, _ Meta) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVColumns); err != nil {
		return err
	}
	for _, r := range rows {
		tokens, cost := "", ""
		if r.HasTokens {
			tokens = strconv.FormatUint(r.Tokens, 10)
		}
		if r.HasCost {
			cost = money(r.Cost)
		}
		rec := []string{r.Start.Format(focusTime), r.End.Format(focusTime), r.BudgetSet, r.Budget, cell(r.Principal), tokens, cost, r.Currency,
			strconv.FormatUint(r.Denials.Shadow, 10), strconv.FormatUint(r.Denials.Enforce, 10), strconv.FormatUint(r.Denials.Reserve, 10)}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
