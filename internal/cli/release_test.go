package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// goreleaserConfig is the part of .goreleaser.yaml the tests read.
type goreleaserConfig struct {
	Version int `json:"version"`
	Builds  []struct {
		ID      string   `json:"id"`
		Main    string   `json:"main"`
		Binary  string   `json:"binary"`
		Env     []string `json:"env"`
		Goos    []string `json:"goos"`
		Goarch  []string `json:"goarch"`
		Flags   []string `json:"flags"`
		Ldflags []string `json:"ldflags"`
	} `json:"builds"`
	Archives []struct {
		ID           string `json:"id"`
		NameTemplate string `json:"name_template"`
	} `json:"archives"`
	Checksum struct {
		NameTemplate string `json:"name_template"`
		Algorithm    string `json:"algorithm"`
	} `json:"checksum"`
	Dockers []struct {
		ID         string   `json:"id"`
		IDs        []string `json:"ids"`
		Dockerfile string   `json:"dockerfile"`
		Flags      []string `json:"flags"`
	} `json:"dockers_v2"`
}

// TestReleaseConfig checks .goreleaser.yaml without running GoReleaser
// (hack/lint.sh runs `goreleaser check` at the pinned version, and
// docs/release.md has a snapshot build's timings): both programs are built
// static, trimmed and stamped with the release version; every archive has a
// SHA-256 line in checksums.txt; every image is built from a stage of
// Dockerfile.release holding its own binary.
func TestReleaseConfig(t *testing.T) {
	var cfg goreleaserConfig
	readYAML(t, "../../.goreleaser.yaml", &cfg)
	if cfg.Version != 2 || cfg.Checksum.Algorithm != "sha256" || cfg.Checksum.NameTemplate != "checksums.txt" {
		t.Fatalf("config version %d, checksum %+v", cfg.Version, cfg.Checksum)
	}
	binaries := map[string]bool{}
	for _, b := range cfg.Builds {
		binaries[b.Binary] = true
		ld := strings.Join(b.Ldflags, " ")
		if !slicesHas(b.Env, "CGO_ENABLED=0") || !slicesHas(b.Flags, "-trimpath") || !strings.Contains(ld, "-s -w") ||
			!strings.Contains(ld, "internal/buildinfo.Version={{ .Tag }}") || !slicesHas(b.Goos, "linux") || !slicesHas(b.Goarch, "arm64") {
			t.Errorf("build %s: env %v flags %v ldflags %q goos %v goarch %v", b.ID, b.Env, b.Flags, ld, b.Goos, b.Goarch)
		}
		if _, err := os.Stat(filepath.Join("../..", b.Main, "main.go")); err != nil {
			t.Errorf("build %s: main %s: %v", b.ID, b.Main, err)
		}
	}
	if !binaries["budgetgen"] || !binaries["ratelimit"] {
		t.Errorf("binaries %v", binaries)
	}
	dockerfile, err := os.ReadFile("../../Dockerfile.release")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range cfg.Dockers {
		target := strings.TrimPrefix(strings.Join(d.Flags, " "), "--target=")
		stage := regexp.MustCompile(`(?s)FROM \S+ AS ` + regexp.QuoteMeta(target) + `\n(.*?)(\nFROM |$)`).FindSubmatch(dockerfile)
		if d.Dockerfile != "Dockerfile.release" || len(d.IDs) != 1 || d.IDs[0] != target || stage == nil ||
			!bytes.Contains(stage[1], []byte("COPY ${TARGETPLATFORM}/"+target+" /bin/"+target)) || !bytes.Contains(stage[1], []byte(`ENTRYPOINT ["/bin/`+target+`"]`)) {
			t.Errorf("image %s: %+v; stage %q", d.ID, d, stage)
		}
	}
	if len(cfg.Dockers) != 2 {
		t.Errorf("%d images, want budgetgen and ratelimit", len(cfg.Dockers))
	}
	pin := regexp.MustCompile(`(?m)^GORELEASER=github\.com/goreleaser/goreleaser/v2@v\d+\.\d+\.\d+$`)
	for _, f := range []string{"../../hack/release.sh", "../../hack/lint.sh"} {
		b, err := os.ReadFile(f)
		if err != nil || !pin.Match(b) {
			t.Errorf("%s does not pin GoReleaser (%v)", f, err)
		}
	}
}

// TestActionDownloadsPinnedRelease runs action.yml's resolve and download
// steps (bash, curl) against a release served on a loopback port: a
// release-tag ref or the version input selects the download, the archive
// named by .goreleaser.yaml's template is verified against checksums.txt and
// put on PATH, and a tampered archive fails the step. A branch ref selects
// the cached build from source instead (the build steps' conditions).
func TestActionDownloadsPinnedRelease(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "sha256sum", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is required: %v", tool, err)
		}
	}
	steps := actionSteps(t)
	for ref, want := range map[string]string{"v0.2.0": "v0.2.0", "main": "", "v0.2": "", "0123abc": ""} {
		out := runStep(t, steps["Resolve the budgetgen release"].Run, t.TempDir(), "ACTION_REF="+ref, "VERSION=")
		if out["version"] != want {
			t.Errorf("ref %s: version %q, want %q", ref, out["version"], want)
		}
	}
	if out := runStep(t, steps["Resolve the budgetgen release"].Run, t.TempDir(), "ACTION_REF=main", "VERSION=v0.3.1"); out["version"] != "v0.3.1" {
		t.Errorf("version input ignored: %v", out)
	}
	archive := archiveName(t, "0.2.0", "linux", "amd64")
	tgz := tarGz(t, "budgetgen", []byte("#!/bin/sh\necho budgetgen v0.2.0\n"))
	sum := sha256.Sum256(tgz)
	files := map[string][]byte{
		"/v0.2.0/" + archive:        tgz,
		"/v0.2.0/checksums.txt":     []byte(hex.EncodeToString(sum[:]) + "  " + archive + "\n0000  other.tar.gz\n"),
		"/v0.2.1/" + archive:        append(tgz[:len(tgz):len(tgz)], 0),
		"/v0.2.1/checksums.txt":     []byte(hex.EncodeToString(sum[:]) + "  " + archive + "\n"),
		"/v0.2.2/" + archive + ".x": tgz, // the archive this runner needs is missing from checksums.txt
		"/v0.2.2/checksums.txt":     []byte(hex.EncodeToString(sum[:]) + "  " + archive + ".x\n"),
	}
	srv := loopbackServer(t, files)
	download := steps["Download the pinned release"]
	if !strings.Contains(download.If, "steps.resolve.outputs.version != ''") {
		t.Errorf("download step condition %q", download.If)
	}
	tmp := t.TempDir()
	out := runStep(t, download.Run, tmp, "VERSION=v0.2.0", "BUDGETGEN_RELEASES="+srv, "RUNNER_OS=Linux", "RUNNER_ARCH=X64")
	bin := filepath.Join(out["path"], "budgetgen")
	if got, err := exec.Command(bin).Output(); err != nil || string(got) != "budgetgen v0.2.0\n" {
		t.Errorf("downloaded budgetgen at %s: %q %v", bin, got, err)
	}
	for _, bad := range []string{"v0.2.1", "v0.2.2"} {
		if _, err := runStepErr(download.Run, t.TempDir(), "VERSION="+bad, "BUDGETGEN_RELEASES="+srv, "RUNNER_OS=Linux", "RUNNER_ARCH=X64"); err == nil {
			t.Errorf("release %s: a tampered or unlisted archive passed the checksum step", bad)
		}
	}
	for _, name := range []string{"Set up Go", "Locate the Go caches", "Restore the Go caches", "Build budgetgen from source"} {
		if !strings.Contains(steps[name].If, "steps.resolve.outputs.version == ''") {
			t.Errorf("step %q runs with a pinned release (if: %q)", name, steps[name].If)
		}
	}
	cache := steps["Restore the Go caches"]
	if !strings.HasPrefix(cache.Uses, "actions/cache@") || !strings.Contains(cache.With["path"], "steps.gocache.outputs.modcache") ||
		!strings.Contains(cache.With["path"], "steps.gocache.outputs.buildcache") || !strings.Contains(cache.With["key"], "steps.gocache.outputs.key") {
		t.Errorf("cache step %+v", cache)
	}
	if steps["Set up Go"].With["cache"] != "false" || !strings.Contains(steps["Build budgetgen from source"].Run, `-ldflags "-s -w`) {
		t.Errorf("build path: setup-go %v, build %q", steps["Set up Go"].With, steps["Build budgetgen from source"].Run)
	}
}

type actionStep struct {
	Name, If, Uses, Run string
	With                map[string]string
}

func actionSteps(t *testing.T) map[string]actionStep {
	t.Helper()
	var action struct{ Runs struct{ Steps []actionStep } }
	readYAML(t, "../../action.yml", &action)
	out := map[string]actionStep{}
	for _, st := range action.Runs.Steps {
		out[st.Name] = st
	}
	return out
}

// archiveName expands .goreleaser.yaml's budgetgen archive name template.
func archiveName(t *testing.T, version, goos, goarch string) string {
	t.Helper()
	var cfg goreleaserConfig
	readYAML(t, "../../.goreleaser.yaml", &cfg)
	for _, a := range cfg.Archives {
		if a.ID == "budgetgen" {
			return strings.NewReplacer("{{ .Version }}", version, "{{ .Os }}", goos, "{{ .Arch }}", goarch).Replace(a.NameTemplate) + ".tar.gz"
		}
	}
	t.Fatal("no budgetgen archive in .goreleaser.yaml")
	return ""
}

// runStep runs a step's script as the runner would and returns what it wrote
// to GITHUB_OUTPUT (key=value) and GITHUB_PATH (as "path").
func runStep(t *testing.T, script, tmp string, env ...string) map[string]string {
	t.Helper()
	out, err := runStepErr(script, tmp, env...)
	if err != nil {
		t.Fatalf("step failed: %v", err)
	}
	return out
}

func runStepErr(script, tmp string, env ...string) (map[string]string, error) {
	outFile, pathFile := filepath.Join(tmp, "output"), filepath.Join(tmp, "path")
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), append(env, "GITHUB_OUTPUT="+outFile, "GITHUB_PATH="+pathFile, "RUNNER_TEMP="+tmp)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%v: %s", err, b)
	}
	got := map[string]string{}
	b, _ := os.ReadFile(outFile)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	p, _ := os.ReadFile(pathFile)
	got["path"] = strings.TrimSpace(string(p))
	return got, nil
}

func tarGz(t *testing.T, name string, content []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct {
		name string
		data []byte
	}{{name, content}, {"README.md", []byte("readme\n")}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o755, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// loopbackServer serves files on a free 127.0.0.1 port and returns its URL.
func loopbackServer(t *testing.T, files map[string][]byte) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func slicesHas(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
