package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ledgerpg"
)

// passwordEnv names the environment variable holding the Valkey password:
// never a flag, so it stays out of shell history and process listings.
const passwordEnv = "BUDGETGEN_VALKEY_PASSWORD"

// ledgerSource are the flags naming where a ledger is read from: the Valkey
// the rate limit service writes to, a service's debug port (embedded store),
// or the durable ledger in PostgreSQL. Validated once; exactly one is given.
type ledgerSource struct {
	valkeyAddrs  []string
	service      string
	postgres     string
	username     string
	tls          bool
	prefix       string
	dialTimeout  time.Duration
	timeout      time.Duration
	maxPrincipal int
	maxKeys      int
	// postgresIsSource: --postgres names where to read (report, export);
	// false when it is where to write (ledger sync).
	postgresIsSource bool
}

// addFlags declares the source flags; postgres is the --postgres help (""
// declares none, the caller does).
func (s *ledgerSource) addFlags(f *pflag.FlagSet, postgres string) {
	f.StringSliceVar(&s.valkeyAddrs, "valkey", nil, "Valkey address host:port (any cluster node; comma-separated seeds allowed)")
	f.StringVar(&s.service, "service", "", "instead of --valkey: the debug port URL of a rate limit service on its embedded store, e.g. http://127.0.0.1:6070")
	if postgres != "" {
		f.StringVar(&s.postgres, "postgres", "", postgres)
	}
	f.StringVar(&s.username, "valkey-username", "", "Valkey ACL user (password from $"+passwordEnv+")")
	f.BoolVar(&s.tls, "valkey-tls", false, "connect to Valkey with TLS (system roots)")
	f.StringVar(&s.prefix, "prefix", "", "key prefix the service uses (its CACHE_KEY_PREFIX)")
	f.DurationVar(&s.dialTimeout, "dial-timeout", 3*time.Second, "give up connecting to Valkey after this long")
	f.DurationVar(&s.timeout, "timeout", 2*time.Minute, "give up reading the ledger after this long")
	f.IntVar(&s.maxPrincipal, "max-principals", ledger.DefaultMaxPrincipals, "refuse rule-windows with more principals than this (memory bound)")
	f.IntVar(&s.maxKeys, "max-keys", ledger.DefaultMaxKeysScanned, "with --valkey: list at most this many ledger keys per Valkey node (memory bound); ledger sync copies the rule-windows listed and exits 1")
}

// postgresDSNHelp is the --postgres help of the commands that read it. The
// back-quoted word is the value's name in --help (pflag.UnquoteUsage), so
// only DSN is quoted.
const postgresDSNHelp = "instead of --valkey: the durable ledger in PostgreSQL at `DSN` (without password: $PGPASSWORD or a .pgpass file holds it), as budgetgen ledger sync writes it"

func (s *ledgerSource) validate() error {
	n := 0
	for _, given := range []bool{len(s.valkeyAddrs) > 0, s.service != "", s.postgres != "" && s.postgresIsSource} {
		if given {
			n++
		}
	}
	where := "--valkey ADDR (the Valkey the rate limit service writes its ledger to) or --service URL (a service on its embedded store)"
	if s.postgresIsSource {
		where += " or --postgres DSN (the durable ledger)"
	}
	switch {
	case n == 0:
		return usageError("give %s", where)
	case n > 1:
		return usageError("give one of %s", where)
	case s.service != "" && !strings.HasPrefix(s.service, "http://") && !strings.HasPrefix(s.service, "https://"):
		return usageError("--service %q: want an http:// or https:// URL (the service's debug port)", s.service)
	case urlHasPassword(s.service):
		// Not quoted: the URL is named in every message about the ledger,
		// and would show in process listings, as a DSN's password would.
		return usageError("--service URL holds a password: give the debug port's URL without one (put an authenticating proxy's credentials in no flag)")
	case len(s.valkeyAddrs) == 0 && (s.prefix != "" || s.username != "" || s.tls):
		return usageError("--prefix, --valkey-username and --valkey-tls are for --valkey")
	case s.dialTimeout <= 0 || s.timeout <= 0:
		return usageError("--dial-timeout and --timeout must be positive")
	case s.maxKeys <= 0:
		return usageError("--max-keys must be positive")
	}
	return nil
}

// urlHasPassword reports whether a URL's userinfo holds a password; a URL
// net/url cannot parse counts when it has an '@' (the parser's error, and
// every later message, would quote it whole).
func urlHasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return strings.Contains(raw, "@")
	}
	_, ok := u.User.Password()
	return ok
}

// open opens the ledger the flags name and says where it is.
func (s *ledgerSource) open(ctx context.Context) (ledger.Reader, string, func(), error) {
	switch {
	case s.service != "":
		rd := &ledger.HTTPReader{Base: s.service, Client: &http.Client{Timeout: s.timeout}, MaxPrincipals: s.maxPrincipal}
		return rd, "the service at " + s.service, func() {}, nil
	case s.postgres != "" && s.postgresIsSource:
		db, err := s.openPostgres(ctx)
		if err != nil {
			return nil, "", nil, err
		}
		return db, "the durable ledger in PostgreSQL", func() { _ = db.Close(context.WithoutCancel(ctx)) }, nil // read only: nothing to lose on close
	}
	lv, closeClient, err := s.openValkey()
	if err != nil {
		return nil, "", nil, err
	}
	return lv, fmt.Sprintf("this Valkey (prefix %q)", s.prefix), closeClient, nil
}

// identity names the ledger the flags read, for the durable ledger's
// record of syncs (ledger_syncs.source): the service's URL, or the Valkey
// addresses and key prefix. Never a password: none is in a flag. The
// addresses are seeds of one Valkey, so they are sorted and deduplicated:
// reordering --valkey must not look like a new ledger, whose first sync
// checks no gap. One address reads as it always did (existing rows match).
func (s *ledgerSource) identity() string {
	if s.service != "" {
		return "service " + s.service
	}
	addrs := slices.Compact(slices.Sorted(slices.Values(s.valkeyAddrs)))
	return fmt.Sprintf("valkey %s prefix %q", strings.Join(addrs, ","), s.prefix)
}

// openPostgres connects to the durable ledger, within --dial-timeout.
func (s *ledgerSource) openPostgres(ctx context.Context) (*ledgerpg.DB, error) {
	dctx, cancel := context.WithTimeout(ctx, s.dialTimeout)
	defer cancel()
	db, err := ledgerpg.Open(dctx, s.postgres)
	if err != nil {
		return nil, err
	}
	db.MaxPrincipals = s.maxPrincipal
	return db, nil
}

// openValkey connects to the Valkey the service writes its ledger to.
func (s *ledgerSource) openValkey() (*ledger.Valkey, func(), error) {
	opt := valkey.ClientOption{
		InitAddress:      s.valkeyAddrs,
		Username:         s.username,
		Password:         os.Getenv(passwordEnv),
		DisableCache:     true,
		Dialer:           net.Dialer{Timeout: s.dialTimeout},
		ConnWriteTimeout: s.dialTimeout,
	}
	if s.tls {
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client, err := valkey.NewClient(opt)
	if err != nil {
		return nil, nil, fmt.Errorf("valkey %s unreachable: %w (check --valkey: the Valkey the rate limit service writes its ledger to)", strings.Join(s.valkeyAddrs, ","), err)
	}
	lv := ledger.NewValkey(client, s.prefix)
	lv.MaxPrincipals = s.maxPrincipal
	lv.MaxKeys = s.maxKeys
	return lv, client.Close, nil
}
