package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
)

type instruction struct {
	cmd  string // upper case
	args string
}

type stage struct {
	base, name string
	ins        []instruction
}

type dockerfile struct {
	args   map[string]string // global ARG defaults (before the first FROM)
	stages []stage
}

// parseDockerfile reads the subset of the Dockerfile syntax the files use:
// comments, line continuations, one instruction per logical line.
func parseDockerfile(t *testing.T, file string) dockerfile {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df := dockerfile{args: map[string]string{}}
	sc := bufio.NewScanner(f)
	var logical strings.Builder
	flush := func() {
		line := strings.TrimSpace(logical.String())
		logical.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(in.args)
			s := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			df.stages = append(df.stages, s)
		case len(df.stages) == 0:
			if in.cmd == "ARG" {
				k, v, _ := strings.Cut(in.args, "=")
				df.args[k] = v
			}
		default:
			s := &df.stages[len(df.stages)-1]
			s.ins = append(s.ins, in)
		}
	}
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			logical.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		logical.WriteString(l)
		flush()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	if len(df.stages) < 2 {
		t.Fatalf("%s: want a multi-stage build, got %d stage(s)", file, len(df.stages))
	}
	return df
}

var (
	goDirective = regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`)
	outputFlag  = regexp.MustCompile(`\s-o\s+(\S+)`)
	xFlag       = regexp.MustCompile(`-X\s+([^=\s"]+)\.([A-Za-z_]\w*)=`)
)

func checkDockerfile(t *testing.T, df dockerfile, pkg, binary string) {
	root := ".."
	ignore := readDockerignore(t, filepath.Join(root, ".dockerignore"))

	// Go version: the builder image is at least go.mod's go directive.
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := goDirective.FindStringSubmatch(string(gomod))
	gv := strings.Split(df.args["GO_VERSION"], ".")
	if m == nil || len(gv) < 2 || atoi(gv[0]) < atoi(m[1]) || (atoi(gv[0]) == atoi(m[1]) && atoi(gv[1]) < atoi(m[2])) {
		t.Errorf("GO_VERSION %q is older than go.mod's go %s.%s", df.args["GO_VERSION"], m[1], m[2])
	}

	build := df.stages[0]
	var copied []string
	var buildCmd string
	for _, in := range build.ins {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			for _, src := range f[:len(f)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				p := path.Clean(strings.TrimSuffix(src, "/"))
				if _, err := os.Stat(filepath.Join(root, p)); err != nil {
					t.Errorf("COPY %s: %v", src, err)
				}
				if ignored(ignore, p) {
					t.Errorf("COPY %s: excluded by .dockerignore", src)
				}
				copied = append(copied, p)
			}
		case "RUN":
			if strings.Contains(in.args, "go build") {
				buildCmd = in.args
			}
		}
	}
	if buildCmd == "" {
		t.Fatal("no go build in the first stage")
	}
	if !strings.Contains(buildCmd, "CGO_ENABLED=0") {
		t.Error("go build without CGO_ENABLED=0: the binary would not be static")
	}
	if !strings.Contains(buildCmd, " "+pkg) {
		t.Errorf("go build does not build %s", pkg)
	}
	out := outputFlag.FindStringSubmatch(buildCmd)
	if out == nil {
		t.Fatal("go build without -o")
	}
	for _, x := range xFlag.FindAllStringSubmatch(buildCmd, -1) {
		checkVar(t, root, x[1], x[2])
	}

	// Every package (and embedded file) the binary needs is in the context.
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if eq .Module.Path "github.com/budgetgen/budgetgen"}}{{.Dir}}|{{join .EmbedFiles ","}}{{end}}{{end}}`, pkg)
	cmd.Dir = root
	listing, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v (does the package exist?)", pkg, err)
	}
	abs, _ := filepath.Abs(root)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(listing)), "\n") {
		dir, embeds, _ := strings.Cut(line, "|")
		rel, err := filepath.Rel(abs, dir)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		n++
		if !under(copied, rel) || ignored(ignore, rel) {
			t.Errorf("package dir %s is not in the build context the Dockerfile copies", rel)
		}
		for _, e := range strings.Split(embeds, ",") {
			if e != "" && ignored(ignore, path.Join(rel, e)) {
				t.Errorf("embedded file %s/%s is excluded by .dockerignore", rel, e)
			}
		}
	}
	if n == 0 {
		t.Errorf("go list found no package of the module under %s", pkg)
	}

	// Final stage: small static base, the binary where ENTRYPOINT expects it,
	// a non-root numeric user.
	final := df.stages[len(df.stages)-1]
	if !strings.HasPrefix(final.base, "gcr.io/distroless/static") && final.base != "scratch" {
		t.Errorf("final base %s is not distroless/static or scratch", final.base)
	}
	var dest, entry, user string
	for _, in := range final.ins {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+build.name && f[1] == out[1] {
				dest = f[2]
			}
		case "ENTRYPOINT":
			var ep []string
			if err := json.Unmarshal([]byte(in.args), &ep); err != nil || len(ep) == 0 {
				t.Errorf("ENTRYPOINT %s is not an exec-form list", in.args)
			} else {
				entry = ep[0]
			}
		case "USER":
			user = in.args
		}
	}
	if dest != binary || entry != binary {
		t.Errorf("binary copied to %q, ENTRYPOINT %q; want both %q", dest, entry, binary)
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q: want a numeric non-root uid (Kubernetes runAsNonRoot checks it)", user)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// checkVar checks that importPath.name is a package-level string variable.
func checkVar(t *testing.T, root, importPath, name string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.Dir}}", importPath)
	cmd.Dir = root
	dir, err := cmd.Output()
	if err != nil {
		t.Errorf("-X %s.%s: package not found: %v", importPath, name, err)
		return
	}
	decl := regexp.MustCompile(`(?m)^var ` + name + `\b|^\s+` + name + `\s+(string\s*)?=`)
	files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(dir)), "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, _ := os.ReadFile(f)
		if decl.Match(b) {
			return
		}
	}
	t.Errorf("-X %s.%s: no such variable", importPath, name)
}

func under(dirs []string, p string) bool {
	for _, d := range dirs {
		if d == "." || p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func readDockerignore(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			pats = append(pats, path.Clean(l))
		}
	}
	return pats
}

// ignored applies .dockerignore patterns (no negations are used) to p and to
// each of its parent directories; "**/" matches any number of directories.
func ignored(pats []string, p string) bool {
	parts := strings.Split(p, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		for _, pat := range pats {
			if strings.HasPrefix(pat, "**/") {
				rest := strings.TrimPrefix(pat, "**/")
				for j := 0; j < i; j++ {
					if ok, _ := path.Match(rest, strings.Join(parts[j:i], "/")); ok {
						return true
					}
				}
				continue
			}
			if ok, _ := path.Match(pat, prefix); ok {
				return true
			}
		}
	}
	return false
}

func TestDockerignoreMatcher(t *testing.T) {
	pats := []string{".git", "docs", "**/testdata", "**/*_test.go", "*.test"}
	for p, want := range map[string]bool{
		".git/config": true, "docs/x.md": true, "pkg/a/testdata/f": true, "pkg/a/b_test.go": true, "x.test": true,
		"pkg/a/b.go": false, "cmd/ratelimit": false, "templates/x.yaml": false, "pkg/docs/x.go": false,
	} {
		if got := ignored(pats, p); got != want {
			t.Errorf("ignored(%q) = %v, want %v", p, got, want)
		}
	}
}

// stageNamed returns the stage called name, or the last stage for "".
func stageNamed(t *testing.T, df dockerfile, name string) stage {
	t.Helper()
	if name == "" {
		return df.stages[len(df.stages)-1]
	}
	for _, s := range df.stages {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no stage %s", name)
	return stage{}
}

// TestRateLimitImagesKeepState: with no REDIS_URL the service runs the
// embedded store and refuses to start unless it can write its snapshot
// (startSnapshots in internal/ratelimit/service/service.go), by default at
// settings.DefaultSnapshotPath: under $XDG_STATE_HOME, else $HOME. The
// images set no HOME, so the runtime takes it from the image's /etc/passwd,
// where uid 65534 is nobody with home /nonexistent, which nobody can
// create (distroless's passwd entries:
// https://github.com/GoogleContainerTools/distroless/blob/main/common/BUILD.bazel). So every image of the service sets XDG_STATE_HOME and creates
// its budgetgen directory owned by the image's user: the one built from
// source and the release image GoReleaser builds (.goreleaser.yaml).
func TestRateLimitImagesKeepState(t *testing.T) {
	for _, c := range []struct{ file, stage string }{
		{"Dockerfile.ratelimit", ""},
		{"Dockerfile.release", "ratelimit"},
	} {
		t.Run(c.file, func(t *testing.T) {
			st := stageNamed(t, parseDockerfile(t, filepath.Join("..", c.file)), c.stage)
			env := map[string]string{"HOME": "/nonexistent"}
			var user string
			owned := map[string]string{} // directory -> --chown of the COPY that creates it
			for _, in := range st.ins {
				f := strings.Fields(in.args)
				switch in.cmd {
				case "ENV":
					for _, kv := range f {
						if k, v, ok := strings.Cut(kv, "="); ok {
							env[k] = v
						}
					}
				case "USER":
					user = in.args
				case "COPY":
					chown := ""
					for _, a := range f {
						if v, ok := strings.CutPrefix(a, "--chown="); ok {
							chown = v
						}
					}
					owned[path.Clean(f[len(f)-1])] = chown
				}
			}
			snap := settings.DefaultSnapshotPath(func(k string) string { return env[k] }, 8081)
			dir := path.Dir(snap)
			if chown, ok := owned[dir]; !ok || chown != user {
				t.Errorf("the embedded store's default snapshot %s: its directory %s is not created owned by the image's user %s (COPY --chown=%s ... %s; ENV XDG_STATE_HOME): the service would not start without REDIS_URL", snap, dir, user, user, dir)
			}
		})
	}
}
