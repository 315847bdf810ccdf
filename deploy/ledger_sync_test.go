package deploy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/budgetgen/budgetgen/internal/cli"
)

// TestLedgerSyncCronJob: deploy/ledger-sync renders an hourly CronJob whose
// one step is a budgetgen ledger sync the CLI accepts, with the PostgreSQL
// password from a Secret (never in the DSN), and a NetworkPolicy that lets
// its pods reach Valkey.
func TestLedgerSyncCronJob(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), "ledger-sync")
	if err != nil {
		t.Fatalf("kustomize build deploy/ledger-sync: %v", err)
	}
	objs := map[string][]byte{}
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetNamespace() != namespace {
			t.Errorf("%s/%s in namespace %q", r.GetKind(), r.GetName(), r.GetNamespace())
		}
		objs[r.GetKind()+"/"+r.GetName()] = y
	}
	var cj batchv1.CronJob
	strict(t, "CronJob", objs["CronJob/budgetgen-ledger-sync"], &cj)
	if cj.Spec.Schedule != "17 * * * *" || cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent || cj.Spec.TimeZone == nil {
		t.Errorf("schedule %q policy %q", cj.Spec.Schedule, cj.Spec.ConcurrencyPolicy)
	}
	pod := cj.Spec.JobTemplate.Spec.Template
	var np networkingv1.NetworkPolicy
	strict(t, "NetworkPolicy", objs["NetworkPolicy/valkey-from-budgetgen-ledger-sync"], &np)
	if len(np.Spec.Ingress) != 1 || !subset(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, pod.Labels) || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 6379 {
		t.Errorf("network policy %+v does not admit pods labelled %v", np.Spec, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers %+v", pod.Spec.Containers)
	}
	c := pod.Spec.Containers[0]
	if len(c.Env) != 1 || c.Env[0].Name != "PGPASSWORD" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.SecretKeyRef == nil {
		t.Errorf("the password must come from a Secret: %+v", c.Env)
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("security %+v", c.SecurityContext)
	}
	// The step is a ledger sync the CLI accepts: against a dead Valkey and a
	// dead PostgreSQL it fails connecting (exit 1), not on its flags (exit 2).
	dead := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	args := append([]string{}, c.Args...)
	if fmt.Sprint(args[:2]) != "[ledger sync]" {
		t.Fatalf("runs %v", args)
	}
	for i := range args {
		switch {
		case i > 0 && args[i-1] == "--valkey":
			args[i] = dead()
		case i > 0 && args[i-1] == "--postgres":
			if strings.Contains(args[i], ":@") || strings.Count(args[i], "@") != 1 || strings.Contains(args[i], "password") {
				t.Errorf("--postgres %s", args[i])
			}
			args[i] = "postgres://budgetgen@" + dead() + "/ledger?sslmode=disable&connect_timeout=1"
		}
	}
	var stdout, stderr bytes.Buffer
	code := cli.Run(context.Background(), append(args, "--dial-timeout", "1s"), strings.NewReader(""), &stdout, &stderr)
	if code != cli.ExitFailure || !strings.Contains(stderr.String(), "unreachable") {
		t.Errorf("%v: exit %d: %s", args, code, stderr.String())
	}
}
