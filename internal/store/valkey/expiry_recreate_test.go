package valkey

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// Buffer disabled: the second round trip of a recreated counter fails; the
// expiry cache must forget the counter, so the next charge sends PEXPIREAT
// NX again (it once kept claiming the expiry was set: the counter lived
// forever).
func TestRecreatedExpiryFailureBufferOff(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	fc := &failingExpiry{Client: realClient(t, srv.Addr)}
	s := storeOver(t, fc, Options{Addresses: []string{srv.Addr}, BufferMaxKeys: -1})
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	ch := func(h uint64) error {
		return s.Charge(context.Background(), []store.Counter{{Key: "k", Hits: h, ExpireAt: exp}}, make([]uint64, 1))
	}
	if err := ch(1); err != nil {
		t.Fatal(err)
	}
	srv.Do("DEL", "k")
	fc.fail.Store(true)
	if err := ch(2); err == nil {
		t.Fatal("want the expiry failure")
	}
	fc.fail.Store(false)
	for i := 0; i < 5; i++ {
		if err := ch(1); err != nil {
			t.Fatal(err)
		}
	}
	if out, _ := srv.Do("PEXPIRETIME", "k"); out == "-1" {
		t.Fatalf("counter k left without expiry after later successful charges (stats %+v)", s.Stats())
	}
}

// ambiguousIncr executes the commands but, once, answers them all with a
// connection error (applied, unanswered).
type ambiguousIncr struct {
	valkey.Client
	once atomic.Bool
}

func (f *ambiguousIncr) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	res := f.Client.DoMulti(ctx, multi...)
	if f.once.CompareAndSwap(true, false) {
		return errResults(len(multi), io.ErrUnexpectedEOF)
	}
	return res
}

// A counter Valkey lost is recreated by an INCRBY whose answer is lost
// (ambiguous): nobody sees v == hits, so the cache must forget the counter
// and the next charge set the expiry again.
func TestRecreatedByAmbiguousCall(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	fc := &ambiguousIncr{Client: realClient(t, srv.Addr)}
	s := storeOver(t, fc, Options{Addresses: []string{srv.Addr}, ReplayInterval: 10 * time.Millisecond})
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	ch := func(h uint64) error {
		return s.Charge(context.Background(), []store.Counter{{Key: "k", Hits: h, ExpireAt: exp}}, make([]uint64, 1))
	}
	if err := ch(1); err != nil {
		t.Fatal(err)
	}
	srv.Do("DEL", "k")
	fc.once.Store(true)
	if err := ch(2); err == nil || !strings.Contains(err.Error(), "charge counter") {
		t.Fatalf("err %v", err)
	}
	for i := 0; i < 5; i++ {
		if err := ch(1); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if out, _ := srv.Do("PEXPIRETIME", "k"); out == "-1" {
		t.Fatalf("counter k left without expiry (stats %+v)", s.Stats())
	}
}
