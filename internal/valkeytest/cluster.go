package valkeytest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Cluster is a local Valkey cluster of primaries owned by a test.
type Cluster struct {
	Nodes []*Server
	Addrs []string
}

// StartCluster starts n primaries with --cluster-enabled, joins them with
// `valkey-cli --cluster create` (slots split evenly, no replicas) and waits
// until every node reports cluster_state:ok and knows all n nodes (bounded).
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	Binary(t, "valkey-cli")
	c := &Cluster{}
	for i := 0; i < n; i++ {
		s := Start(t, Options{Args: []string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
		}})
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "valkey-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("valkey-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// WaitOK waits until every node reports cluster_state:ok, all slots assigned
// and all nodes known.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok := true
		for _, a := range c.Addrs {
			info, err := Do(a, "CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, "cluster_slots_ok:16384") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(c.Addrs))) {
				ok = false
				last = fmt.Sprintf("%s: %v %s", a, err, info)
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ok after %s: %s", timeout, last)
}

// NodeID returns the cluster node ID of the node at addr.
func NodeID(addr string) (string, error) {
	return Do(addr, "CLUSTER", "MYID")
}

// SlotOwner returns the address of the node that owns slot, as node addr sees it.
func SlotOwner(addr string, slot int) (string, error) {
	nodes, err := Do(addr, "CLUSTER", "NODES")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 {
			continue
		}
		hostport := f[1]
		if i := strings.IndexByte(hostport, '@'); i >= 0 {
			hostport = hostport[:i]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // migrating/importing markers
			}
			lo, hi, _ := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			if hi != "" {
				b, _ = strconv.Atoi(hi)
			}
			if err1 == nil && slot >= a && slot <= b {
				return hostport, nil
			}
		}
	}
	return "", fmt.Errorf("slot %d has no owner in CLUSTER NODES of %s", slot, addr)
}

// SentinelSet is a primary, one replica and three sentinels monitoring them.
type SentinelSet struct {
	MasterSet string
	Primary   *Server
	Replica   *Server
	// Sentinels are the sentinels' addresses.
	Sentinels []string
}

// StartSentinel starts a primary, a replica of it and three valkey-sentinel
// processes (quorum 2, down-after 1 s, failover-timeout 5 s) and waits until
// the replica is in sync and the sentinels know each other (bounded).
func StartSentinel(t testing.TB) *SentinelSet {
	t.Helper()
	bin := Binary(t, "valkey-sentinel")
	set := &SentinelSet{MasterSet: "budgetgen"}
	set.Primary = Start(t, Options{})
	set.Replica = Start(t, Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(set.Primary.Port)}})
	if err := waitFor(15*time.Second, func() (bool, string) {
		info, err := set.Replica.Do("INFO", "replication")
		return err == nil && strings.Contains(info, "master_link_status:up"), info
	}); err != nil {
		t.Fatalf("replica not in sync: %v", err)
	}
	for i := 0; i < 3; i++ {
		port := FreePort(t)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 5000
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "sentinel.log"), set.MasterSet, set.Primary.Port, set.MasterSet, set.MasterSet, set.MasterSet)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, conf)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start valkey-sentinel: %v", err)
		}
		go func() { _ = cmd.Wait() }()
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := WaitReady(addr, 10*time.Second); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel %s not ready: %v\n%s", addr, err, log)
		}
		set.Sentinels = append(set.Sentinels, addr)
	}
	// Sentinels discover each other and the replica through hello messages
	// (every 2 s); a failover needs both.
	if err := waitFor(20*time.Second, func() (bool, string) {
		for _, a := range set.Sentinels {
			out, err := Do(a, "SENTINEL", "MASTER", set.MasterSet)
			if err != nil || !strings.Contains(out, "num-other-sentinels\n2") || !strings.Contains(out, "num-slaves\n1") {
				return false, fmt.Sprintf("%s: %v %s", a, err, out)
			}
		}
		return true, ""
	}); err != nil {
		t.Fatalf("sentinels not ready: %v", err)
	}
	return set
}

// MasterAddr asks the sentinels for the current primary's address.
func (s *SentinelSet) MasterAddr() (string, error) {
	var last error
	for _, a := range s.Sentinels {
		out, err := Do(a, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterSet)
		if err != nil {
			last = err
			continue
		}
		host, port, ok := strings.Cut(out, "\n")
		if !ok {
			last = fmt.Errorf("reply %q", out)
			continue
		}
		return net.JoinHostPort(host, port), nil
	}
	return "", last
}

func waitFor(timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return nil
		}
		last = why
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timeout after %s: %s", timeout, last)
}
