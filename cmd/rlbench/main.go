// Command rlbench is the rate limit load harness: it runs this service
// (cmd/ratelimit) and the reference (envoyproxy/ratelimit) against the same
// Valkey on this machine, one after the other in interleaved rounds, drives
// each with a closed loop of N gRPC workers over distinct principals, bounded
// by duration and request count, and reports req/s, latency percentiles,
// service CPU per call (from /proc/<pid>/stat) and the ratios.
//
//	go run ./cmd/rlbench -workers 64 -principals 10000 -duration 10s -rounds 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/budgetgen/budgetgen/test/reftest"
)

type options struct {
	workers, principals, rounds, conns, descriptors int
	duration, warmup                                time.Duration
	maxRequests                                     int64
	valkeyAddr, refBin, oursBin, workDir            string
	valkeyPID                                       int // private valkey-server, for its CPU per call; 0 when -valkey is given
	limit                                           uint
	keyFormat                                       string
	only                                            string
	transports                                      string
	profile                                         string
	client                                          string
	mix, reserve, budgetMap                         string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "rlbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	cleanup, err := prepare(ctx, &o, stderr)
	defer cleanup()
	if err != nil {
		return err
	}
	targets, err := targetsOf(o)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "rlbench: client=%s mix=%s reserve=%q workers=%d conns=%d principals=%d descriptors=%d duration=%s warmup=%s rounds=%d limit=%d key-format=%s valkey=%s cpus=%d\n",
		o.client, o.mix, o.reserve, o.workers, o.conns, o.principals, o.descriptors, o.duration, o.warmup, o.rounds, o.limit, o.keyFormat, o.valkeyAddr, numCPU()); err != nil {
		return err
	}
	results := map[string][]result{}
	for r := 0; r < o.rounds; r++ {
		for _, name := range targets {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res, err := runRound(ctx, o, name, r, filepath.Join(o.workDir, "runtime"), stderr)
			if err != nil {
				return fmt.Errorf("%s round %d: %w", name, r+1, err)
			}
			results[name] = append(results[name], res)
			if _, err := fmt.Fprintf(stdout, "round %d %-12s %s\n", r+1, name, res); err != nil {
				return err
			}
		}
	}
	return report(stdout, results)
}

// parseOptions reads the flags and checks their bounds.
func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("rlbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.workers, "workers", 64, "closed-loop workers (concurrent in-flight calls)")
	fs.IntVar(&o.principals, "principals", 10000, "distinct principals (descriptor values)")
	fs.IntVar(&o.descriptors, "descriptors", 1, "descriptors per request (each a different rule)")
	fs.IntVar(&o.rounds, "rounds", 3, "interleaved rounds per service")
	fs.IntVar(&o.conns, "conns", 4, "gRPC connections shared by the workers (Envoy uses one per worker thread)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per round")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured warm-up per round")
	fs.Int64Var(&o.maxRequests, "max-requests", 5_000_000, "upper bound of measured requests per round")
	fs.UintVar(&o.limit, "limit", 1_000_000_000, "requests_per_unit of the rule (high: every call reaches Valkey)")
	fs.StringVar(&o.valkeyAddr, "valkey", "", "Valkey host:port on loopback; empty starts a private valkey-server")
	fs.StringVar(&o.refBin, "reference-bin", "", "envoyproxy/ratelimit binary; empty builds it (go install, cached)")
	fs.StringVar(&o.oursBin, "ours-bin", "", "our ratelimit binary; empty builds ./cmd/ratelimit")
	fs.StringVar(&o.keyFormat, "key-format", "envoy", "our KEY_FORMAT (envoy writes the same keys as the reference); memory-store runs ours on its embedded store (no Valkey) to show the service's own floor")
	fs.StringVar(&o.only, "only", "", "run only 'ours' or 'reference'")
	fs.StringVar(&o.transports, "transports", "lean", "our gRPC transports to run, comma-separated: lean, grpc-go (GRPC_SERVER_IMPL); each is a service of its own in every round")
	fs.StringVar(&o.client, "client", "h2", "load client: h2 (minimal HTTP/2 gRPC client, cheap) or grpc (grpc-go)")
	fs.StringVar(&o.profile, "profile", "", "save a CPU profile of our service per round to <path>.<round>")
	fs.StringVar(&o.workDir, "workdir", "", "scratch directory; empty uses a temporary one")
	fs.StringVar(&o.mix, "mix", mixCharge, "calls: charge (every call charges 1 per descriptor) or llm (Envoy Gateway's token budget shape: a check with hits_addend 0, then the stream-done charge of the tokens; ours with a budget map)")
	fs.StringVar(&o.reserve, "reserve", "", "llm mix: what each budget reserves (tokens, auto, or empty for none)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.workers <= 0 || o.principals <= 0 || o.rounds <= 0 || o.conns <= 0 || o.descriptors <= 0 || o.duration <= 0:
		return o, errors.New("workers, principals, rounds, conns, descriptors and duration must be positive")
	case o.client != "h2" && o.client != "grpc":
		return o, fmt.Errorf("-client %q: want h2 or grpc", o.client)
	case o.mix != mixCharge && o.mix != mixLLM:
		return o, fmt.Errorf("-mix %q: want %s or %s", o.mix, mixCharge, mixLLM)
	case o.duration > 10*time.Minute:
		return o, errors.New("duration is capped at 10m per round")
	case o.valkeyAddr != "" && !loopback(o.valkeyAddr):
		return o, fmt.Errorf("valkey address %q is not on loopback", o.valkeyAddr)
	}
	return o, nil
}

func loopback(addr string) bool {
	return strings.HasPrefix(addr, "127.0.0.1:") || strings.HasPrefix(addr, "localhost:")
}

// prepare makes the scratch directory, starts a private Valkey, builds the
// two services and writes their config (and, for the llm mix, our budget
// map). The returned cleanup is never nil and undoes what was done, also on
// error.
func prepare(ctx context.Context, o *options, stderr io.Writer) (cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if o.workDir == "" {
		d, err := os.MkdirTemp("", "rlbench-")
		if err != nil {
			return cleanup, err
		}
		undo = append(undo, func() { _ = os.RemoveAll(d) }) // scratch space: a leftover temp dir is not worth failing the run
		o.workDir = d
	}
	if o.valkeyAddr == "" {
		addr, pid, stopValkey, err := startValkey(ctx, o.workDir)
		if err != nil {
			return cleanup, err
		}
		undo = append(undo, stopValkey)
		o.valkeyAddr, o.valkeyPID = addr, pid
	}
	if err := buildServices(ctx, o, stderr); err != nil {
		return cleanup, err
	}
	if err := writeConfig(filepath.Join(o.workDir, "runtime"), *o); err != nil {
		return cleanup, err
	}
	if o.mix == mixLLM {
		if o.budgetMap, err = writeBudgetMap(o.workDir, *o); err != nil {
			return cleanup, err
		}
	}
	return cleanup, nil
}

// buildServices builds the reference and ours unless given or not run.
func buildServices(ctx context.Context, o *options, stderr io.Writer) error {
	var err error
	if o.refBin == "" && o.only != "ours" {
		_, _ = fmt.Fprintln(stderr, "building the reference (cached after the first time)...") // progress note only
		if o.refBin, err = reftest.Binary(ctx); err != nil {
			return err
		}
	}
	if o.oursBin == "" && o.only != "reference" {
		o.oursBin = filepath.Join(o.workDir, "ratelimit")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", o.oursBin, "./cmd/ratelimit")
		cmd.Stdout, cmd.Stderr = stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build ./cmd/ratelimit (run from the repository root): %w", err)
		}
	}
	return nil
}

// targetsOf lists the services each round runs, the reference first.
func targetsOf(o options) ([]string, error) {
	var targets []string
	if o.only != "ours" {
		targets = append(targets, "reference")
	}
	if o.only == "reference" {
		return targets, nil
	}
	for _, tr := range strings.Split(o.transports, ",") {
		switch tr = strings.TrimSpace(tr); tr {
		case "lean":
			targets = append(targets, "ours")
		case "grpc-go":
			targets = append(targets, oursGRPCGo)
		default:
			return nil, fmt.Errorf("-transports: unknown transport %q (want lean or grpc-go)", tr)
		}
	}
	return targets, nil
}
