package memory

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
)

// Snapshots (MEMORY_SNAPSHOT_PATH): so a restart of a service on the embedded
// store does not forget the budget (a single replica without Valkey must
// survive a restart), its counters and the usage
// ledger are written to one file, periodically and on shutdown, atomically
// (internal/atomicfile: a crash leaves the previous snapshot whole), and read
// back at start, dropping what has expired. A crash loses at most what was
// charged since the last snapshot: one interval.
//
// Format (version 2; version 1 has no holds and is still read; a later
// version keeps the header and the trailing checksum, so an older build
// tells it from a corrupt file), all integers unsigned varints unless noted:
//
//	"BGMEMSNAP\x02"
//	count of counters, then per counter: key length, key, value, expiry (Unix ms),
//	  0, or 1 and its holds: current generation's end (Unix ns), generation
//	  length (ns), current holds and tokens, older holds and tokens
//	count of hashes, then per hash: key length, key, expiry (Unix ms, 0: none),
//	  count of fields, then per field: name length, name, value
//	CRC-32 (IEEE) of everything before it, 4 bytes big-endian
//
// Entries are sorted, so the same state gives the same bytes.

// snapshotMagic is what Encode writes; snapshotMagicV1 (no holds) is read.
const (
	snapshotMagic   = "BGMEMSNAP\x02"
	snapshotMagicV1 = "BGMEMSNAP\x01"
)

// DefaultSnapshotInterval is how often Snapshotter.Run writes the snapshot.
const DefaultSnapshotInterval = 10 * time.Second

// ErrCorruptSnapshot is wrapped by Restore errors for a file that is not a
// whole snapshot of this format.
var ErrCorruptSnapshot = errors.New("corrupt memory snapshot")

// ErrSnapshotVersion is wrapped by Restore errors for a snapshot of a later
// format than this build reads (a downgrade): whole, but not readable here.
var ErrSnapshotVersion = errors.New("newer snapshot format")

// HashStore is the part of the usage ledger (ledger.Memory) a snapshot
// holds: hashes of counters with an absolute expiry.
type HashStore interface {
	// ExportHashes calls fn for every live hash; fields must not be kept.
	ExportHashes(fn func(key string, expireAt time.Time, fields map[string]uint64))
	// RestoreHash adds fields to hash key and sets its expiry (zero: none).
	RestoreHash(key string, expireAt time.Time, fields map[string]uint64)
}

// Snapshotter writes and restores snapshots of a store and its ledger.
type Snapshotter struct {
	// Path of the snapshot file. Required.
	Path string
	// Store is the counter store. Required.
	Store *Store
	// Ledger, optional, is the usage ledger held with the counters.
	Ledger HashStore
	// Interval of Run. Default DefaultSnapshotInterval.
	Interval time.Duration
	// Logger receives failed periodic writes. Default slog.Default().
	Logger *slog.Logger

	written  atomic.Int64  // Unix ns of the last successful Write, 0: none
	bytes    atomic.Int64  // its size
	failures atomic.Uint64 // failed Writes
}

// SnapshotStats say how the snapshot writes went, for metrics: a write that
// keeps failing makes a crash lose more than one interval.
type SnapshotStats struct {
	LastWritten time.Time // the last successful Write; zero: none yet
	Bytes       int64     // its size
	Failures    uint64    // failed Writes since start
}

// Stats returns the snapshot's write statistics.
func (sn *Snapshotter) Stats() SnapshotStats {
	st := SnapshotStats{Bytes: sn.bytes.Load(), Failures: sn.failures.Load()}
	if ns := sn.written.Load(); ns != 0 {
		st.LastWritten = time.Unix(0, ns)
	}
	return st
}

// RestoreStats says what Restore read.
type RestoreStats struct {
	Found                          bool // the file existed (else a first start)
	Counters, Hashes               int  // restored
	ExpiredCounters, ExpiredHashes int  // dropped: their window (or retention) ended
	OverBound                      int  // of Counters, those beyond the store's MaxCounters or MaxBytes (kept: new counters wait)
}

type snapCounter struct {
	key      string
	value    uint64
	expireAt int64  // ms
	holds    *holds // a reserving counter's unfinished requests, or nil
}

type snapHash struct {
	key      string
	expireAt int64 // ms, 0 none
	fields   []snapField
}

type snapField struct {
	name  string
	value uint64
}

// Encode returns the snapshot bytes of the store and ledger now.
func (sn *Snapshotter) Encode() []byte {
	var b bytes.Buffer
	_ = sn.encodeTo(&b) // a bytes.Buffer does not fail
	return b.Bytes()
}

// Write writes the snapshot atomically (mode 0600: it names principals),
// streamed to the file: only the sorted list of entries is held, not the
// file's bytes.
func (sn *Snapshotter) Write() error {
	var n countingWriter
	err := atomicfile.WriteFunc(sn.Path, func(w io.Writer) error {
		n.w = w
		return sn.encodeTo(&n)
	}, atomicfile.Options{Perm: 0o600})
	if err != nil {
		sn.failures.Add(1)
		return err
	}
	sn.bytes.Store(n.n)
	sn.written.Store(time.Now().UnixNano())
	return nil
}

// countingWriter counts what goes through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// encodeTo writes the snapshot of the store and ledger now to w.
func (sn *Snapshotter) encodeTo(w io.Writer) error {
	cs, hs := sn.entries()
	e := &snapWriter{w: w, sum: crc32.NewIEEE()}
	e.raw(snapshotMagic)
	e.uv(uint64(len(cs)))
	for _, c := range cs {
		e.str(c.key)
		e.uv(c.value)
		e.uv(uint64(c.expireAt))
		if h := c.holds; h == nil {
			e.uv(0)
		} else {
			e.uv(1)
			for _, v := range []uint64{uint64(h.end), uint64(h.p), h.c1, h.t1, h.c0, h.t0} {
				e.uv(v)
			}
		}
	}
	e.uv(uint64(len(hs)))
	for _, h := range hs {
		e.str(h.key)
		e.uv(uint64(h.expireAt))
		e.uv(uint64(len(h.fields)))
		for _, f := range h.fields {
			e.str(f.name)
			e.uv(f.value)
		}
	}
	if e.err != nil {
		return e.err
	}
	_, err := w.Write(binary.BigEndian.AppendUint32(nil, e.sum.Sum32()))
	return err
}

// entries are the live counters and the ledger's hashes, sorted, so the
// same state gives the same bytes.
func (sn *Snapshotter) entries() ([]snapCounter, []snapHash) {
	// Sized once: appending a million entries would allocate about five
	// times the final slice.
	cs := make([]snapCounter, 0, max(sn.Store.count.Load(), 0)+64)
	now := sn.Store.now().UnixNano()
	for i := range sn.Store.shards {
		sh := &sn.Store.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if c.expireAt > now {
				sc := snapCounter{key: k, value: uint64(c.value), expireAt: c.expireAt / int64(time.Millisecond)}
				if c.holds != nil && c.holds.live() > 0 {
					h := *c.holds
					sc.holds = &h
				}
				cs = append(cs, sc)
			}
		}
		sh.mu.Unlock()
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].key < cs[j].key })
	var hs []snapHash
	if sn.Ledger != nil {
		sn.Ledger.ExportHashes(func(key string, expireAt time.Time, fields map[string]uint64) {
			h := snapHash{key: key}
			if !expireAt.IsZero() {
				h.expireAt = expireAt.UnixMilli()
			}
			for f, v := range fields {
				h.fields = append(h.fields, snapField{f, v})
			}
			sort.Slice(h.fields, func(i, j int) bool { return h.fields[i].name < h.fields[j].name })
			hs = append(hs, h)
		})
		sort.Slice(hs, func(i, j int) bool { return hs[i].key < hs[j].key })
	}
	return cs, hs
}

// snapWriter writes a snapshot's numbers and strings to w and its
// checksum; the first error sticks. Strings go through one reused buffer, so
// writing allocates nothing per entry.
type snapWriter struct {
	w   io.Writer
	sum hash.Hash32
	buf []byte
	err error
}

func (e *snapWriter) write(b []byte) {
	if e.err == nil {
		_, _ = e.sum.Write(b) // a hash.Hash never fails
		_, e.err = e.w.Write(b)
	}
}

func (e *snapWriter) raw(s string) {
	e.buf = append(e.buf[:0], s...)
	e.write(e.buf)
}

func (e *snapWriter) uv(v uint64) {
	e.buf = binary.AppendUvarint(e.buf[:0], v)
	e.write(e.buf)
}

func (e *snapWriter) str(s string) {
	e.uv(uint64(len(s)))
	e.raw(s)
}

// Restore reads the snapshot file into the store and ledger, dropping
// counters and hashes that expired. A missing file restores nothing (a first
// start). A file that is not a whole snapshot is an error naming the file
// and wrapping ErrCorruptSnapshot; nothing is restored then.
func (sn *Snapshotter) Restore() (RestoreStats, error) {
	f, err := os.Open(sn.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return RestoreStats{}, nil
	}
	if err != nil {
		return RestoreStats{}, fmt.Errorf("memory snapshot %s: %w", sn.Path, err)
	}
	defer func() { _ = f.Close() }() // read-only
	size := int64(-1)
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		size = fi.Size()
	}
	cs, hs, err := decodeFrom(f, size)
	if err != nil {
		return RestoreStats{}, fmt.Errorf("memory snapshot %s: %w", sn.Path, err)
	}
	st := sn.apply(cs, hs)
	st.Found = true
	return st, nil
}

func (sn *Snapshotter) apply(cs []snapCounter, hs []snapHash) RestoreStats {
	var st RestoreStats
	s := sn.Store
	nowMs := s.now().UnixMilli()
	for _, c := range cs {
		if c.expireAt <= nowMs {
			st.ExpiredCounters++
			continue
		}
		sh := &s.shards[s.shardOf(c.key)]
		sh.mu.Lock()
		cur, ok := sh.m[c.key]
		switch {
		case ok:
			// Charged since start (Restore runs before serving, so only
			// in tests): add, as two replicas' counts would.
			cur.value = int64(satAdd(uint64(cur.value), c.value) & (1<<63 - 1))
			if cur.holds == nil {
				cur.holds = c.holds
			}
			sh.m[c.key] = cur
			st.Counters++
		default:
			// Above MaxCounters or MaxBytes too (a lowered
			// MEMORY_MAX_COUNTERS or MEMORY_MAX_BYTES): a
			// dropped counter is its principal's budget forgotten. The store
			// then refuses new counters until windows end, as at the bound.
			sh.m[c.key] = counter{value: int64(c.value), expireAt: c.expireAt * int64(time.Millisecond), holds: c.holds}
			if n, b := s.count.Add(1), s.bytes.Add(counterBytes(c.key)); n > s.max || b > s.maxBytes {
				st.OverBound++
			}
			st.Counters++
		}
		sh.mu.Unlock()
	}
	if sn.Ledger != nil {
		for _, h := range hs {
			if h.expireAt != 0 && h.expireAt <= nowMs {
				st.ExpiredHashes++
				continue
			}
			fields := make(map[string]uint64, len(h.fields))
			for _, f := range h.fields {
				fields[f.name] = f.value
			}
			var exp time.Time
			if h.expireAt != 0 {
				exp = time.UnixMilli(h.expireAt)
			}
			sn.Ledger.RestoreHash(h.key, exp, fields)
			st.Hashes++
		}
	}
	return st
}

// decodeSnapshot decodes a snapshot held in memory (tests, fuzzing).
func decodeSnapshot(data []byte) ([]snapCounter, []snapHash, error) {
	return decodeFrom(bytes.NewReader(data), int64(len(data)))
}

// decodeFrom decodes the snapshot r holds, size bytes long (-1: r is not a
// regular file), as it reads it: the entries are held, never the file's
// bytes, so a restore needs about what the service held when it wrote the
// snapshot, not that plus the file. A file of another kind (a path set by
// mistake, a device) is refused after its first bytes, whatever its size;
// a snapshot is read at any size. Every length is checked against the bytes
// left, so no input makes it allocate beyond its size. Nothing is returned
// unless the whole file is read and its checksum matches.
func decodeFrom(r io.Reader, size int64) ([]snapCounter, []snapHash, error) {
	head := make([]byte, len(snapshotMagic))
	prefix := snapshotMagic[:len(snapshotMagic)-1]
	n, err := io.ReadFull(r, head)
	switch {
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
		return nil, nil, err
	case n == 0:
		return nil, nil, fmt.Errorf("%w: not a budgetgen memory snapshot (empty file)", ErrCorruptSnapshot)
	case string(head[:min(n, len(prefix))]) != prefix[:min(n, len(prefix))]:
		return nil, nil, fmt.Errorf("%w: not a budgetgen memory snapshot (no %q header)", ErrCorruptSnapshot, prefix)
	case size < 0:
		return nil, nil, fmt.Errorf("%w: not a regular file", ErrCorruptSnapshot)
	case size < int64(len(snapshotMagic))+4:
		return nil, nil, fmt.Errorf("%w: not a budgetgen memory snapshot (%d bytes)", ErrCorruptSnapshot, size)
	}
	sum := crc32.NewIEEE()
	_, _ = sum.Write(head) // a hash.Hash never fails
	body := size - int64(len(head)) - 4
	rd := &snapReader{r: bufio.NewReaderSize(io.TeeReader(io.LimitReader(r, body), sum), 64<<10), left: body}
	var cs []snapCounter
	var hs []snapHash
	switch v := head[len(prefix)]; {
	case v == snapshotMagic[len(prefix)], v == snapshotMagicV1[len(prefix)]:
		cs, hs = rd.entries(v == snapshotMagic[len(prefix)])
	case v > snapshotMagic[len(prefix)]:
		rd.err = fmt.Errorf("%w: version %d, and this ratelimit reads 1 and 2 (a newer one wrote it: run that version)", ErrSnapshotVersion, v)
	default:
		rd.fail("unknown version %d", v)
	}
	// The checksum covers every byte, read or not: a damaged file is named
	// as such before whatever its damage made the decoder say.
	_, _ = io.Copy(io.Discard, rd.r) // a short read shows in the checksum
	var trailer [4]byte
	if _, err := io.ReadFull(r, trailer[:]); err != nil || binary.BigEndian.Uint32(trailer[:]) != sum.Sum32() {
		return nil, nil, fmt.Errorf("%w: checksum mismatch (truncated or altered)", ErrCorruptSnapshot)
	}
	if rd.err != nil {
		return nil, nil, rd.err
	}
	return cs, hs, nil
}

// entries decodes the counters (with their holds in version 2) and the
// ledger's hashes.
func (r *snapReader) entries(v2 bool) ([]snapCounter, []snapHash) {
	n := r.count(3) // a counter takes at least 3 bytes
	cs := make([]snapCounter, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		cs = append(cs, snapCounter{key: r.str(), value: r.uv(), expireAt: int64(r.uv() & (1<<63 - 1))})
		if cs[i].value > 1<<63-1 {
			r.fail("counter %d: value %d above the int64 maximum", i, cs[i].value)
		}
		if v2 {
			cs[i].holds = r.holds(i)
		}
	}
	m := r.count(3)
	hs := make([]snapHash, 0, m)
	for i := 0; i < m && r.err == nil; i++ {
		h := snapHash{key: r.str(), expireAt: int64(r.uv() & (1<<63 - 1))}
		k := r.count(2)
		h.fields = make([]snapField, 0, k)
		for j := 0; j < k && r.err == nil; j++ {
			h.fields = append(h.fields, snapField{name: r.str(), value: r.uv()})
		}
		hs = append(hs, h)
	}
	if r.err == nil && r.left != 0 {
		r.fail("%d bytes after the last entry", r.left)
	}
	return cs, hs
}

// snapReader reads a snapshot's body; the first error sticks.
type snapReader struct {
	r    *bufio.Reader
	left int64  // body bytes not read yet
	buf  []byte // reused for strings
	err  error
}

func (r *snapReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorruptSnapshot, fmt.Sprintf(format, args...))
	}
}

// ReadByte is io.ByteReader for binary.ReadUvarint, within the body.
func (r *snapReader) ReadByte() (byte, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	b, err := r.r.ReadByte()
	if err == nil {
		r.left--
	}
	return b, err
}

func (r *snapReader) uv() uint64 {
	if r.err != nil {
		return 0
	}
	v, err := binary.ReadUvarint(r)
	if err != nil {
		r.fail("bad number")
		return 0
	}
	return v
}

func (r *snapReader) str() string {
	n := r.uv()
	if r.err != nil {
		return ""
	}
	if n > uint64(r.left) {
		r.fail("string of %d bytes, %d left", n, r.left)
		return ""
	}
	if uint64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.fail("string of %d bytes cut short", n)
		return ""
	}
	r.left -= int64(n)
	return string(b)
}

// holds reads counter i's holds: 0 for none, or 1 and the six numbers.
func (r *snapReader) holds(i int) *holds {
	switch r.uv() {
	case 0:
		return nil
	case 1:
	default:
		r.fail("counter %d: bad holds marker", i)
		return nil
	}
	h := &holds{end: int64(r.uv() & (1<<63 - 1)), p: int64(r.uv() & (1<<63 - 1)), c1: r.uv(), t1: r.uv(), c0: r.uv(), t0: r.uv()}
	if r.err == nil && h.p <= 0 {
		r.fail("counter %d: holds with no generation length", i)
	}
	return h
}

// count reads an entry count, each entry taking at least min bytes.
func (r *snapReader) count(min int) int {
	n := r.uv()
	if r.err == nil && n > uint64(r.left/int64(min)) {
		r.fail("%d entries cannot fit in %d bytes", n, r.left)
		return 0
	}
	return int(n)
}

// Run writes the snapshot every Interval until ctx is done. Failures are
// logged and retried at the next tick (the previous file stays whole). The
// shutdown snapshot is the caller's Write, once nothing charges any more.
func (sn *Snapshotter) Run(ctx context.Context) {
	every := sn.Interval
	if every <= 0 {
		every = DefaultSnapshotInterval
	}
	log := sn.Logger
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := sn.Write(); err != nil {
				log.Error("memory snapshot failed; the previous one is kept", "err", err)
			}
		}
	}
}

// lockPath is the lock file of the snapshot at path: beside the file path
// names after symbolic links (which Write follows too), so two services
// given two names of one file (a link to it) take one lock.
func lockPath(path string) string {
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	} else if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		path = filepath.Join(dir, filepath.Base(path))
	}
	return path + ".lock"
}

// ErrSharedDir is wrapped by Claim's error for a snapshot in a directory
// every user can write to (such as /tmp).
var ErrSharedDir = errors.New("directory writable by every user")

// privateDir refuses a directory every user can write to: there another
// user could replace the snapshot by a link (Write follows it, and would
// overwrite the link's target) or put a file of their own in its place (a
// forged snapshot restores any counts: its checksum is no signature), or
// take the lock first.
func privateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("%w: %s (mode %v): keep the snapshot in a directory of the service's own", ErrSharedDir, dir, fi.Mode().Perm())
	}
	return nil
}

// ErrSnapshotInUse is wrapped by Claim's error when another process holds
// the snapshot.
var ErrSnapshotInUse = errors.New("memory snapshot in use by another process")

// Claim takes an exclusive lock on the snapshot (an flock on Path + ".lock",
// since Path itself is replaced by every write), so two services never keep
// their state in one file: each would overwrite the other's budgets. It
// creates Path's directory. The lock lasts until release (or the process
// ends).
func (sn *Snapshotter) Claim() (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(sn.Path), 0o700); err != nil {
		return nil, fmt.Errorf("memory snapshot %s: %w", sn.Path, err)
	}
	if err := privateDir(filepath.Dir(lockPath(sn.Path))); err != nil {
		return nil, fmt.Errorf("memory snapshot %s: %w", sn.Path, err)
	}
	f, err := os.OpenFile(lockPath(sn.Path), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("memory snapshot %s: %w", sn.Path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // a lock we did not get
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("memory snapshot %s: %w", sn.Path, ErrSnapshotInUse)
		}
		return nil, fmt.Errorf("memory snapshot %s: lock: %w", sn.Path, err)
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
