package report

import (
	"github.com/budgetgen/budgetgen/internal/ledger"
)

// daily is a budget's usage per day of the report, for the per-day chart:
// tokens from its day cap's rows (else its hour cap's, summed per day), and
// money from its day or hour money cap the same way. Nil when the budget has
// no day or hour cap with data.
func daily(a *budgetAcc, p plan, o Options) []DailyTotal {
	days := append([]ledger.Window(nil), p.days...)
	if o.IncludeToday {
		days = append(days, p.today)
	}
	out := make([]DailyTotal, len(days))
	index := map[ledger.Day]int{}
	// Partial: today so far, or a day before the first full shadow day, as
	// the caps' windows mark it.
	since := measuredSince(a.info.ShadowSince, p.loc)
	for i, d := range days {
		out[i] = DailyTotal{Date: d.String(), Partial: d == p.today || p.beforeShadow(d, since)}
		index[d.Day] = i
	}
	any := false
	if per, ok := dailySource(a, MeasureTokens); ok {
		any = true
		dailyTokens(a, p, per, index, out)
	}
	if per, ok := dailySource(a, MeasureCost); ok {
		any = true
		k := CapKey{per, MeasureCost}
		cur := a.info.Caps[k].Currency
		if cur == "" {
			cur = overrideCurrency(a.info, k)
		}
		for _, row := range a.caps[k] {
			i, ok := index[dayOf(row.d.Window, p)]
			if !ok {
				continue
			}
			out[i].Currency = cur
			for _, used := range row.d.Usage {
				out[i].Money += used * max(row.info.Scale, 1)
			}
		}
	}
	if !any {
		return nil
	}
	return out
}

// dailySource is the period whose rows give a measure per day: day, else hour.
func dailySource(a *budgetAcc, m string) (ledger.Period, bool) {
	for _, per := range []ledger.Period{ledger.PeriodDay, ledger.PeriodHour} {
		if len(a.caps[CapKey{per, m}]) > 0 {
			return per, true
		}
	}
	return 0, false
}

func dayOf(w ledger.Window, p plan) ledger.Day {
	return ledger.WindowAt(ledger.PeriodDay, w.Start(p.loc), p.loc).Day
}

// dailyTokens fills the token columns from the rows of period per: a
// principal is over on a day when one of its windows that day (the day, or
// an hour) went above its cap.
func dailyTokens(a *budgetAcc, p plan, per ledger.Period, index map[ledger.Day]int, out []DailyTotal) {
	k := CapKey{per, MeasureTokens}
	if per == ledger.PeriodDay {
		for i := range out {
			out[i].Cap = a.info.Caps[k].Cap
		}
	}
	type pw struct {
		name string
		w    ledger.Window
	}
	sums := make([]map[pw]uint64, len(out))
	for i := range out {
		sums[i] = map[pw]uint64{}
	}
	for _, row := range a.caps[k] {
		i, ok := index[dayOf(row.d.Window, p)]
		if !ok {
			continue
		}
		out[i].Would429 += row.d.Denials.Shadow
		for field, used := range row.d.Usage {
			name := ledger.PrincipalName(field)
			if row.info.Principal != "" {
				name = row.info.Principal
			}
			v := used * max(row.info.Scale, 1)
			out[i].Tokens += v
			sums[i][pw{name, row.d.Window}] += v
		}
	}
	for i := range out {
		perDay, over := map[string]uint64{}, map[string]bool{}
		for key, v := range sums[i] {
			perDay[key.name] += v
			capv := a.info.Caps[k].Cap
			if caps, ok := a.info.Overrides[key.name]; ok {
				capv = caps[k].Cap
			}
			if capv > 0 && v > capv {
				over[key.name] = true
			}
		}
		for _, v := range perDay {
			out[i].MaxPrincipal = max(out[i].MaxPrincipal, v)
		}
		out[i].PrincipalsOver = len(over)
	}
}
