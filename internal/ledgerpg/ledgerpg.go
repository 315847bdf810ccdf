// Package ledgerpg keeps the ledger (internal/ledger) durably in PostgreSQL:
// `budgetgen ledger sync` copies every window the service's ledger still
// holds (closed and running) into it, and `budgetgen report --postgres` and
// `budgetgen export` read months of history back. The rate limit service never
// talks to PostgreSQL: its data path cannot wait on it.
//
// The schema is created and upgraded by embedded SQL migrations applied with
// goose (github.com/pressly/goose/v3) under a PostgreSQL advisory lock, so two
// syncs starting together migrate once; the versions are kept in the ledger's
// own table (VersionTable), not goose's default shared by other apps. A sync is one transaction of
// idempotent upserts that keep the larger of the stored and the read value:
// running it twice gives the same rows, and a ledger that lost data never
// lowers what was recorded.
package ledgerpg

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is a connection to the durable ledger.
type DB struct {
	conn *pgx.Conn
	cfg  *pgx.ConnConfig
	// MaxPrincipals bounds the principals of one rule-window read back;
	// default ledger.DefaultMaxPrincipals.
	MaxPrincipals int
}

// ErrPasswordInDSN refuses a DSN that carries a password: it would show in
// process listings and shell history. PGPASSWORD or a .pgpass file (PGPASSFILE)
// hold it instead, as for every libpq client.
var ErrPasswordInDSN = errors.New("the PostgreSQL DSN holds a password: put it in $PGPASSWORD or a .pgpass file instead")

// ErrAuthFailed is wrapped by Open's error when the server refused the
// credentials (SQLSTATE 28P01 invalid_password or 28000
// invalid_authorization_specification, such as no pg_hba.conf rule for the
// user; https://www.postgresql.org/docs/current/errcodes-appendix.html):
// the server is reachable, the password or the role is wrong.
var ErrAuthFailed = errors.New("authentication failed")

// Open connects to dsn (a postgres:// URL or key=value string).
func Open(ctx context.Context, dsn string) (*DB, error) {
	// Before parsing: pgx quotes a DSN it cannot parse in its error, with
	// passwords redacted only on a best-effort basis (pgconn's ParseConfig doc).
	if hasPassword(dsn) {
		return nil, ErrPasswordInDSN
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres DSN: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, connectError(cfg, err)
	}
	return &DB{conn: conn, cfg: cfg}, nil
}

// connectError says why connecting failed: the credentials refused
// (ErrAuthFailed), or the server unreachable. pgconn's message names the
// user and the server's reason, never the password.
func connectError(cfg *pgx.ConnConfig, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "28P01" || pe.Code == "28000") {
		return fmt.Errorf("postgres %s:%d: %w for user %q (the password comes from $PGPASSWORD or a .pgpass file): %w",
			cfg.Host, cfg.Port, ErrAuthFailed, cfg.User, err)
	}
	return fmt.Errorf("postgres %s:%d unreachable: %w", cfg.Host, cfg.Port, err)
}

// hasPassword reports whether the DSN itself (not $PGPASSWORD or a pgpass
// file, which pgx also reads) sets a password. It reads the DSN the way
// libpq and pgx do (pgconn's parse_url.go and parseKeywordValueSettings), not
// as net/url does: a URI's userinfo ends at the first '@' before any '/' and
// its hosts may be a list net/url refuses (postgres://u:pw@[::1]:1,[::2]:1/db),
// and a keyword may have spaces around its '=' (password = secret).
func hasPassword(dsn string) bool {
	rest, ok := strings.CutPrefix(dsn, "postgresql://")
	if !ok {
		rest, ok = strings.CutPrefix(dsn, "postgres://")
	}
	if ok {
		if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
			if strings.Contains(rest[:i], ":") {
				return true
			}
			rest = rest[i+1:]
		}
		_, query, _ := strings.Cut(rest, "?")
		for _, kv := range strings.Split(query, "&") {
			k, _, _ := strings.Cut(kv, "=")
			if d, err := url.PathUnescape(k); err == nil {
				k = d
			}
			if k == "password" {
				return true
			}
		}
		return false
	}
	const space = " \t\n\r\v\f"
	s := strings.TrimLeft(dsn, space)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return false
		}
		if strings.Trim(s[:eq], space) == "password" {
			return true
		}
		s = strings.TrimLeft(s[eq+1:], space)
		// Skip the value: quoted, or up to the next space; a backslash
		// escapes the byte after it.
		quoted := s != "" && s[0] == '\''
		if quoted {
			s = s[1:]
		}
		end := 0
		for ; end < len(s); end++ {
			if s[end] == '\\' {
				end++
				continue
			}
			if (quoted && s[end] == '\'') || (!quoted && strings.IndexByte(space, s[end]) >= 0) {
				break
			}
		}
		if end >= len(s) {
			return false
		}
		s = strings.TrimLeft(s[end+1:], space)
	}
	return false
}

// Close closes the connection.
func (db *DB) Close(ctx context.Context) error { return db.conn.Close(ctx) }

// VersionTable is the ledger's own goose version table. goose's default,
// goose_db_version, is shared by every goose app in a schema: another app's
// versions 1 and 2 there made the ledger's migrations look applied, and
// sync then failed on tables that were never created.
const VersionTable = "budgetgen_ledger_version"

// adoptLock keys the transaction-level advisory lock that serializes
// adoptLegacy between syncs starting together ("budgetgen" in ASCII).
const adoptLock = 0x6275646765746765

// ErrSchemaNewer is returned by Migrate for a schema a newer budgetgen
// migrated past this one's migrations: it is left as it is, and nothing is
// written to it.
var ErrSchemaNewer = errors.New("the ledger schema is newer than this budgetgen")

// Migrate creates or upgrades the schema to the embedded migrations.
func (db *DB) Migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return err
	}
	sqlDB := stdlib.OpenDB(*db.cfg)
	defer func() { _ = sqlDB.Close() }() // the migration connection only
	if err := adoptLegacy(ctx, sqlDB); err != nil {
		return fmt.Errorf("migrate the ledger schema: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub, goose.WithSessionLocker(locker), goose.WithTableName(VersionTable))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if err := refuseNewer(ctx, p); err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate the ledger schema: %w", err)
	}
	return nil
}

// refuseNewer returns ErrSchemaNewer when the database's version is past
// the embedded migrations': goose's Up then applies nothing and says
// nothing, and a sync would write rows a newer schema may read otherwise.
// GetVersions takes no lock (Up takes goose's), so syncs starting together
// wait for one another once, not twice.
func refuseNewer(ctx context.Context, p *goose.Provider) error {
	current, latest, err := p.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("read the ledger schema's version: %w", err)
	}
	if current > latest {
		return fmt.Errorf("%w: it is at version %d (%s), this budgetgen's migrations end at version %d: run the budgetgen that migrated it; the schema is left as it is", ErrSchemaNewer, current, VersionTable, latest)
	}
	return nil
}

// adoptLegacy gives a ledger migrated under goose's default version table
// its own VersionTable, with the versions its schema shows applied: read
// from the catalog, not from the legacy table, whose rows may be another
// app's. A fresh database (no ledger tables) is left to goose.
func adoptLegacy(ctx context.Context, sqlDB *sql.DB) error {
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(adoptLock)); err != nil {
		return fmt.Errorf("lock the schema: %w", err)
	}
	var own, ledgerTables, holds bool
	err = tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
		to_regclass('ledger_usage') IS NOT NULL,
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('ledger_windows') AND attname = 'holds' AND NOT attisdropped)`,
		VersionTable).Scan(&own, &ledgerTables, &holds)
	if err != nil {
		return fmt.Errorf("read the schema's state: %w", err)
	}
	if own || !ledgerTables {
		return nil
	}
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return err
	}
	if err := store.CreateVersionTable(ctx, tx); err != nil {
		return fmt.Errorf("create %s: %w", VersionTable, err)
	}
	versions := []int64{0, 1}
	if holds {
		versions = append(versions, 2)
	}
	for _, v := range versions {
		if err := store.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return fmt.Errorf("record version %d in %s: %w", v, VersionTable, err)
		}
	}
	return tx.Commit()
}

// Version is the schema's migration version (0 before Migrate).
func (db *DB) Version(ctx context.Context) (int64, error) {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	sqlDB := stdlib.OpenDB(*db.cfg)
	defer func() { _ = sqlDB.Close() }() // read only
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub, goose.WithTableName(VersionTable))
	if err != nil {
		return 0, err
	}
	return p.GetDBVersion(ctx)
}

// toInt64 converts a ledger count for a bigint column.
func toInt64(v uint64, what string) (int64, error) {
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("%s %d does not fit a bigint", what, v)
	}
	return int64(v), nil
}

// timeOf is a window's bounds in loc.
func timeOf(w ledger.Window, loc *time.Location) (time.Time, time.Time) {
	return w.Start(loc), w.End(loc)
}
