package assert

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
	"github.com/budgetgen/budgetgen/pkg/render"
)

func TestMetadataKeysMatchRender(t *testing.T) {
	if kiloTokenMetadataKey != render.KiloTokenMetadataKey || costMetadataKey != render.CostMetadataKey {
		t.Fatal("assert's metadata keys differ from render's")
	}
}

// TestRenderedWindowsAndMoneyPass: what render emits for week/month/hour
// windows, caps past uint32 and money passes BG003 and BG004; a month rule
// whose unit was edited to Day is caught.
func TestRenderedWindowsAndMoneyPass(t *testing.T) {
	for _, name := range []string{"windows", "money", "large_cap"} {
		data, err := os.ReadFile("../render/testdata/" + name + ".golden.yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			edit string
			want string
		}{{"", ""}, {"unit: Month", "BG004"}} {
			doc := string(data)
			if c.edit != "" {
				if !strings.Contains(doc, c.edit) {
					continue
				}
				doc = strings.Replace(doc, c.edit, "unit: Day", 1)
			}
			objs, err := manifest.Parse(name+".yaml", []byte(doc), manifest.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, rule := range []*Rule{ruleCost, ruleUnit} {
				var fs []Finding
				p := &Pass{Context: context.Background(), Index: NewIndex(objs), Options: &Options{}, rule: rule, out: &fs}
				if err := rule.Check(p); err != nil {
					t.Fatal(err)
				}
				for _, f := range fs {
					got = append(got, f.Rule+": "+f.Message)
				}
			}
			if c.want == "" && len(got) > 0 {
				t.Errorf("%s: findings on render's own output: %v", name, got)
			}
			if c.want != "" && (len(got) != 1 || !strings.Contains(got[0], "per month: use Month")) {
				t.Errorf("%s with %s edited: findings %v, want one BG004 naming the month", name, c.edit, got)
			}
		}
	}
}
