package main

// Supply-chain guards: the program may depend directly on five modules
// (README, "Security"), and the binary that ships is static.

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// allowedDirectDeps are the only modules the product and its tests may
// require directly. Adding one is a decision for review, not a side effect
// of `go get`: change this list in the same commit.
var allowedDirectDeps = []string{
	"github.com/prometheus/client_golang",
	"golang.org/x/sys",
	"k8s.io/api",
	"k8s.io/apimachinery",
	"k8s.io/client-go",
}

// directRequires returns the modules go.mod requires without an
// "// indirect" comment, in both the block and the one-line form.
func directRequires(gomod string) []string {
	var direct []string
	inBlock := false
	for line := range strings.SplitSeq(gomod, "\n") {
		line = strings.TrimSpace(line)
		code, comment, _ := strings.Cut(line, "//")
		fields := strings.Fields(code)
		switch {
		case inBlock && len(fields) > 0 && fields[0] == ")":
			inBlock = false
			continue
		case len(fields) == 2 && fields[0] == "require" && fields[1] == "(":
			inBlock = true
			continue
		case len(fields) == 3 && fields[0] == "require":
			fields = fields[1:] // require path version
		case inBlock && len(fields) == 2:
		default:
			continue
		}
		if strings.TrimSpace(comment) == "indirect" || strings.HasPrefix(strings.TrimSpace(comment), "indirect;") {
			continue
		}
		direct = append(direct, strings.Trim(fields[0], `"`))
	}
	return direct
}

// notAllowed returns the members of mods that are not in allowedDirectDeps.
func notAllowed(mods []string) []string {
	var extra []string
	for _, m := range mods {
		if !slices.Contains(allowedDirectDeps, m) {
			extra = append(extra, m)
		}
	}
	return extra
}

func TestDirectRequiresParser(t *testing.T) {
	const gomod = `module example.com/m

go 1.26

require golang.org/x/sys v0.50.0
require "k8s.io/api" v0.37.2 // pinned for reasons

require (
	github.com/prometheus/client_golang v1.25.0
	golang.org/x/mod v0.30.0
	github.com/google/uuid v1.6.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect; kept for x
)

exclude example.com/bad v1.0.0
replace example.com/old => example.com/new v1.0.0
`
	want := []string{"golang.org/x/sys", "k8s.io/api", "github.com/prometheus/client_golang", "golang.org/x/mod"}
	if got := directRequires(gomod); !slices.Equal(got, want) {
		t.Errorf("directRequires: got %q; want %q", got, want)
	}
	if got, want := notAllowed(directRequires(gomod)), []string{"golang.org/x/mod"}; !slices.Equal(got, want) {
		t.Errorf("notAllowed: got %q; want %q", got, want)
	}
}

func TestDirectDependenciesInGoMod(t *testing.T) {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	direct := directRequires(string(gomod))
	if !slices.Contains(direct, "k8s.io/client-go") {
		t.Fatalf("direct requirements read from go.mod: got %q; want client-go among them (is the parser broken?)", direct)
	}
	if extra := notAllowed(direct); len(extra) > 0 {
		t.Errorf("go.mod requires %q directly; want only modules from %q", extra, allowedDirectDeps)
	}
}

// goTool returns the path of the go command, or skips the test.
func goTool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not on PATH: %v", err)
	}
	return path
}

// TestImportedModules asks the go command which modules the package and its
// tests import, so an import of a module that go.mod marks "// indirect"
// (go.mod not tidied) is caught too.
func TestImportedModules(t *testing.T) {
	gocmd := goTool(t)
	imports, err := exec.Command(gocmd, "list",
		"-f", `{{join .Imports "\n"}}{{"\n"}}{{join .TestImports "\n"}}{{"\n"}}{{join .XTestImports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list imports: %v\n%s", err, stderrOf(err))
	}
	var nonStd []string
	for p := range strings.FieldsSeq(string(imports)) {
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") && !slices.Contains(nonStd, p) {
			nonStd = append(nonStd, p)
		}
	}
	if len(nonStd) == 0 {
		t.Fatal("no imports outside the standard library; want at least client-go and prometheus")
	}
	out, err := exec.Command(gocmd, append([]string{"list", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}"}, nonStd...)...).Output()
	if err != nil {
		t.Fatalf("go list modules: %v\n%s", err, stderrOf(err))
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg, mod, _ := strings.Cut(line, " ")
		if !slices.Contains(allowedDirectDeps, mod) {
			t.Errorf("import %s is from module %q; want one of %q", pkg, mod, allowedDirectDeps)
		}
	}
}

// stderrOf returns what a failed command wrote to stderr.
func stderrOf(err error) []byte {
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.Stderr
	}
	return nil
}

// TestBinaryIsStatic builds the binary the way the Containerfile does and
// checks it can run on an empty base image: no dynamic loader, no shared
// libraries, and the build settings that say so.
func TestBinaryIsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	gocmd := goTool(t)
	bin := filepath.Join(t.TempDir(), "extractedprism")
	build := exec.Command(gocmd, "build", "-trimpath",
		"-ldflags=-s -w -X main.Version=v0.0.0-test -X main.Revision=test",
		"-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("program header PT_INTERP present; want none in a static binary")
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Errorf("program header PT_DYNAMIC present; want none in a static binary")
		}
	}
	// ImportedLibraries reads DT_NEEDED; it fails with no dynamic section,
	// which is the static case.
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("DT_NEEDED: got %q; want none", libs)
	}

	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for key, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
		if got := settings[key]; got != want {
			t.Errorf("build setting %s: got %q; want %q", key, got, want)
		}
	}
	if info.Main.Path != "github.com/extractedprism/extractedprism" {
		t.Errorf("main module: got %q; want github.com/extractedprism/extractedprism", info.Main.Path)
	}

	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if want := []byte("extractedprism v0.0.0-test (revision test, "); !bytes.Contains(out, want) {
		t.Errorf("--version: got %q; want it to contain %q", out, want)
	}
}
