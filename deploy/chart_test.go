package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kubectl-validate/pkg/cmd"
	"sigs.k8s.io/kubectl-validate/pkg/openapiclient"
	"sigs.k8s.io/kubectl-validate/pkg/validator"
	sigsyaml "sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "regenerate deploy/budgetgen-ratelimit from the Helm chart")

const (
	chartDir      = "helm/budgetgen-ratelimit"
	exampleValues = chartDir + "/ci/example-values.yaml"
	// baseDir is the kustomize base: the chart rendered with baseValues.
	baseDir    = "budgetgen-ratelimit"
	baseValues = "budgetgen-ratelimit/values.yaml"
	// k8sVersion of the built-in schemas kubectl-validate carries.
	k8sVersion = "1.32"
)

// helm returns the helm binary: hack/install-deps.sh builds it into
// .tools/bin; PATH is the fallback. Under CI a missing helm fails the test.
func helm(t *testing.T) string {
	t.Helper()
	if p, err := filepath.Abs("../.tools/bin/helm"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("helm is not installed: run hack/install-deps.sh")
	}
	t.Skip("helm is not installed (hack/install-deps.sh builds it into .tools/bin)")
	return ""
}

// trackInputs reads every file below the given directories, so go test's
// cache, which sees only the files the test process itself opens, reruns
// the tests when one changes (helm reads them in a child process).
func trackInputs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			_, err = os.ReadFile(p)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func runHelm(t *testing.T, args ...string) []byte {
	t.Helper()
	trackInputs(t, chartDir, "envoy-gateway")
	cmd := exec.Command(helm(t), args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.Bytes()
}

// helmTemplate renders the chart as release budgetgen-ratelimit in
// envoy-gateway-system with the given values files.
func helmTemplate(t *testing.T, values ...string) []byte {
	t.Helper()
	args := []string{"template", "budgetgen-ratelimit", chartDir, "--namespace", namespace}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	return runHelm(t, args...)
}

// splitDocs returns the non-empty YAML documents of a stream.
func splitDocs(t *testing.T, stream []byte) [][]byte {
	t.Helper()
	r := yaml.NewYAMLReader(bufioReader(stream))
	var out [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("rendered document does not parse: %v\n%s", err, doc)
		}
		if len(m) > 0 {
			out = append(out, doc)
		}
	}
}

// strictValidator checks documents against Kubernetes' built-in schemas and
// the CRDs in testdata/crds (cert-manager, ServiceMonitor), rejecting unknown
// fields: what kubeconform -strict does, offline.
func strictValidator(t *testing.T) *validator.Validator {
	t.Helper()
	files := fstest.MapFS{}
	crds, err := filepath.Glob("testdata/crds/*.yaml")
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in testdata/crds: %v", err)
	}
	for _, f := range crds {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(f)] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	v, err := validator.New(openapiclient.NewComposite(openapiclient.NewHardcodedBuiltins(k8sVersion), openapiclient.NewLocalCRDFiles(files)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func validateAll(t *testing.T, where string, docs [][]byte) map[string]int {
	t.Helper()
	v := strictValidator(t)
	kinds := map[string]int{}
	for _, doc := range docs {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		kinds[m.Kind]++
		if err := cmd.ValidateDocument(doc, v); err != nil {
			t.Errorf("%s: %s %s does not validate: %v", where, m.Kind, m.Metadata.Name, err)
		}
	}
	return kinds
}

// TestChartLint: helm lint --strict, with the example values and the kustomize
// base's (the defaults with config.create=false; the defaults alone are refused,
// TestChartRefuses).
func TestChartLint(t *testing.T) {
	runHelm(t, "lint", "--strict", chartDir, "--namespace", namespace, "--values", baseValues)
	runHelm(t, "lint", "--strict", chartDir, "--namespace", namespace, "--values", exampleValues)
}

// helmRefuses runs helm template with args and wants it to fail saying want.
func helmRefuses(t *testing.T, want string, args ...string) {
	t.Helper()
	trackInputs(t, chartDir)
	cmd := exec.Command(helm(t), append([]string{"template", "x", chartDir, "--namespace", namespace}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("helm template %s: err = %v, want a refusal saying %q; output:\n%s", strings.Join(args, " "), err, want, out)
	}
}

// TestChartRefuses: values that would install a service that cannot start,
// or block node drains, are refused at helm install, with the reason. The budget map: the service
// does not start without a valid one at BUDGET_MAP_PATH, and Envoy Gateway's
// rate limit Deployment mounts the same ConfigMap, so the chart's defaults
// (config.create with an empty budgetMap) would stop both.
func TestChartRefuses(t *testing.T) {
	const noMap = "config.budgetMap must hold the budget map"
	helmRefuses(t, noMap)
	helmRefuses(t, noMap, "--set-string", "config.budgetMap=# from budgetgen render --budget-map")
	helmRefuses(t, noMap, "--set-string", "config.budgetMap=kind: BudgetSet")
	// A PodDisruptionBudget that allows no eviction: node drains would block.
	const pdb = "podDisruptionBudget.minAvailable (1) must be below replicas (1)"
	helmRefuses(t, pdb, "--values", exampleValues, "--set", "replicas=1")
	helmRefuses(t, "podDisruptionBudget.minAvailable (2) must be below replicas (2)", "--values", exampleValues, "--set", "podDisruptionBudget.minAvailable=2")
	runHelm(t, "template", "x", chartDir, "--values", exampleValues, "--set", "replicas=1", "--set", "podDisruptionBudget.enabled=false")
	runHelm(t, "template", "x", chartDir, "--values", exampleValues, "--set", "replicas=3", "--set", "podDisruptionBudget.minAvailable=2")
}

// TestChartTemplateValidates: helm template with the example values (every
// optional object on) renders objects that validate strictly against the
// Kubernetes schemas and the CRDs they use.
func TestChartTemplateValidates(t *testing.T) {
	docs := splitDocs(t, helmTemplate(t, exampleValues))
	kinds := validateAll(t, "helm template (example values)", docs)
	want := map[string]int{"Deployment": 1, "Service": 1, "ConfigMap": 2, "PodDisruptionBudget": 1, "NetworkPolicy": 1,
		"Certificate": 3, "Issuer": 2, "ServiceMonitor": 1, "PrometheusRule": 1}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("rendered %d %s, want %d (all: %v)", kinds[k], k, n, kinds)
		}
	}
}

// TestChartValuesFilesValidate: helm lint --strict and helm template with
// every values file of the chart's ci directory (the example, the embedded
// store, TLS without cert-manager) and the kustomize base's defaults render
// objects that validate strictly against the Kubernetes schemas.
func TestChartValuesFilesValidate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("values files %v: %v", files, err)
	}
	for _, f := range append(files, baseValues) {
		runHelm(t, "lint", "--strict", chartDir, "--namespace", namespace, "--values", f)
		if kinds := validateAll(t, "helm template --values "+f, splitDocs(t, helmTemplate(t, f))); kinds["Deployment"] != 1 {
			t.Errorf("%s: rendered %v", f, kinds)
		}
	}
}

// TestKustomizeBaseMatchesChart: deploy/budgetgen-ratelimit (the kustomize
// base) is the chart rendered with its values file; regenerate with -update.
func TestKustomizeBaseMatchesChart(t *testing.T) {
	rendered := helmTemplate(t, baseValues)
	path := filepath.Join(baseDir, "budgetgen-ratelimit.yaml")
	header := "# Code generated by `go test ./deploy -update` from deploy/helm/budgetgen-ratelimit\n# with deploy/budgetgen-ratelimit/values.yaml. DO NOT EDIT.\n"
	want := []byte(header + string(rendered))
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the chart's render: go test ./deploy -update", path)
	}
	validateAll(t, path, splitDocs(t, rendered))
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// TestChartValuesSchema: values.schema.json names every key, so a typo in a
// values file fails helm install instead of being ignored (a misspelt
// valkey.authKey would leave Valkey's password unused, a misspelt
// networkPolicy.grpcFrom would leave the default peers), and env may not
// override what the chart sets from other values nor carry a password as a
// literal in the Deployment.
func TestChartValuesSchema(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"replica=3", "additional properties 'replica' not allowed"},
		{"valkey.authkey=password", "additional properties 'authkey' not allowed"},
		{"networkPolicy.grpcfrom[0].podSelector.matchLabels.app=x", "additional properties 'grpcfrom' not allowed"},
		{"tls.certManager.issuerref.name=ca", "additional properties 'issuerref' not allowed"},
		{"serviceMonitor.enable=true", "additional properties 'enable' not allowed"},
		{"valkey.type=redis", "valkey/type"},
		{"tls.mode=strict", "value must be one of 'mutual', 'server', 'disabled'"},
		{"ports.grpc=0", "ports/grpc"},
		{"env.REDIS_AUTH=hunter2", "invalid propertyName 'REDIS_AUTH'"},
		{"env.GRPC_SERVER_USE_TLS=false", "invalid propertyName 'GRPC_SERVER_USE_TLS'"},
		{"env.REDIS_URL=", "invalid propertyName 'REDIS_URL'"},
	} {
		helmRefuses(t, c.want, "--values", exampleValues, "--set", c.set)
	}
	// Settings the chart leaves to env are accepted.
	runHelm(t, "template", "x", chartDir, "--values", exampleValues, "--set", "env.FAILURE_POLICY=deny", "--set", "env.CACHE_KEY_PREFIX=budgets")
}
