package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
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

// FuzzDecodeSnapshot: no input panics, every failure wraps
// ErrCorruptSnapshot, and no input yields more entries than its bytes.
func FuzzDecodeSnapshot(f *testing.F) {
	s := New(Options{})
	defer s.Close()
	if err := s.Charge(context.Background(), []store.Counter{{Key: "k", Hits: 3, ExpireAt: time.Now().Add(time.Hour)}}, make([]store.Result, 1)); err != nil {
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
				if !errors.Is(err, ErrCorruptSnapshot) {
					t.Fatalf("error %v does not wrap ErrCorruptSnapshot", err)
				}
				continue
			}
			if len(cs)+len(hs) > len(in) {
				t.Fatalf("%d entries from %d bytes", len(cs)+len(hs), len(in))
			}
		}
	})
}
