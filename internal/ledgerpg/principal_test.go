package ledgerpg

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/pgtest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// syncPrincipals writes one day of usage per principal (an encoded field,
// ledger.EncodePrincipal) under one budget,
// and one row of another budget, into a fresh Valkey; syncs it into pg
// twice; and checks that PostgreSQL reads back what Valkey holds, the
// second sync changing nothing.
func syncPrincipals(t *testing.T, pg *pgtest.Server, principals []string) *DB {
	t.Helper()
	vk := valkeytest.Start(t, valkeytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := (ledger.DayOf(time.Now()) + 1).Start().Add(13 * time.Hour)
	lv := ledger.NewValkey(c, "")
	rec, err := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	team := ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}
	w := ledger.WindowAt(ledger.PeriodDay, now, nil)
	us := []ledger.Usage{rec.UsageIn(ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/other"}, "team-a", w, 1)}
	for i, p := range principals {
		us = append(us, rec.UsageIn(team, p, w, uint64(10+i)))
		rec.DeniedIn(team, w, ledger.Denial{Principal: p, Shadow: true})
	}
	if err := lv.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	db := openDB(t, pg)
	for i, changed := range []int64{int64(2 + len(principals) + 1), 0} {
		if st, err := db.Sync(ctx, lv, SyncOptions{}); err != nil || st.Changed != changed {
			t.Fatalf("sync %d: %+v %v, want %d rows changed", i+1, st, err, changed)
		}
	}
	want, err := ledger.ReadAll(ctx, lv, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ledger.ReadAll(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("from PostgreSQL:\n%+v\nfrom Valkey:\n%+v", got, want)
	}
	return db
}

// TestSyncPrincipalWithNUL: U+0000 is valid UTF-8, so a request may send it
// in a principal's value (decide.Validate), but PostgreSQL's text refuses it.
// Such a principal is still copied, and read back as Valkey holds it;
// before, its row failed the sync's one transaction, and every budget's copy
// with it, at every run until the retention had lost them all.
func TestSyncPrincipalWithNUL(t *testing.T) {
	pg := pgtest.Start(t)
	syncPrincipals(t, pg, []string{
		"a\x00b", ledger.EncodePrincipal1("a\\0b"), ledger.EncodePrincipal([]string{"x\x00", "\\0"}), "\x00", "team-b",
	})
	ctx := context.Background()
	if got := pg.Psql(ctx, t, "SELECT count(*) FROM ledger_usage WHERE principal_name = 'a' || U&'\\FFFD' || 'b'"); got != "1" {
		t.Fatalf("principal_name of a\\x00b: %s rows, want it shown with U+FFFD", got)
	}
}

// FuzzStoredPrincipal: the stored form of every field EncodePrincipal
// writes holds no NUL and reads back as the field (so two fields never
// share a row), and a field without NUL is stored as itself.
func FuzzStoredPrincipal(f *testing.F) {
	for _, s := range []string{"a\x00b", `a\0b`, "\x00,\\0", `\e`, "x\x00\\"} {
		f.Add(s, "\x00")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, field := range []string{ledger.EncodePrincipal1(a), ledger.EncodePrincipal([]string{a, b})} {
			stored := storedPrincipal(field)
			if strings.Contains(stored, "\x00") || fieldOf(stored) != field {
				t.Fatalf("field %q stored %q read back %q", field, stored, fieldOf(stored))
			}
			if !strings.Contains(field, "\x00") && stored != field {
				t.Fatalf("field %q without NUL stored as %q", field, stored)
			}
		}
	})
}
