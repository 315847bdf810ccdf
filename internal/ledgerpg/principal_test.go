package ledgerpg

import (
	"context"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/pgtest"
	rlkey "github.com/budgetgen/budgetgen/internal/ratelimit/key"
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

// randomValue is n bytes of hex that no compression shortens.
func randomValue(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n/2)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return hex.EncodeToString(b)
}

// TestSyncLongPrincipal: a principal's value may be up to key.MaxValueBytes
// (8 KiB) before the ledger names it by its digest, and a principal of
// several values is longer still, yet a B-tree index entry holds at most
// 2704 bytes (PostgreSQL: "index row size 4040 exceeds btree version 4
// maximum 2704 for index").
// Such a principal is copied and read back; before, its row failed the
// primary key's index, the sync's one transaction and every budget's copy
// with it.
func TestSyncLongPrincipal(t *testing.T) {
	pg := pgtest.Start(t)
	long := randomValue(1, rlkey.MaxValueBytes)
	syncPrincipals(t, pg, []string{
		randomValue(2, 4000), long, ledger.EncodePrincipal([]string{long, randomValue(3, rlkey.MaxValueBytes)}),
		ledger.EncodePrincipal1(ledger.DigestPart(long + "x")), long[:100] + "\x00" + long[:3000], "team-b",
	})
	ctx := context.Background()
	if got := pg.Psql(ctx, t, "SELECT count(*) FROM ledger_usage WHERE principal_name = '"+long+"'"); got != "1" {
		t.Fatalf("rows named by the 8 KiB value: %s", got)
	}
	// The per-team query of docs/measurement.md still reads an index.
	plan := pg.Psql(ctx, t, "SET enable_seqscan = off; EXPLAIN SELECT sum(tokens) FROM ledger_usage WHERE principal_name = 'team-b' AND window_kind = 'day'")
	if !strings.Contains(plan, "ledger_usage_principal") {
		t.Errorf("per-team query plan does not use the index:\n%s", plan)
	}
}

// TestMigrateKeysRowsSyncedBefore: rows synced before the principal key
// (migration 00003) get the key the sync computes, so the next sync
// updates them rather than adding a second row per principal.
func TestMigrateKeysRowsSyncedBefore(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	db, err := Open(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close(ctx) }()
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDB(*db.cfg)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub, goose.WithTableName(VersionTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 10, 20, 12, 0, 0, 0, time.UTC)
	principals := []string{"team-a", "ünï😀", ledger.EncodePrincipal([]string{"a,b", `c\d`})}
	for _, p := range principals {
		pg.Psql(ctx, t, fmt.Sprintf(`INSERT INTO ledger_usage (domain, rule, window_label, principal, principal_name, window_kind, window_start, window_end, budget, measure, units, synced_at)
			VALUES ('budget', 's/per-team', '20261020', %s, 'x', 'day', '2026-10-20T00:00:00Z', '2026-10-21T00:00:00Z', 'per-team', 'tokens', 7, now())`, quoteLiteral(p)))
	}
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mem := ledger.NewMemory("", func() time.Time { return now })
	rec, err := ledger.NewRecorder(ledger.Options{}, mem, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range principals {
		u := rec.Usage(ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}, p, now, 9)
		mem.HIncrBy(u.Key, u.Field, u.Tokens)
	}
	if _, err := db.Sync(ctx, mem, SyncOptions{Now: func() time.Time { return now }}); err != nil {
		t.Fatal(err)
	}
	if got := pg.Psql(ctx, t, "SELECT count(*) || ',' || sum(units) FROM ledger_usage"); got != "3,27" {
		t.Fatalf("rows after the upgrade and a sync (count,units): %s, want the 3 rows updated", got)
	}
}

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
