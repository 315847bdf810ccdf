package ledgerpg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/pgtest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

func openDB(t *testing.T, s *pgtest.Server) *DB {
	t.Helper()
	ctx := context.Background()
	db, err := Open(ctx, s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return db
}

// The schema comes from the embedded migrations, applied once however often
// Migrate runs, with the indexes per-team and per-month queries use.
func TestMigrate(t *testing.T) {
	s := pgtest.Start(t)
	db := openDB(t, s)
	ctx := context.Background()
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if v, err := db.Version(ctx); err != nil || v != 4 {
		t.Fatalf("version %d %v", v, err)
	}
	idx := s.Psql(ctx, t, "SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes WHERE tablename LIKE 'ledger_%'")
	for _, want := range []string{"ledger_usage_budget_window", "ledger_usage_principal", "ledger_usage_pkey", "ledger_usage_window", "ledger_windows_pkey"} {
		if !strings.Contains(idx, want) {
			t.Errorf("index %s missing: %s", want, idx)
		}
	}
	// The per-team query uses its index.
	plan := s.Psql(ctx, t, "SET enable_seqscan = off; EXPLAIN SELECT sum(tokens) FROM ledger_usage WHERE principal_name = 'team-a' AND window_kind = 'month' AND window_start >= '2026-01-01'")
	if !strings.Contains(plan, "ledger_usage_principal") {
		t.Errorf("per-team query plan does not use the index:\n%s", plan)
	}
}

func TestPasswordInDSNRefused(t *testing.T) {
	for _, dsn := range []string{"postgres://u:secret@127.0.0.1:1/db", "host=127.0.0.1 user=u password=secret", "postgres://u@127.0.0.1:1/db?password=secret",
		// pgx accepts each of these with the password in it.
		"host=127.0.0.1 user=u password = secret", "host=127.0.0.1 user=u password =secret", "host=127.0.0.1\tuser=u\tpassword\t=\tsecret",
		"host=127.0.0.1 application_name='a b\\' c' password=secret",
		"postgres://u:secret@[::1]:1,[::2]:1/db", "postgresql://u@127.0.0.1:1/db?sslmode=disable&pass%77ord=secret",
		// pgx refuses these, quoting them in its error: refused before.
		"postgres://u:sec ret@127.0.0.1:1/db"} {
		if _, err := Open(context.Background(), dsn); !errors.Is(err, ErrPasswordInDSN) {
			t.Errorf("%s: %v", dsn, err)
		}
	}
	for _, dsn := range []string{"host=127.0.0.1 user=u application_name='password=x'", "host=127.0.0.1 passfile=/p user=u", "postgres://u@127.0.0.1:1/db?passfile=/p"} {
		if hasPassword(dsn) {
			t.Errorf("%s: read as holding a password", dsn)
		}
	}
}

// fillValkey writes a ledger as the service would: budget buckets of every
// window (tokens, kilotokens, money, a shared group), with per-principal
// and unattributed denials, reservations, and a window with holds only (a
// check whose charge never came).
func fillValkey(t *testing.T, ctx context.Context, c valkey.Client, now time.Time) {
	t.Helper()
	lv := ledger.NewValkey(c, "")
	rec, err := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	b := func(rule string) ledger.RuleID { return ledger.RuleID{Domain: ledger.BudgetDomain, Rule: rule} }
	var us []ledger.Usage
	for _, p := range []ledger.Period{ledger.PeriodHour, ledger.PeriodDay, ledger.PeriodWeek, ledger.PeriodMonth} {
		w := ledger.WindowAt(p, now, nil)
		us = append(us, rec.UsageIn(b("s/per-team"), "team-a", w, 700), rec.UsageIn(b("s/per-team"), ledger.EncodePrincipal([]string{"team", "b"}), w, 50))
		rec.DeniedIn(b("s/per-team"), w, ledger.Denial{Principal: "team-a", Shadow: true})
		rec.DeniedIn(b("s/per-team"), w, ledger.Denial{Principal: "team-c", Shadow: true, Reserve: true}) // denied, never charged
	}
	mw := ledger.WindowAt(ledger.PeriodMonth, now, nil)
	us = append(us, rec.UsageIn(b("s/per-team#cost"), "team-a", mw, 123_456), rec.UsageIn(b("s/per-team#ktokens"), "team-a", mw, 6_000_000),
		rec.UsageIn(b("s/fleet@agents/agw"), "", ledger.WindowAt(ledger.PeriodDay, now, nil), 9_000))
	rec.Denied(b("s/fleet@agents/agw"), now, false) // a shared bucket: no principal
	rec.HoldsIn(b("s/per-team"), ledger.WindowAt(ledger.PeriodDay, now, nil), ledger.Holds{Count: 3, Held: 1_500, Expired: 500})
	rec.HoldsIn(b("s/per-team#cost"), mw, ledger.Holds{Count: 3, Held: 900})
	rec.HoldsIn(b("s/per-run"), ledger.WindowAt(ledger.PeriodDay, now, nil), ledger.Holds{Count: 1, Held: 50_000, Expired: 50_000})
	if err := lv.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSyncTwiceGivesTheSameRows(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Valkey expires on its own clock: a time in its future.
	now := (ledger.DayOf(time.Now()) + 1).Start().Add(13*time.Hour + 30*time.Minute)
	fillValkey(t, ctx, c, now)
	src := ledger.NewValkey(c, "")
	db := openDB(t, pg)
	clock := now
	opts := SyncOptions{Now: func() time.Time { return clock }}
	st, err := db.Sync(ctx, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	// 4 windows of per-team (3 principals each), the cost and kilotoken
	// months, the fleet's day, per-run's day with holds only (no principal).
	if st.Windows != 8 || st.Rows != 15 || st.Changed != 23 {
		t.Fatalf("first sync %+v", st)
	}
	const all = "SELECT domain, rule, window_label, principal, principal_name, window_kind, window_start, window_end, budget_set, budget, gateway, measure, units, tokens, cost, shadow_denials, enforce_denials, reserve_denials, synced_at FROM ledger_usage ORDER BY 1, 2, 3, 4"
	first := pg.Psql(ctx, t, all)
	clock = now.Add(time.Hour)
	const windows = "SELECT domain, rule, window_label, shadow_denials, enforce_denials, reserve_denials, holds, held_units, expired_units, synced_at FROM ledger_windows ORDER BY 1, 2, 3"
	firstWindows := pg.Psql(ctx, t, windows)
	if st, err := db.Sync(ctx, src, opts); err != nil || st.Changed != 0 || st.Windows != 8 {
		t.Fatalf("second sync changed %+v %v", st, err)
	}
	if again := pg.Psql(ctx, t, all); again != first {
		t.Fatalf("rows changed on the second sync:\n%s\n---\n%s", first, again)
	}
	if again := pg.Psql(ctx, t, windows); again != firstWindows {
		t.Fatalf("window rows changed on the second sync:\n%s\n---\n%s", firstWindows, again)
	}
	checkColumns(ctx, t, pg)
	// New usage is copied; a ledger that lost a key never lowers a row.
	lv := ledger.NewValkey(c, "")
	rec, _ := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	if err := lv.Add(ctx, rec.UsageIn(ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}, "team-a", ledger.WindowAt(ledger.PeriodDay, now, nil), 5)); err != nil {
		t.Fatal(err)
	}
	rec.HoldsIn(ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}, ledger.WindowAt(ledger.PeriodDay, now, nil), ledger.Holds{Count: 1, Held: 500})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// per-run's holds are lost from Valkey (a restart): the record stays.
	if err := c.Do(ctx, c.B().Del().Key(ledger.WindowStatsKey("", ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-run"}, ledger.WindowAt(ledger.PeriodDay, now, nil))).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Del().Key(ledger.WindowUsageKey("", ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team#cost"}, ledger.WindowAt(ledger.PeriodMonth, now, nil))).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if st, err := db.Sync(ctx, src, opts); err != nil || st.Changed != 2 {
		t.Fatalf("third sync %+v %v", st, err)
	}
	if got := pg.Psql(ctx, t, "SELECT holds || ',' || held_units || ',' || expired_units FROM ledger_windows WHERE rule = 's/per-team' AND window_kind = 'day'"); got != "4,2000,500" {
		t.Fatalf("day holds after more traffic: %s", got)
	}
	if got := pg.Psql(ctx, t, "SELECT holds || ',' || expired_units FROM ledger_windows WHERE rule = 's/per-run'"); got != "1,50000" {
		t.Fatalf("a lost key lowered the holds: %s", got)
	}
	if got := pg.Psql(ctx, t, "SELECT units FROM ledger_usage WHERE rule = 's/per-team' AND window_kind = 'day' AND principal = 'team-a'"); got != "705" {
		t.Fatalf("day usage after more traffic: %s", got)
	}
	if got := pg.Psql(ctx, t, "SELECT cost FROM ledger_usage WHERE rule = 's/per-team#cost'"); got != "12.3456" {
		t.Fatalf("a lost key lowered the record: %s", got)
	}
}

// Read back from PostgreSQL, the ledger is the one Valkey held.
func TestReadBackEqualsSource(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := (ledger.DayOf(time.Now()) + 1).Start().Add(13 * time.Hour)
	fillValkey(t, ctx, c, now)
	src := ledger.NewValkey(c, "")
	db := openDB(t, pg)
	if _, err := db.Sync(ctx, src, SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := ledger.ReadAll(ctx, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ledger.ReadAll(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 8 || !reflect.DeepEqual(got, want) {
		t.Fatalf("from PostgreSQL:\n%+v\nfrom Valkey:\n%+v", got, want)
	}
	some := []ledger.Window{ledger.WindowAt(ledger.PeriodMonth, now, nil)}
	if keys, err := db.Keys(ctx, some); err != nil || len(keys) != 3 {
		t.Fatalf("keys of the month: %v %v", keys, err)
	}
	if n := countHolds(got); n != (ledger.Holds{Count: 7, Held: 52_400, Expired: 50_500}) {
		t.Fatalf("holds read back %+v", n)
	}
	db.MaxPrincipals = 2
	if _, err := db.Read(ctx, ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}, ledger.WindowAt(ledger.PeriodDay, now, nil)); !errors.Is(err, ledger.ErrTooMany) {
		t.Fatalf("bound: %v", err)
	}
}

func countHolds(ds []ledger.Data) ledger.Holds {
	var h ledger.Holds
	for _, d := range ds {
		h.Add(d.Holds)
	}
	return h
}

// A database synced before reservations were measured upgrades in place: its
// rows stay, with no holds, and the next sync fills them.
func TestMigrateKeepsRowsOfTheFirstSchema(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	db, err := Open(ctx, s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close(ctx) }()
	legacyUp(ctx, t, db, 1) // the first schema was released under goose's default table
	s.Psql(ctx, t, `INSERT INTO ledger_windows (domain, rule, window_label, window_kind, window_start, window_end, budget, measure, reserve_denials, synced_at)
		VALUES ('budget', 's/per-run', '20261020', 'day', '2026-10-20T00:00:00Z', '2026-10-21T00:00:00Z', 'per-run', 'tokens', 2, now())`)
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := db.Version(ctx); err != nil || v != 4 {
		t.Fatalf("version %d %v", v, err)
	}
	if got := s.Psql(ctx, t, "SELECT reserve_denials || ',' || holds || ',' || held_units || ',' || expired_units FROM ledger_windows"); got != "2,0,0,0" {
		t.Fatalf("row after the upgrade: %s", got)
	}
	if got := s.Psql(ctx, t, "SELECT string_agg(version_id::text, ',' ORDER BY id) FROM "+VersionTable); got != "0,1,2,3,4" {
		t.Fatalf("%s after adopting version 1: %s", VersionTable, got)
	}
	w, _ := ledger.ParseWindowID("20261020")
	d, err := db.Read(ctx, ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-run"}, w)
	if err != nil || d.Denials.Reserve != 2 || !d.Holds.IsZero() {
		t.Fatalf("read after the upgrade: %+v %v", d, err)
	}
}

// checkColumns: what the columns say, in SQL: tokens, money, who, holds.
func checkColumns(ctx context.Context, t *testing.T, pg *pgtest.Server) {
	t.Helper()
	for q, want := range map[string]string{
		"SELECT tokens FROM ledger_usage WHERE rule = 's/per-team#ktokens'":                                                               "6000000000",
		"SELECT cost FROM ledger_usage WHERE rule = 's/per-team#cost'":                                                                    "12.3456",
		"SELECT budget || ',' || measure || ',' || gateway FROM ledger_windows WHERE rule = 's/fleet@agents/agw'":                         "fleet,tokens,agents/agw",
		"SELECT DISTINCT principal_name FROM ledger_usage WHERE principal = 'team,b'":                                                     "team, b",
		"SELECT count(*) FROM ledger_usage WHERE principal = 'team-c' AND units IS NULL AND reserve_denials = 1":                          "4",
		"SELECT enforce_denials FROM ledger_windows WHERE rule = 's/fleet@agents/agw'":                                                    "1",
		"SELECT sum(tokens) FROM ledger_usage WHERE budget = 'per-team' AND window_kind = 'month' AND measure = 'tokens'":                 "750",
		"SELECT holds || ',' || held_units || ',' || expired_units FROM ledger_windows WHERE rule = 's/per-team' AND window_kind = 'day'": "3,1500,500",
		"SELECT holds || ',' || held_units || ',' || expired_units FROM ledger_windows WHERE rule = 's/per-team#cost'":                    "3,900,0",
		"SELECT holds || ',' || expired_units FROM ledger_windows WHERE rule = 's/per-run'":                                               "1,50000",
		"SELECT count(*) FROM ledger_usage WHERE rule = 's/per-run'":                                                                      "0",
		"SELECT sum(holds) FROM ledger_windows WHERE rule = 's/per-team' AND window_kind <> 'day'":                                        "0",
	} {
		if got := pg.Psql(ctx, t, q); got != want {
			t.Errorf("%s = %q, want %q", q, got, want)
		}
	}
}

// refusing is a Reader that refuses one rule's windows as over its bound.
type refusing struct {
	ledger.Reader
	rule ledger.RuleID
}

func (r refusing) Read(ctx context.Context, rule ledger.RuleID, w ledger.Window) (ledger.Data, error) {
	if rule == r.rule {
		return ledger.Data{}, fmt.Errorf("hscan: %w: more than 2 principals", ledger.ErrTooMany)
	}
	return r.Reader.Read(ctx, rule, w)
}

// TestSyncSkipsAnOversizedWindow: a rule-window over the reader's principal
// bound is left out and named, and every other one is still copied: one
// oversized window must not stop the hourly copy of every budget.
func TestSyncSkipsAnOversizedWindow(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	now := time.Date(2026, 10, 20, 12, 0, 0, 0, time.UTC)
	mem := ledger.NewMemory("", func() time.Time { return now })
	rec, err := ledger.NewRecorder(ledger.Options{}, mem, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	big := ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-run"}
	small := ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}
	for _, u := range []ledger.Usage{rec.Usage(big, "run-1", now, 10), rec.Usage(big, "run-2", now, 10), rec.Usage(big, "run-3", now, 10), rec.Usage(small, "team-a", now, 7)} {
		mem.HIncrBy(u.Key, u.Field, u.Tokens)
	}
	db := openDB(t, pg)
	st, err := db.Sync(ctx, refusing{mem, big}, SyncOptions{Now: func() time.Time { return now }})
	if !errors.Is(err, ErrSkipped) || !strings.Contains(err.Error(), "s/per-run") {
		t.Fatalf("sync: %v, want ErrSkipped naming s/per-run", err)
	}
	if st.Windows != 1 || len(st.Skipped) != 1 {
		t.Fatalf("stats %+v, want 1 window copied and 1 skipped", st)
	}
	if got := pg.Psql(ctx, t, "SELECT rule || '=' || units FROM ledger_usage ORDER BY 1"); got != "s/per-team=7" {
		t.Fatalf("rows %q, want the other rule's row committed", got)
	}
}

// legacyUp migrates the ledger as releases before VersionTable did: under
// goose's default version table, up to version v.
func legacyUp(ctx context.Context, t *testing.T, db *DB, v int64) {
	t.Helper()
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDB(*db.cfg)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, v); err != nil {
		t.Fatal(err)
	}
}

// Another goose app in the ledger's schema: its versions 1-3 in goose's
// default table do not make the ledger's migrations look applied.
func TestMigrateBesideAnotherGooseApp(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	s.Psql(ctx, t, `CREATE TABLE goose_db_version (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
		INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true), (1, true), (2, true), (3, true)`)
	db := openDB(t, s)
	if v, err := db.Version(ctx); err != nil || v != 4 {
		t.Fatalf("version %d %v", v, err)
	}
	if got := s.Psql(ctx, t, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'ledger_windows'::regclass AND attname = 'holds'"); got != "1" {
		t.Fatalf("ledger_windows.holds: %s", got)
	}
	if got := s.Psql(ctx, t, "SELECT string_agg(version_id::text, ',' ORDER BY id) FROM goose_db_version"); got != "0,1,2,3" {
		t.Fatalf("the other app's versions changed: %s", got)
	}
}

// A ledger migrated in full under goose's default table is adopted: no
// migration runs again (the first would fail on its existing tables), however
// often Migrate runs. (TestMigrateKeepsRowsOfTheFirstSchema adopts one at
// version 1, which then gets the missing migration.)
func TestMigrateAdoptsTheDefaultTable(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	db, err := Open(ctx, s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close(ctx) }()
	legacyUp(ctx, t, db, 2)
	for range 2 {
		if err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := db.Version(ctx); err != nil || v != 4 {
		t.Fatalf("version %d %v", v, err)
	}
	if got := s.Psql(ctx, t, "SELECT string_agg(version_id::text, ',' ORDER BY id) FROM "+VersionTable); got != "0,1,2,3,4" {
		t.Fatalf("%s: %s", VersionTable, got)
	}
}

// TestMigrateRefusesANewerSchema: a schema a newer budgetgen migrated is
// refused, named, and left as it is: goose alone applies nothing and says
// nothing when the database is ahead, and this sync would then write rows
// the newer schema may read otherwise.
func TestMigrateRefusesANewerSchema(t *testing.T) {
	s := pgtest.Start(t)
	db := openDB(t, s)
	ctx := context.Background()
	s.Psql(ctx, t, "INSERT INTO "+VersionTable+" (version_id, is_applied) VALUES (99, true)")
	err := db.Migrate(ctx)
	if !errors.Is(err, ErrSchemaNewer) || !strings.Contains(err.Error(), "version 99") || !strings.Contains(err.Error(), "version 4") {
		t.Fatalf("migrate a schema at version 99: %v, want ErrSchemaNewer naming both versions", err)
	}
	if got := s.Psql(ctx, t, "SELECT string_agg(version_id::text, ',' ORDER BY id) FROM "+VersionTable); got != "0,1,2,3,4,99" {
		t.Fatalf("%s: %s", VersionTable, got)
	}
}

// failingReader lists a rule-window and fails reading it.
type failingReader struct{ ledger.Reader }

func (failingReader) Read(context.Context, ledger.RuleID, ledger.Window) (ledger.Data, error) {
	return ledger.Data{}, errors.New("connection reset")
}

// TestSyncReportsAGap: each sync from a source records its clock in its
// transaction; one whose previous sync is older than the retention commits
// what the source holds and returns ErrGap naming the windows that may lack
// usage. A sync that rolls back records nothing, and sources are apart.
func TestSyncReportsAGap(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	db := openDB(t, pg)
	t0 := time.Date(2026, 10, 1, 10, 17, 0, 0, time.UTC)
	clock := t0
	mem := ledger.NewMemory("", func() time.Time { return clock })
	rec, err := ledger.NewRecorder(ledger.Options{}, mem, func() time.Time { return clock })
	if err != nil {
		t.Fatal(err)
	}
	sync := func(at time.Time, src ledger.Reader, source string) (SyncStats, error) {
		clock = at
		u := rec.Usage(ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-team"}, "team-a", at, 5)
		mem.HIncrBy(u.Key, u.Field, u.Tokens)
		return db.Sync(ctx, src, SyncOptions{Now: func() time.Time { return at }, Source: source})
	}
	if st, err := sync(t0, mem, "vk"); err != nil || !st.Previous.IsZero() {
		t.Fatalf("first sync: %+v %v", st, err)
	}
	if st, err := sync(t0.Add(10*24*time.Hour), mem, "vk"); err != nil || !st.Previous.Equal(t0) {
		t.Fatalf("sync 10 days later: %+v %v", st, err)
	}
	if _, err := sync(t0.Add(25*24*time.Hour), failingReader{mem}, "vk"); err == nil || errors.Is(err, ErrGap) {
		t.Fatalf("a sync that rolls back: %v", err)
	}
	late := t0.Add(20*24*time.Hour + time.Hour)
	st, err := sync(late, mem, "vk")
	if !errors.Is(err, ErrGap) || !st.Previous.Equal(t0.Add(10*24*time.Hour)) ||
		!strings.Contains(err.Error(), "windows that ended between 2026-10-11T10:17:00Z and 2026-10-11T11:17:00Z expired") {
		t.Fatalf("sync after 10 days and an hour: %+v %v, want ErrGap", st, err)
	}
	if got := pg.Psql(ctx, t, "SELECT count(*) FROM ledger_usage WHERE window_label = '"+ledger.DayWindow(ledger.DayOf(late)).ID()+"'"); got != "1" {
		t.Fatalf("the day of the late sync was not committed: %s rows", got)
	}
	if _, err := sync(late.Add(time.Hour), mem, "vk"); err != nil {
		t.Fatalf("the next sync: %v", err)
	}
	if st, err := sync(late.Add(time.Hour), mem, "other"); err != nil || !st.Previous.IsZero() {
		t.Fatalf("another source's first sync: %+v %v", st, err)
	}
	if got := pg.Psql(ctx, t, "SELECT string_agg(source || '=' || to_char(synced_at AT TIME ZONE 'UTC', 'MM-DD\"T\"HH24'), ',' ORDER BY source) FROM ledger_syncs"); got != "other=10-21T12,vk=10-21T12" {
		t.Fatalf("ledger_syncs: %s", got)
	}
}

// TestSyncWithoutNamesKeepsTheBudget: a sync that cannot name a rule (a
// manual run without --spec beside the CronJob that has it, for a service
// without a budget map) leaves the budget and measure an earlier sync gave
// its rows: it renamed them after the Envoy Gateway rule and counted a money
// budget's units (1/10,000 of the currency) as tokens, for good once the
// window left Valkey. A sync that names the rule still renames it.
func TestSyncWithoutNamesKeepsTheBudget(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	db := openDB(t, pg)
	now := time.Date(2026, 10, 20, 12, 0, 0, 0, time.UTC)
	mem := ledger.NewMemory("", func() time.Time { return now })
	rec, err := ledger.NewRecorder(ledger.Options{}, mem, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	rule := ledger.RuleID{Domain: "ai-gateway/ai-budgets", Rule: "ai-gateway/ai-budgets/rule/1"}
	u := rec.Usage(rule, "team-a", now, 123_456)
	mem.HIncrBy(u.Key, u.Field, u.Tokens)
	rec.Denied(rule, now, true)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	named := func(budget string) Namer {
		return func(r ledger.RuleID) Names {
			return Names{BudgetSet: "ai-budgets", Budget: budget, Measure: MeasureCost}
		}
	}
	const q = "SELECT budget_set || ',' || budget || ',' || measure || ',' || coalesce(cost::text, '-') || ',' || coalesce(tokens::text, '-') FROM ledger_usage UNION ALL SELECT budget_set || ',' || budget || ',' || measure FROM ledger_windows"
	for _, step := range []struct {
		names Namer
		want  string
	}{
		{named("spend"), "ai-budgets,spend,cost,12.3456,-\nai-budgets,spend,cost"},
		{nil, "ai-budgets,spend,cost,12.3456,-\nai-budgets,spend,cost"},
		{named("team-spend"), "ai-budgets,team-spend,cost,12.3456,-\nai-budgets,team-spend,cost"},
	} {
		if _, err := db.Sync(ctx, mem, SyncOptions{Names: step.names, Now: func() time.Time { return now }}); err != nil {
			t.Fatal(err)
		}
		if got := pg.Psql(ctx, t, q); got != step.want {
			t.Fatalf("rows %q, want %q", got, step.want)
		}
	}
}

// TestOpenSaysAuthenticationFailed: a wrong password is told apart from an
// unreachable server (ErrAuthFailed), and the password is not in the error.
func TestOpenSaysAuthenticationFailed(t *testing.T) {
	s := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.AddPasswordRole(ctx, t, "ledgerapp", "right-pw")
	dsn := fmt.Sprintf("postgres://ledgerapp@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	for _, pw := range []string{"Wr0ngSecret", ""} {
		t.Setenv("PGPASSWORD", pw)
		_, err := Open(ctx, dsn)
		if !errors.Is(err, ErrAuthFailed) || strings.Contains(err.Error(), "unreachable") || (pw != "" && strings.Contains(err.Error(), pw)) {
			t.Errorf("PGPASSWORD %q: %v", pw, err)
		}
	}
	// 28000: a role that does not exist (the cluster trusts every other).
	if _, err := Open(ctx, fmt.Sprintf("postgres://nosuchrole@127.0.0.1:%d/postgres?sslmode=disable", s.Port)); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("no such role: %v", err)
	}
	t.Setenv("PGPASSWORD", "right-pw")
	db, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("the right password: %v", err)
	}
	_ = db.Close(ctx)
	if _, err := Open(ctx, "postgres://ledgerapp@127.0.0.1:1/postgres?sslmode=disable"); err == nil || errors.Is(err, ErrAuthFailed) || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("no server: %v", err)
	}
}

// TestSyncCopiesWhatABoundedScanFinds: a ledger with more keys than the
// reader's scan bound (ledger.Valkey.MaxKeys; 5M by default) no longer
// aborts the whole sync: the rule-windows the bounded scan found commit,
// and the error (ErrKeysTruncated) says the scan stopped on which node,
// at which bound, and that the rest was not copied.
func TestSyncCopiesWhatABoundedScanFinds(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lv := ledger.NewValkey(c, "")
	w := ledger.DayWindow(ledger.DayOf(time.Now()) + 1)
	var us []ledger.Usage
	for i := 0; i < 50; i++ {
		r := ledger.RuleID{Domain: ledger.BudgetDomain, Rule: fmt.Sprintf("s/b%02d", i)}
		us = append(us, ledger.Usage{Key: ledger.WindowUsageKey("", r, w), Field: "p", Tokens: 5})
	}
	if err := lv.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	lv.MaxKeys = 10
	db := openDB(t, pg)
	st, err := db.Sync(ctx, lv, SyncOptions{Source: "test", Windows: []ledger.Window{w}})
	if !errors.Is(err, ErrKeysTruncated) || !errors.Is(err, ledger.ErrTooMany) || !strings.Contains(err.Error(), vk.Addr) ||
		!strings.Contains(err.Error(), "more than 10 keys") {
		t.Fatalf("sync: %v, want ErrKeysTruncated naming the node and the bound", err)
	}
	if st.Windows != 10 {
		t.Fatalf("stats %+v, want the 10 rule-windows the scan found copied", st)
	}
	if got := pg.Psql(ctx, t, "SELECT count(*) || ' ' || sum(units) FROM ledger_usage"); got != "10 50" {
		t.Fatalf("rows %q, want 10 rows of 5 units committed", got)
	}
	if got := pg.Psql(ctx, t, "SELECT count(*) FROM ledger_syncs"); got != "1" {
		t.Fatalf("ledger_syncs rows %q: the degraded sync is recorded", got)
	}
}
