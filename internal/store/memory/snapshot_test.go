package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/store"
)

// TestSnapshotRoundTrip: counters and ledger fields survive a snapshot and a
// new store; counters and hashes whose window ended by the restore are
// dropped; the same state encodes to the same bytes.
func TestSnapshotRoundTrip(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "snap")
	lm := ledger.NewMemory("", clk.Now)
	s := New(Options{Now: clk.Now, Ledger: lm})
	defer s.Close()
	day := time.Date(2026, 12, 2, 0, 5, 0, 0, time.UTC)
	minute := clk.Now().Add(90 * time.Second)
	cs := []store.Counter{
		{Key: "day|alice", Hits: 900_000, ExpireAt: day, Ledger: store.HashIncr{Key: "u", Field: "alice"}},
		{Key: "day|bob", Hits: 7, ExpireAt: day, Ledger: store.HashIncr{Key: "u", Field: "bob"}},
		{Key: "minute|alice", Hits: 3, ExpireAt: minute},
	}
	if err := s.Charge(context.Background(), cs, make([]store.Result, len(cs))); err != nil {
		t.Fatal(err)
	}
	if err := lm.Apply(context.Background(), ledger.Batch{Expire: map[string]time.Time{"u": day.Add(10 * 24 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	sn := &Snapshotter{Path: path, Store: s, Ledger: lm}
	if err := sn.Write(); err != nil {
		t.Fatal(err)
	}
	if a, b := sn.Encode(), sn.Encode(); !bytes.Equal(a, b) {
		t.Fatal("two encodings of one state differ")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot file: %v, %v (want mode 0600: it names principals)", fi, err)
	}

	clk.Add(2 * time.Minute) // the minute window is over
	lm2 := ledger.NewMemory("", clk.Now)
	s2 := New(Options{Now: clk.Now, Ledger: lm2})
	defer s2.Close()
	st, err := (&Snapshotter{Path: path, Store: s2, Ledger: lm2}).Restore()
	if err != nil {
		t.Fatal(err)
	}
	if st.Counters != 2 || st.ExpiredCounters != 1 || st.Hashes != 1 {
		t.Fatalf("restore stats %+v: want 2 counters, 1 expired, 1 hash", st)
	}
	totals := make([]store.Result, 3)
	if err := s2.Charge(context.Background(), []store.Counter{{Key: "day|alice", Hits: 1, ExpireAt: day}, {Key: "day|bob", ExpireAt: day}, {Key: "minute|alice", ExpireAt: minute}}, totals); err != nil {
		t.Fatal(err)
	}
	if totals[0].Total != 900_001 || totals[1].Total != 7 || totals[2].Total != 0 {
		t.Fatalf("after restore: %v, want [900001 7 0]", totals)
	}
	// The expiry is the original absolute one, not a new one.
	sh := &s2.shards[s2.shardOf("day|bob")]
	if got := time.Unix(0, sh.m["day|bob"].expireAt); !got.Equal(day) {
		t.Fatalf("restored expiry %v, want %v", got, day)
	}
	if got := lm2.TTL("u"); !got.Equal(day.Add(10 * 24 * time.Hour)) {
		t.Fatalf("ledger hash expiry %v", got)
	}
	var fields map[string]uint64
	lm2.ExportHashes(func(key string, _ time.Time, f map[string]uint64) {
		if key == "u" {
			fields = map[string]uint64{"alice": f["alice"], "bob": f["bob"]}
		}
	})
	if fields["alice"] != 900_000 || fields["bob"] != 7 {
		t.Fatalf("ledger fields after restore: %v", fields)
	}
}

// TestSnapshotMissingAndCorrupt: no file is a first start; a file cut at any
// byte, with any byte altered, or of another kind is an error naming the file
// and wrapping ErrCorruptSnapshot, and restores nothing.
func TestSnapshotMissingAndCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := New(Options{})
	defer s.Close()
	if st, err := (&Snapshotter{Path: filepath.Join(dir, "none"), Store: s}).Restore(); err != nil || st != (RestoreStats{}) {
		t.Fatalf("missing file: %+v, %v", st, err)
	}
	exp := time.Now().Add(time.Hour)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := charge(t, s, k, 5, exp); err != nil {
			t.Fatal(err)
		}
	}
	good := (&Snapshotter{Store: s}).Encode()
	bad := map[string][]byte{"empty": {}, "text": []byte("hello, this is not a snapshot")}
	for i := 0; i < len(good); i++ {
		bad["cut at "+strconv.Itoa(i)] = good[:i]
		flip := append([]byte(nil), good...)
		flip[i] ^= 0x40
		bad["flipped byte "+strconv.Itoa(i)] = flip
	}
	for name, data := range bad {
		path := filepath.Join(dir, "snap")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s2 := New(Options{})
		_, err := (&Snapshotter{Path: path, Store: s2}).Restore()
		if !errors.Is(err, ErrCorruptSnapshot) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v, want ErrCorruptSnapshot naming %s", name, err, path)
		}
		if n := s2.Stats().Counters; n != 0 {
			t.Errorf("%s: %d counters restored from a corrupt file", name, n)
		}
		s2.Close()
	}
}

// TestSnapshotForeignOrNewer: a file that is not a snapshot and one of a
// later format (a downgrade) are told apart in the error, which names the
// file, and nothing is restored from either.
func TestSnapshotForeignOrNewer(t *testing.T) {
	dir := t.TempDir()
	s := New(Options{})
	defer s.Close()
	if _, err := charge(t, s, "a", 5, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	good := (&Snapshotter{Store: s}).Encode()
	v3 := append([]byte(nil), good[:len(good)-4]...)
	v3[len(snapshotMagic)-1] = 3
	v3 = binary.BigEndian.AppendUint32(v3, crc32.ChecksumIEEE(v3))
	for _, c := range []struct {
		name string
		data []byte
		is   error
		says string
	}{
		{"newer", v3, ErrSnapshotVersion, "version 3, and this ratelimit reads 1 and 2"},
		{"newer, cut", v3[:len(v3)-1], ErrCorruptSnapshot, "checksum mismatch"},
		{"foreign", []byte("apiVersion: v1\nkind: ConfigMap\n"), ErrCorruptSnapshot, `not a budgetgen memory snapshot (no "BGMEMSNAP" header)`},
		{"empty", nil, ErrCorruptSnapshot, "not a budgetgen memory snapshot (empty file)"},
		{"header only", []byte(snapshotMagic), ErrCorruptSnapshot, "not a budgetgen memory snapshot (10 bytes)"},
	} {
		path := filepath.Join(dir, "snap")
		if err := os.WriteFile(path, c.data, 0o600); err != nil {
			t.Fatal(err)
		}
		s2 := New(Options{})
		_, err := (&Snapshotter{Path: path, Store: s2}).Restore()
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: err = %v, want %v naming %s and saying %q", c.name, err, c.is, path, c.says)
		}
		if n := s2.Stats().Counters; n != 0 {
			t.Errorf("%s: %d counters restored", c.name, n)
		}
		s2.Close()
	}
	// A device that never ends is refused from its first bytes, not read
	// into memory up to a bound.
	start := time.Now()
	_, err := (&Snapshotter{Path: "/dev/zero", Store: s}).Restore()
	if !errors.Is(err, ErrCorruptSnapshot) || !strings.Contains(err.Error(), "/dev/zero: corrupt memory snapshot: not a budgetgen memory snapshot (no") {
		t.Errorf("/dev/zero: err = %v, want it refused for its header", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("/dev/zero refused after %v: read beyond its header", d)
	}
}

// TestSnapshotAboveTheBound: a snapshot with more live counters than the
// restoring store's MaxCounters (MEMORY_MAX_COUNTERS lowered between two
// runs) restores every one of them, since a dropped counter is a budget
// forgotten; the store then refuses new counters, as at its bound.
func TestSnapshotAboveTheBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "snap")
	s := New(Options{})
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	keys := []string{"a", "b", "c", "d", "e"}
	for i, k := range keys {
		if _, err := charge(t, s, k, uint64(100+i), exp); err != nil {
			t.Fatal(err)
		}
	}
	if err := (&Snapshotter{Path: path, Store: s}).Write(); err != nil {
		t.Fatal(err)
	}
	s2 := New(Options{MaxCounters: 2})
	defer s2.Close()
	st, err := (&Snapshotter{Path: path, Store: s2}).Restore()
	if err != nil || st.Counters != 5 || st.OverBound != 3 {
		t.Fatalf("restore into a store bounded at 2: %+v, %v; want 5 counters, 3 of them over the bound", st, err)
	}
	for i, k := range keys {
		if got, err := charge(t, s2, k, 1, exp); err != nil || got != uint64(100+i+1) {
			t.Errorf("%s after the restore: %d, %v; want %d", k, got, err, 100+i+1)
		}
	}
	if _, err := charge(t, s2, "new", 1, exp); !errors.Is(err, ErrFull) {
		t.Errorf("a new counter above the bound: %v, want ErrFull", err)
	}
}

// TestSnapshotClaimThroughLinks: the lock is taken on the file a path
// names after symbolic links, so a second Snapshotter given a link to the
// first one's file (or a path through a linked directory) is refused until
// the first releases it.
func TestSnapshotClaimThroughLinks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", "snap")
	s := New(Options{})
	defer s.Close()
	first := &Snapshotter{Path: path, Store: s}
	release, err := first.Claim()
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Write(); err != nil {
		t.Fatal(err)
	}
	// What names principals is the owner's only: the directory Claim made,
	// the lock and the snapshot.
	for p, want := range map[string]os.FileMode{filepath.Dir(path): 0o700, path + ".lock": 0o600, path: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %v", p, fi, err, want)
		}
	}
	if err := os.Symlink(path, filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "state"), filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{filepath.Join(dir, "alias"), filepath.Join(dir, "linked", "snap")} {
		if _, err := (&Snapshotter{Path: other, Store: s}).Claim(); !errors.Is(err, ErrSnapshotInUse) || !strings.Contains(err.Error(), other) {
			t.Errorf("claim of %s while %s is held: %v, want ErrSnapshotInUse naming it", other, path, err)
		}
	}
	release()
	again, err := (&Snapshotter{Path: filepath.Join(dir, "alias"), Store: s}).Claim()
	if err != nil {
		t.Fatalf("claim after the release: %v", err)
	}
	again()
}

// TestSnapshotStreams: a periodic snapshot streams to its file, so writing
// one allocates under a quarter of its size (the encoded bytes were built
// whole in memory, twice over with the buffer's growth, every
// MEMORY_SNAPSHOT_INTERVAL, beside the store itself under the pod's memory
// limit); the file is what Encode gives; and a restore decodes as it reads.
func TestSnapshotStreams(t *testing.T) {
	s := New(Options{SweepInterval: time.Hour})
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	pad := strings.Repeat("p", 2000)
	for i := range 4_000 {
		if _, err := charge(t, s, pad+strconv.Itoa(i), uint64(i+1), exp); err != nil {
			t.Fatal(err)
		}
	}
	sn := &Snapshotter{Path: filepath.Join(t.TempDir(), "snap"), Store: s}
	if err := sn.Write(); err != nil { // warm: the directory, the temporary name
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := sn.Write(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	written, err := os.ReadFile(sn.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written, sn.Encode()) {
		t.Fatal("the written file differs from Encode")
	}
	got := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d-byte snapshot written with %d bytes allocated", len(written), got)
	if got > uint64(len(written))/4 {
		t.Fatalf("writing a %d-byte snapshot allocated %d bytes: want under a quarter of its size", len(written), got)
	}

	// Read back, it is decoded as it is read: a restore allocates about
	// the entries it restores (here the keys: nearly the whole file), not
	// the file's bytes besides (which needed twice the store's memory at
	// start, the moment a pod sized for the store is OOM-killed again).
	s2 := New(Options{SweepInterval: time.Hour})
	defer s2.Close()
	runtime.ReadMemStats(&before)
	st, err := (&Snapshotter{Path: sn.Path, Store: s2}).Restore()
	runtime.ReadMemStats(&after)
	if err != nil || st.Counters != 4_000 {
		t.Fatalf("restore: %+v, %v", st, err)
	}
	got = after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d-byte snapshot restored with %d bytes allocated", len(written), got)
	if got > uint64(len(written))*3/2 {
		t.Fatalf("restoring a %d-byte snapshot allocated %d bytes: want under 1.5 times its size", len(written), got)
	}
}

// TestSnapshotStats: a successful write sets the time and size exported as
// metrics; a failed one counts a failure and keeps them, so a snapshot that
// keeps failing (and a crash that would lose more than one interval) shows.
func TestSnapshotStats(t *testing.T) {
	dir := t.TempDir()
	s := New(Options{})
	defer s.Close()
	if _, err := charge(t, s, "a", 5, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	sn := &Snapshotter{Path: filepath.Join(dir, "snap"), Store: s}
	if st := sn.Stats(); !st.LastWritten.IsZero() || st.Failures != 0 {
		t.Fatalf("before any write: %+v", st)
	}
	before := time.Now()
	if err := sn.Write(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sn.Path)
	if err != nil {
		t.Fatal(err)
	}
	ok := sn.Stats()
	if ok.LastWritten.Before(before) || ok.Bytes != fi.Size() || ok.Failures != 0 {
		t.Fatalf("after a write: %+v, want written since %v, %d bytes, no failure", ok, before, fi.Size())
	}
	sn.Path = filepath.Join(dir, "missing", "snap") // a directory that is not there
	if err := sn.Write(); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	if st := sn.Stats(); st.Failures != 1 || !st.LastWritten.Equal(ok.LastWritten) || st.Bytes != ok.Bytes {
		t.Fatalf("after a failed write: %+v, want 1 failure and the last success kept (%+v)", st, ok)
	}
}

// TestSnapshotRefusesASharedDirectory: a snapshot right in a directory
// every user can write to (/tmp) is refused at Claim, naming the directory;
// one in a subdirectory of the service's own is taken.
func TestSnapshotRefusesASharedDirectory(t *testing.T) {
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	defer s.Close()
	path := filepath.Join(shared, "snap")
	if _, err := (&Snapshotter{Path: path, Store: s}).Claim(); !errors.Is(err, ErrSharedDir) || !strings.Contains(err.Error(), shared) {
		t.Fatalf("claim in a world-writable directory: %v, want ErrSharedDir naming %s", err, shared)
	}
	release, err := (&Snapshotter{Path: filepath.Join(shared, "own", "snap"), Store: s}).Claim()
	if err != nil {
		t.Fatalf("claim in a directory of our own under it: %v", err)
	}
	release()
}

// FuzzDecodeSnapshot: no input panics, every failure wraps
// ErrCorruptSnapshot (or ErrSnapshotVersion), and no input yields more entries than its bytes.
func FuzzDecodeSnapshot(f *testing.F) {
	s := New(Options{})
	defer s.Close()
	if err := s.Charge(context.Background(), []store.Counter{{Key: "k", Hits: 3, ExpireAt: time.Now().Add(time.Hour)}}, make([]store.Result, 1)); err != nil {
		f.Fatal(err)
	}
	held := store.Counter{Key: "r", ExpireAt: time.Now().Add(time.Hour), Limit: 100, Enforce: true, Start: true, Hold: store.Hold{Reserve: 10, Expiry: time.Minute}}
	if err := s.Charge(context.Background(), []store.Counter{held}, make([]store.Result, 1)); err != nil {
		f.Fatal(err)
	}
	lm := ledger.NewMemory("", nil)
	lm.HIncrBy("h", "f", 2)
	f.Add((&Snapshotter{Store: s, Ledger: lm}).Encode())
	f.Add([]byte(snapshotMagic))
	good := (&Snapshotter{Store: s, Ledger: lm}).Encode()
	f.Add(good[len(snapshotMagic) : len(good)-4]) // a valid body, framed by the target
	f.Fuzz(func(t *testing.T, data []byte) {
		// As given (mostly refused by the magic or the checksum), and framed
		// with the magic and a right checksum, so the body parser sees it.
		framed := append([]byte(snapshotMagic), data...)
		framed = binary.BigEndian.AppendUint32(framed, crc32.ChecksumIEEE(framed))
		for _, in := range [][]byte{data, framed} {
			cs, hs, err := decodeSnapshot(in)
			if err != nil {
				if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrSnapshotVersion) {
					t.Fatalf("error %v wraps neither ErrCorruptSnapshot nor ErrSnapshotVersion", err)
				}
				continue
			}
			if len(cs)+len(hs) > len(in) {
				t.Fatalf("%d entries from %d bytes", len(cs)+len(hs), len(in))
			}
		}
	})
}

// TestSnapshotKeepsHolds: a reserving counter's unfinished requests survive
// a restart: the restored store still sets their holds aside, the late
// charges release them, and a hold whose charge never comes still expires
// on time; a version-1 snapshot (no holds) still restores its counters.
func TestSnapshotKeepsHolds(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "snap")
	s := New(Options{Now: clk.Now})
	defer s.Close()
	day := time.Date(2026, 12, 2, 0, 5, 0, 0, time.UTC)
	hold := store.Hold{Reserve: 50_000, Expiry: 10 * time.Minute}
	check := func(s *Store) store.Result {
		t.Helper()
		r := make([]store.Result, 1)
		c := []store.Counter{{Key: "day|run-7", ExpireAt: day, Limit: 2_000_000, Enforce: true, Start: true, Hold: hold}}
		if err := s.Charge(context.Background(), c, r); err != nil {
			t.Fatal(err)
		}
		return r[0]
	}
	for range 3 {
		if r := check(s); !r.Held {
			t.Fatalf("check not held: %+v", r)
		}
	}
	sn := &Snapshotter{Path: path, Store: s}
	if err := sn.Write(); err != nil {
		t.Fatal(err)
	}

	s2 := New(Options{Now: clk.Now})
	defer s2.Close()
	if _, err := (&Snapshotter{Path: path, Store: s2}).Restore(); err != nil {
		t.Fatal(err)
	}
	if r := check(s2); !r.Held || r.Reserved != 4*50_000 {
		t.Fatalf("after the restore: %+v, want a fourth hold beside the three restored (200000 reserved)", r)
	}
	r := make([]store.Result, 1)
	charge := []store.Counter{{Key: "day|run-7", Hits: 40_000, ExpireAt: day, Start: true, Hold: store.Hold{Release: 1, Expiry: hold.Expiry}}}
	if err := s2.Charge(context.Background(), charge, r); err != nil {
		t.Fatal(err)
	}
	if r[0].Total != 40_000 || r[0].Reserved != 3*50_000 {
		t.Fatalf("a late charge: %+v, want total 40000 and 150000 still reserved", r[0])
	}
	clk.Add(hold.Expiry + time.Second)
	if res := check(s2); res.Reserved != 50_000 || res.Expired != 3*50_000 {
		t.Fatalf("after the expiry: %+v, want the three lost holds expired and only this check's held", res)
	}

	// Version 1: the same counters, no holds.
	v1 := encodeV1(t, sn.Encode())
	if err := os.WriteFile(path, v1, 0o600); err != nil {
		t.Fatal(err)
	}
	s3 := New(Options{Now: clk.Now})
	defer s3.Close()
	if st, err := (&Snapshotter{Path: path, Store: s3}).Restore(); err != nil || st.Counters != 1 {
		t.Fatalf("version 1: %+v, %v", st, err)
	}
}

// encodeV1 rewrites a version-2 snapshot without holds as version 1.
func encodeV1(t *testing.T, v2 []byte) []byte {
	t.Helper()
	cs, hs, err := decodeSnapshot(v2)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.WriteString(snapshotMagicV1)
	var tmp [binary.MaxVarintLen64]byte
	uv := func(v uint64) { b.Write(tmp[:binary.PutUvarint(tmp[:], v)]) }
	uv(uint64(len(cs)))
	for _, c := range cs {
		uv(uint64(len(c.key)))
		b.WriteString(c.key)
		uv(c.value)
		uv(uint64(c.expireAt))
	}
	uv(uint64(len(hs)))
	if len(hs) != 0 {
		t.Fatal("encodeV1 writes no hashes")
	}
	b.Write(binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE(b.Bytes())))
	return b.Bytes()
}
