package valkey

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// tryAgainProxy forwards to a real Valkey but answers the next refuse
// EVALSHAs itself with the TRYAGAIN error a cluster gives a multi-key
// command while its slot migrates: nothing reaches Valkey, as nothing is
// applied on a real cluster.
type tryAgainProxy struct {
	ln      net.Listener
	target  string
	refuse  atomic.Int64
	refused atomic.Int64
}

func startTryAgainProxy(t *testing.T, target string) *tryAgainProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tryAgainProxy{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *tryAgainProxy) serve(client net.Conn) {
	defer func() { _ = client.Close() }()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer func() { _ = server.Close() }()
	var mu sync.Mutex // whole replies to the client, from either side
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				mu.Lock()
				_, werr := client.Write(buf[:n])
				mu.Unlock()
				if werr != nil {
					return
				}
			}
			if err != nil {
				_ = client.Close()
				return
			}
		}
	}()
	r := bufio.NewReader(client)
	for {
		name, raw, err := readRawCommand(r)
		if err != nil {
			return
		}
		if strings.EqualFold(name, "EVALSHA") && p.refuse.Add(-1) >= 0 {
			p.refused.Add(1)
			mu.Lock()
			_, err = io.WriteString(client, "-TRYAGAIN Multiple keys request during rehashing of slot\r\n")
			mu.Unlock()
		} else {
			_, err = server.Write(raw)
		}
		if err != nil {
			return
		}
	}
}

// readRawCommand reads one RESP array of bulk strings: its first element and
// its bytes as sent.
func readRawCommand(r *bufio.Reader) (string, []byte, error) {
	head, err := r.ReadString('\n')
	if err != nil {
		return "", nil, err
	}
	raw := []byte(head)
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "*")))
	if err != nil || !strings.HasPrefix(head, "*") {
		return "", nil, fmt.Errorf("not a RESP array: %q", head)
	}
	var name string
	for i := 0; i < n; i++ {
		l, err := r.ReadString('\n')
		if err != nil {
			return "", nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, "$")))
		if err != nil || size < 0 {
			return "", nil, fmt.Errorf("not a bulk string: %q", l)
		}
		arg := make([]byte, size+2)
		if _, err := io.ReadFull(r, arg); err != nil {
			return "", nil, err
		}
		raw = append(append(raw, l...), arg...)
		if i == 0 {
			name = string(arg[:size])
		}
	}
	return name, raw, nil
}

// TestTryAgainIsResent: a script call answered TRYAGAIN (a slot migrating
// under a multi-key call) applied nothing, so the store sends it again after
// a short pause instead of failing the charge; past its attempts the hits go
// to the outage buffer and are replayed once, never lost or doubled.
func TestTryAgainIsResent(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	p := startTryAgainProxy(t, srv.Addr)
	s := mustNew(t, Options{Addresses: []string{p.ln.Addr().String()}})
	exp := time.Now().Add(time.Hour)
	charge := func(key string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return s.Charge(ctx, []store.Counter{{Key: key, Hits: 5, ExpireAt: exp}}, make([]store.Result, 1))
	}
	if err := charge("warm"); err != nil {
		t.Fatal(err)
	}
	p.refuse.Store(2)
	if err := charge("migrating"); err != nil {
		t.Fatalf("charge answered TRYAGAIN twice: %v, want it resent and applied", err)
	}
	if got, _ := srv.Do("GET", "migrating"); got != "5" || p.refused.Load() != 2 {
		t.Fatalf("migrating = %s after %d TRYAGAIN answers, want 5 after 2", got, p.refused.Load())
	}
	if st := s.Stats(); st.Buffered != 0 {
		t.Fatalf("buffered %d hits, want none: %+v", st.Buffered, st)
	}
	// TRYAGAIN past every attempt: the charge fails, its hits are
	// buffered and replayed once the slot answers.
	p.refuse.Store(tryAgainAttempts + 1)
	if err := charge("stuck"); err == nil {
		t.Fatal("charge answered TRYAGAIN past every attempt succeeded")
	}
	waitDrained(t, s, 5*time.Second)
	if got, _ := srv.Do("GET", "stuck"); got != "5" {
		t.Fatalf("stuck = %s after the replay, want 5 (once)", got)
	}
	if st := s.Stats(); st.Buffered != 5 || st.Replayed != 5 || st.Lost != 0 {
		t.Fatalf("stats %+v, want 5 buffered and replayed", st)
	}
}
