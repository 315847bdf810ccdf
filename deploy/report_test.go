package deploy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/budgetgen/budgetgen/internal/cli"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestReportCronJob: deploy/report renders a weekly CronJob whose three
// steps are budgetgen report commands the CLI accepts, writing JSON and HTML
// onto a volume, with a NetworkPolicy that lets exactly its pods reach Valkey.
func TestReportCronJob(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), "report")
	if err != nil {
		t.Fatalf("kustomize build deploy/report: %v", err)
	}
	objs := map[string][]byte{}
	var specCM string
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetNamespace() != namespace {
			t.Errorf("%s/%s in namespace %q", r.GetKind(), r.GetName(), r.GetNamespace())
		}
		name := r.GetName()
		if r.GetKind() == "ConfigMap" && strings.HasPrefix(name, "budgetgen-report-spec-") {
			specCM, name = name, "budgetgen-report-spec"
		}
		objs[r.GetKind()+"/"+name] = y
	}
	for _, id := range []string{"CronJob/budgetgen-weekly-report", "PersistentVolumeClaim/budgetgen-reports", "NetworkPolicy/valkey-from-budgetgen-report", "ConfigMap/budgetgen-report-spec"} {
		if objs[id] == nil {
			t.Fatalf("missing %s (have %v)", id, keys(objs))
		}
	}
	var cj batchv1.CronJob
	strict(t, "CronJob", objs["CronJob/budgetgen-weekly-report"], &cj)
	if cj.Spec.Schedule != "30 0 * * 1" || cj.Spec.TimeZone == nil || *cj.Spec.TimeZone != "Etc/UTC" || cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("schedule %q tz %v policy %q", cj.Spec.Schedule, cj.Spec.TimeZone, cj.Spec.ConcurrencyPolicy)
	}
	pod := cj.Spec.JobTemplate.Spec.Template
	// The spec volume is the generated ConfigMap (kustomize renamed it with its hash).
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols["spec"]; v.ConfigMap == nil || v.ConfigMap.Name != specCM {
		t.Errorf("spec volume %+v, want ConfigMap %s", v, specCM)
	}
	if v := vols["reports"]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "budgetgen-reports" {
		t.Errorf("reports volume %+v", v)
	}
	// The spec shipped is the example, and it loads.
	shipped, _ := os.ReadFile("report/budgets.yaml")
	example, _ := os.ReadFile("../examples/budgets.yaml")
	if !bytes.Equal(shipped, example) {
		t.Error("deploy/report/budgets.yaml drifted from examples/budgets.yaml")
	}
	if _, err := spec.Load(shipped, "budgets.yaml"); err != nil {
		t.Fatal(err)
	}

	// The NetworkPolicy admits the job's pods to Valkey's port.
	var np networkingv1.NetworkPolicy
	strict(t, "NetworkPolicy", objs["NetworkPolicy/valkey-from-budgetgen-report"], &np)
	if !subset(np.Spec.PodSelector.MatchLabels, map[string]string{"app.kubernetes.io/name": "valkey"}) ||
		len(np.Spec.Ingress) != 1 || !subset(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, pod.Labels) || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 6379 {
		t.Errorf("network policy %+v does not admit pods labelled %v", np.Spec, pod.Labels)
	}

	// Each step is a budgetgen report the CLI accepts: run it here against a
	// dead Valkey; it must fail connecting (exit 1), not on its flags (exit 2).
	steps := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	formats := map[string]string{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	for _, c := range steps {
		if c.Image != "ghcr.io/YOUR_ORG/budgetgen:v0.1.0" || c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
			t.Errorf("container %s: image %s, security %+v", c.Name, c.Image, c.SecurityContext)
		}
		args := append([]string{}, c.Args...)
		if args[0] != "report" {
			t.Fatalf("%s runs %v", c.Name, args)
		}
		for i := range args {
			switch {
			case i > 0 && args[i-1] == "--valkey":
				if args[i] != "valkey.envoy-gateway-system.svc.cluster.local:6379" {
					t.Errorf("%s: --valkey %s", c.Name, args[i])
				}
				args[i] = dead
			case i > 0 && args[i-1] == "--spec":
				if args[i] != "/spec/budgets.yaml" {
					t.Errorf("%s: --spec %s", c.Name, args[i])
				}
				args[i] = "report/budgets.yaml"
			case i > 0 && args[i-1] == "--format":
				formats[args[i]] = c.Name
			case i > 0 && args[i-1] == "-o":
				if !strings.HasPrefix(args[i], "/reports/report-{to}.") {
					t.Errorf("%s: -o %s", c.Name, args[i])
				}
				args[i] = filepath.Join(t.TempDir(), filepath.Base(args[i]))
			}
		}
		var stdout, stderr bytes.Buffer
		code := cli.Run(context.Background(), append(args, "--dial-timeout", "300ms"), strings.NewReader(""), &stdout, &stderr)
		if code != cli.ExitFailure || !strings.Contains(stderr.String(), "unreachable") {
			t.Errorf("%s: %v: exit %d: %s", c.Name, args, code, stderr.String())
		}
	}
	if fmt.Sprint(formats) != "map[html:html json:json text:text]" {
		t.Errorf("formats %v", formats)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
