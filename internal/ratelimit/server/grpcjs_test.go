package server

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// grpcJSModules finds the node_modules holding @grpc/grpc-js that
// hack/install-deps.sh installs into .tools/node.
func grpcJSModules(t *testing.T) (node, modules string) {
	node, err := exec.LookPath("node")
	root, _ := filepath.Abs("../../..")
	modules = filepath.Join(root, ".tools", "node", "node_modules")
	if err == nil {
		if _, serr := os.Stat(filepath.Join(modules, "@grpc", "grpc-js", "package.json")); serr == nil {
			return node, modules
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("node and @grpc/grpc-js in %s are required under CI=true (hack/install-deps.sh installs them)", modules)
	}
	t.Skip("node or @grpc/grpc-js not installed (hack/install-deps.sh installs them into .tools/node)")
	return "", ""
}

// TestGRPCJSClient drives the gRPC port with a non-Go implementation,
// @grpc/grpc-js: sequential, multiplexed, large, compressed, cancelled and
// deadline-bound calls, keepalive PINGs without calls, and GOAWAY at
// shutdown; on both transports.
func TestGRPCJSClient(t *testing.T) { forEachTransportParallel(t, testGRPCJSClient) }

func testGRPCJSClient(t *testing.T, transport string) {
	node, modules := grpcJSModules(t)
	r := start(t, Options{Transport: transport}, nil)
	g, _, _, _ := r.srv.Addrs()
	small, err := proto.Marshal(rlReq("js"))
	if err != nil {
		t.Fatal(err)
	}
	big := &rlpb.RateLimitRequest{Domain: "d"}
	for i := 0; i < 400; i++ { // about 800 KB: many DATA frames each way of the flow control
		big.Descriptors = append(big.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{
			{Key: "user", Value: fmt.Sprintf("%04d%s", i, strings.Repeat("v", 2000))}}})
	}
	large, err := proto.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	largePath := filepath.Join(t.TempDir(), "large.bin") // too large for the environment
	if err := os.WriteFile(largePath, large, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/grpcjs/client.js")
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "RL_ADDR="+g.String(),
		"RL_SMALL_HEX="+hex.EncodeToString(small), "RL_LARGE_FILE="+largePath,
		"GRPC_TRACE=transport", "GRPC_VERBOSITY=DEBUG")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		if line == "ready for shutdown" {
			r.stop() // graceful: GOAWAY, drain, close
		}
	}
	err = cmd.Wait()
	out := strings.Join(lines, "\n")
	if err != nil {
		t.Fatalf("grpc-js client: %v\n%s\n%s", err, out, tail(stderr.String(), 3000))
	}
	for _, want := range []string{"ok sequential", "ok multiplexed", "ok large", "ok compressed", "ok cancelled", "ok deadline", "ok keepalive", "ok shutdown"} {
		if !strings.Contains(out, want) {
			t.Errorf("grpc-js: no %q\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "connection closed by GOAWAY with code 0") {
		t.Errorf("grpc-js did not see a GOAWAY NO_ERROR at shutdown:\n%s", tail(stderr.String(), 3000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
