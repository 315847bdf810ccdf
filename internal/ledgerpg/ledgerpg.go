// Package ledgerpg keeps the ledger (internal/ledger) durably in PostgreSQL:
// `budgetgen ledger sync` copies every window the service's ledger still
// holds (closed and running) into it, and `budgetgen report --postgres` and
// `budgetgen export` read months of history back. The rate limit service never
// talks to PostgreSQL: its data path cannot wait on it.
//
// The schema is created and upgraded by embedded SQL migrations applied with
// goose (github.com/pressly/goose/v3) under a PostgreSQL advisory lock, so two
// syncs starting together migrate once. A sync is one transaction of
// idempotent upserts that keep the larger of the stored and the read value:
// running it twice gives the same rows, and a ledger that lost data never
// lowers what was recorded.
package ledgerpg

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
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

// Open connects to dsn (a postgres:// URL or key=value string).
func Open(ctx context.Context, dsn string) (*DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres DSN: %w", err)
	}
	if hasPassword(dsn) {
		return nil, ErrPasswordInDSN
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres %s:%d unreachable: %w", cfg.Host, cfg.Port, err)
	}
	return &DB{conn: conn, cfg: cfg}, nil
}

// hasPassword reports whether the DSN itself (not $PGPASSWORD or a pgpass
// file, which pgx also reads) sets a password.
func hasPassword(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return false
		}
		_, set := u.User.Password()
		return set || u.Query().Has("password")
	}
	for _, f := range strings.Fields(dsn) {
		if k, _, ok := strings.Cut(f, "="); ok && strings.TrimSpace(k) == "password" {
			return true
		}
	}
	return false
}

// Close closes the connection.
func (db *DB) Close(ctx context.Context) error { return db.conn.Close(ctx) }

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
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate the ledger schema: %w", err)
	}
	return nil
}

// Version is the schema's migration version (0 before Migrate).
func (db *DB) Version(ctx context.Context) (int64, error) {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	sqlDB := stdlib.OpenDB(*db.cfg)
	defer func() { _ = sqlDB.Close() }() // read only
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub)
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
