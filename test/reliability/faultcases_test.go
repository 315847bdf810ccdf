package reliability

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// The faults of the fault suite (faultsuite_test.go), one constructor each.

// blackHole: the proxy holds every byte both ways, closing nothing, until a
// call sent into it has been given up as ambiguous (valkey-go tears the
// silent connection down); then traffic resumes. The requests held on a
// torn-down connection are delivered to Valkey (applied, the answer lost)
// or dropped: the replays find them applied or apply them.
func blackHole(deliver bool) faultCase {
	name := "black hole, held requests dropped"
	if deliver {
		name = "black hole, held requests delivered"
	}
	return faultCase{name: name, proxy: true,
		inject: func(t *testing.T, r *faultRun) {
			r.px.Hold(deliver)
			// Until a call is ambiguous and its connection, closed by the
			// client, has had its held requests delivered or dropped.
			ok := untilMetric(r, func(st suiteStats) bool {
				ps := r.px.Stats()
				return st.ambiguous > 0 && ps.Delivered+ps.Dropped > 0
			})
			r.px.Pass()
			if !ok {
				t.Fatalf("within %v of the black hole: no call ambiguous, or no connection torn down holding requests (%+v)", faultBound, r.px.Stats())
			}
		},
		expect: func(t *testing.T, r *faultRun, st suiteStats) {
			ps := r.px.Stats()
			t.Logf("proxy: %d connections accepted, %d torn down with held requests delivered, %d dropped", ps.Accepted, ps.Delivered, ps.Dropped)
			if deliver && (ps.Delivered == 0 || st.ambApplied == 0) {
				t.Errorf("held requests delivered on %d connections, %v ambiguous hits found applied: want both > 0", ps.Delivered, st.ambApplied)
			}
			if !deliver && (ps.Dropped == 0 || st.ambReplayed == 0) {
				t.Errorf("held requests dropped on %d connections, %v ambiguous hits replayed: want both > 0", ps.Dropped, st.ambReplayed)
			}
		}}
}

// clientPause: CLIENT PAUSE WRITE blocks every charge script (they write)
// until a call has been given up as ambiguous; then CLIENT UNPAUSE.
func clientPause() faultCase {
	return faultCase{name: "client pause write",
		inject: func(t *testing.T, r *faultRun) {
			if _, err := r.vk.Do("CLIENT", "PAUSE", strconv.Itoa(int(2*faultBound/time.Millisecond)), "WRITE"); err != nil {
				t.Fatal(err)
			}
			ok := untilMetric(r, func(st suiteStats) bool { return st.ambiguous > 0 })
			if _, err := r.vk.Do("CLIENT", "UNPAUSE"); err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Fatalf("no call was ambiguous within %v of CLIENT PAUSE WRITE", faultBound)
			}
		}}
}

// passwordRestart: the service's ACL user gets a new password, saved, and
// Valkey (AOF, fsync always) is killed and restarted with it: the
// password the service has (REDIS_AUTH, read at start) is refused. The
// correct outcome: the service answers by its failure policy, keeps every
// charge in the outage buffer (a refused handshake sends nothing: certainly
// not applied), and once its password is valid again (here: the old one is
// added back, as a rotation keeps both for a while) replays them exactly
// once. Its logs never hold either password.
func passwordRestart() faultCase {
	const oldPass, newPass = "fault-suite-old-9f2c", "fault-suite-new-41d7"
	return faultCase{name: "password change and restart",
		valkey: func(t *testing.T) []string {
			acl := filepath.Join(t.TempDir(), "users.acl")
			body := "user default on nopass ~* &* +@all\nuser budget on >" + oldPass + " ~* &* +@all\n"
			if err := os.WriteFile(acl, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"--appendonly", "yes", "--appendfsync", "always", "--aclfile", acl}
		},
		env: map[string]string{"REDIS_AUTH": "budget:" + oldPass},
		inject: func(t *testing.T, r *faultRun) {
			for _, cmd := range [][]string{{"ACL", "SETUSER", "budget", "resetpass", ">" + newPass}, {"ACL", "SAVE"}} {
				if _, err := r.vk.Do(cmd...); err != nil {
					t.Fatalf("%s: %v", cmd[:2], err)
				}
			}
			r.vk.Kill()
			r.vk.Restart()
			before := readSuiteStats(r.svc.metrics()).buffered
			// Half a second at least of refused handshakes, and charges
			// buffered meanwhile.
			ok := holdFault(r, 500*time.Millisecond, func(st suiteStats) bool { return st.buffered > before+1000 && deniedAuth(t, r.vk.Addr) > 0 })
			if _, err := r.vk.Do("ACL", "SETUSER", "budget", ">"+oldPass); err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Fatalf("within %v of the restart: Valkey refused %d logins, or the service buffered fewer than 1000 hits", faultBound, deniedAuth(t, r.vk.Addr))
			}
		},
		expect: func(t *testing.T, r *faultRun, st suiteStats) {
			t.Logf("valkey refused %d logins with the old password", deniedAuth(t, r.vk.Addr))
			logs := r.svc.logs.String()
			if strings.Contains(logs, oldPass) || strings.Contains(logs, newPass) {
				t.Errorf("a password is in the service's logs")
			}
		}}
}

// deniedAuth is Valkey's count of refused logins since its start.
func deniedAuth(t *testing.T, addr string) int {
	return infoInt(t, addr, "stats", "acl_access_denied_auth")
}

// infoInt reads one integer field of INFO section (0 when absent).
func infoInt(t *testing.T, addr, section, field string) int {
	t.Helper()
	out, err := valkeytest.Do(addr, "INFO", section)
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// outOfMemory: maxmemory (noeviction) is set 2 MiB above what Valkey uses,
// and a 4 MiB value fills it: every charge script is refused at its first
// write with an OOM error reply, which says it did nothing (certainly not
// applied: buffered, never ambiguous). Freeing the value lets the replays
// in.
func outOfMemory() faultCase {
	return faultCase{name: "out of memory",
		inject: func(t *testing.T, r *faultRun) {
			used := infoInt(t, r.vk.Addr, "memory", "used_memory")
			before := readSuiteStats(r.svc.metrics()).buffered
			mustDo(t, r.vk, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			mustDo(t, r.vk, "CONFIG", "SET", "maxmemory", strconv.Itoa(used+2<<20))
			mustDo(t, r.vk, "SETRANGE", "filler", strconv.Itoa(4<<20), "x")
			ok := untilMetric(r, func(st suiteStats) bool { return st.buffered > before+1000 && oomErrors(t, r.vk.Addr) > 0 })
			mustDo(t, r.vk, "DEL", "filler")
			if !ok {
				t.Fatalf("within %v of the OOM: %d OOM error replies, or fewer than 1000 hits buffered", faultBound, oomErrors(t, r.vk.Addr))
			}
		},
		expect: func(t *testing.T, r *faultRun, st suiteStats) {
			t.Logf("valkey answered %d OOM errors", oomErrors(t, r.vk.Addr))
			if st.ambiguous != 0 {
				t.Errorf("%v hits ambiguous: an OOM error reply says the script did nothing (want 0)", st.ambiguous)
			}
		}}
}

// oomErrors is Valkey's count of OOM error replies (INFO errorstats).
func oomErrors(t *testing.T, addr string) int {
	t.Helper()
	out, err := valkeytest.Do(addr, "INFO", "errorstats")
	if err != nil {
		t.Fatalf("INFO errorstats: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_OOM:count="); ok {
			v, _, _ = strings.Cut(v, ",")
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// flushScript sums the counters matching ARGV[1] and the usage ledger's
// fields in the hashes matching ARGV[2], and flushes every key, in one
// atomic step: the sums are exactly what the flush deleted.
const flushScript = `local c, l = 0, 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do c = c + tonumber(redis.call('GET', k)) end
for _, k in ipairs(redis.call('KEYS', ARGV[2])) do
  for _, v in ipairs(redis.call('HVALS', k)) do l = l + tonumber(v) end
end
redis.call('FLUSHALL')
return {c, l}`

// flushAll: FLUSHALL mid-load deletes every counter, the usage ledger and
// the store's call id bitmaps. What stays true: the service keeps
// answering from Valkey, the counters come back with their expiry (and
// the bitmaps and ledger hashes with theirs), its accounting is exact in
// every class, and Valkey ends with exactly the hits charged minus those
// the flush deleted (read in the same atomic step as the flush), for the
// counters and the ledger alike. The one exception would be a call applied
// before the flush and replayed after it (its id went with the flush): the
// suite allows the ambiguous-replayed hits as slack above the exact total.
func flushAll() faultCase {
	return faultCase{name: "FLUSHALL", resets: true,
		// The store re-sends an id bitmap's expiry a second after it was
		// last confirmed (internal/store/valkey/ids.go): the load runs
		// long enough for the recreated bitmap to get it.
		after: 1500 * time.Millisecond,
		inject: func(t *testing.T, r *faultRun) {
			out, err := r.vk.Do("EVAL", flushScript, "0", counterKeys(suitePrefix), ledgerKeys(suitePrefix))
			if err != nil {
				t.Fatalf("sum and FLUSHALL: %v", err)
			}
			r.flushedAt = time.Now()
			c, l, _ := strings.Cut(out, "\n")
			r.flushed, err = strconv.ParseUint(c, 10, 64)
			if err == nil {
				r.flushedLedger, err = strconv.ParseUint(l, 10, 64)
			}
			if err != nil || r.flushed == 0 {
				t.Fatalf("the flush deleted %q hits: want a count > 0 (%v)", out, err)
			}
		},
		expect: func(t *testing.T, r *faultRun, st suiteStats) {
			after := 0
			for _, rec := range r.load.recs {
				if rec.kind == fromStore && rec.start.After(r.flushedAt) {
					after++
				}
			}
			_, keys := sumKeys(t, r.vk.Addr, suitePrefix)
			t.Logf("after the flush: %d answers from Valkey, %d counters recreated", after, keys)
			if after == 0 || keys != suiteWorkers {
				t.Errorf("after the flush: %d answers from Valkey, %d counters: want > 0 and %d", after, keys, suiteWorkers)
			}
		}}
}

// holdFault waits at least least and until cond holds of the service's
// stats, at most faultBound; false if cond never held.
func holdFault(r *faultRun, least time.Duration, cond func(suiteStats) bool) bool {
	min := time.Now().Add(least)
	return untilMetric(r, func(st suiteStats) bool { return time.Now().After(min) && cond(st) })
}

// latency: every chunk through the proxy waits 60 ms each way, beyond the
// 15 ms store deadline: calls time out and are applied after their caller
// gave up (applied on error), or wait past the stall guard and are
// buffered, or are ambiguous; all counted once.
func latency() faultCase {
	const delay = 60 * time.Millisecond
	return faultCase{name: "latency", proxy: true,
		inject: func(t *testing.T, r *faultRun) {
			before := readSuiteStats(r.svc.metrics()).appliedOnError
			r.px.Delay(delay)
			ok := holdFault(r, time.Second, func(st suiteStats) bool { return st.appliedOnError > before })
			r.px.Pass()
			if !ok {
				t.Fatalf("no hit applied after its caller gave up within %v of a %v delay", faultBound, delay)
			}
		}}
}

// resets: the proxy resets every connection at its next chunk (a request
// forwarded first on every other reset, a reply never), new ones included,
// until a call has been ambiguous; then traffic passes again.
func resets() faultCase {
	return faultCase{name: "connection reset", proxy: true,
		inject: func(t *testing.T, r *faultRun) {
			r.px.Reset()
			ok := holdFault(r, 500*time.Millisecond, func(st suiteStats) bool { return st.ambiguous > 0 })
			r.px.Pass()
			if !ok {
				t.Fatalf("no call was ambiguous within %v of resetting connections", faultBound)
			}
		},
		expect: func(t *testing.T, r *faultRun, st suiteStats) {
			t.Logf("proxy: %d resets, %d connections accepted", r.px.Stats().Resets, r.px.Stats().Accepted)
		}}
}

// bandwidth: the link carries 16 KiB/s each way, far below what the load
// sends: replies come late (applied on error), calls find no slot
// (buffered), and the replays wait for the link.
func bandwidth() faultCase {
	const rate = 16 << 10
	return faultCase{name: "bandwidth", proxy: true,
		inject: func(t *testing.T, r *faultRun) {
			before := readSuiteStats(r.svc.metrics()).appliedOnError
			r.px.Throttle(rate)
			ok := holdFault(r, time.Second, func(st suiteStats) bool { return st.appliedOnError > before })
			r.px.Pass()
			if !ok {
				t.Fatalf("no hit applied after its caller gave up within %v on a %d B/s link", faultBound, rate)
			}
		}}
}

func mustDo(t *testing.T, s *valkeytest.Server, args ...string) {
	t.Helper()
	if _, err := s.Do(args...); err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
}
