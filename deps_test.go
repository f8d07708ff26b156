package main

// Supply-chain guards: the program may depend directly on five modules
// (README, "Security"), the binary that ships is static, and the product
// code keeps to the rules of issue 25 that a reviewer would otherwise have
// to check by hand: no unsafe, no raw system calls, no mutable globals.

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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

// auditFile returns how the product file f breaks the rules, one line each,
// "file:line: what": it imports unsafe, makes a raw system call
// (Syscall*, RawSyscall* of syscall or golang.org/x/sys/unix, named or
// merely referred to), or declares a package-level variable other than a
// sentinel error (errors.New) or the linker-stamped Version and Revision.
func auditFile(fset *token.FileSet, f *ast.File) []string {
	var problems []string
	report := func(n ast.Node, format string, args ...any) {
		p := fset.Position(n.Pos())
		problems = append(problems, fmt.Sprintf("%s:%d: %s", p.Filename, p.Line, fmt.Sprintf(format, args...)))
	}
	local := map[string]string{} // import path by the name the file uses
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		switch {
		case path == "unsafe":
			report(imp, "imports unsafe")
		case (path == "syscall" || path == "golang.org/x/sys/unix") && name == ".":
			report(imp, "dot-imports %s, hiding its system calls", path)
		}
		local[name] = path
	}
	// from returns the package path and the name that e selects from an
	// imported package, as in unix.Syscall.
	from := func(e ast.Expr) (path, name string) {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", ""
		}
		if x, ok := sel.X.(*ast.Ident); ok {
			return local[x.Name], sel.Sel.Name
		}
		return "", ""
	}
	ast.Inspect(f, func(n ast.Node) bool {
		e, ok := n.(ast.Expr)
		if !ok {
			return true
		}
		path, name := from(e)
		if (path == "syscall" || path == "golang.org/x/sys/unix") &&
			(strings.HasPrefix(name, "Syscall") || strings.HasPrefix(name, "RawSyscall")) {
			report(e, "raw system call %s.%s", path, name)
		}
		return true
	})
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.VAR {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			if stamped(vs) {
				continue
			}
			for i, name := range vs.Names {
				if len(vs.Values) == len(vs.Names) && sentinel(vs.Values[i], from) {
					continue
				}
				report(name, "package-level var %s", name.Name)
			}
		}
	}
	return problems
}

// stamped reports whether vs declares Version or Revision, or both, as a
// string without a value: what the linker's -X writes.
func stamped(vs *ast.ValueSpec) bool {
	if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "string" || len(vs.Values) != 0 {
		return false
	}
	for _, n := range vs.Names {
		if n.Name != "Version" && n.Name != "Revision" {
			return false
		}
	}
	return true
}

// sentinel reports whether e is errors.New with a constant message; from
// is auditFile's.
func sentinel(e ast.Expr, from func(ast.Expr) (string, string)) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) != 1 {
		return false
	}
	if path, name := from(call.Fun); path != "errors" || name != "New" {
		return false
	}
	lit, ok := call.Args[0].(*ast.BasicLit)
	return ok && lit.Kind == token.STRING
}

func TestAuditFile(t *testing.T) {
	const src = `package main

import (
	"errors"
	"fmt"
	sys "syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	. "golang.org/x/sys/unix"
)

var errSentinel = errors.New("fine")

var Version, Revision string

var counter int

var errWrapped = fmt.Errorf("not a sentinel: %w", errSentinel)

var (
	errA  = errors.New("fine")
	table = map[string]int{}
)

var Version2 string

func f() {
	var local int // not at package level
	_ = local
	_ = unsafe.Sizeof(0)
	sys.Syscall(0, 0, 0, 0)
	unix.RawSyscall6(0, 0, 0, 0, 0, 0, 0)
	fn := unix.Syscall
	_ = fn
	_ = unix.Close(0)
	_, _, _ = sys.Getpid, fmt.Sprint, errA
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "sample.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"sample.go:7: imports unsafe",
		"sample.go:10: dot-imports golang.org/x/sys/unix, hiding its system calls",
		"sample.go:32: raw system call syscall.Syscall",
		"sample.go:33: raw system call golang.org/x/sys/unix.RawSyscall6",
		"sample.go:34: raw system call golang.org/x/sys/unix.Syscall",
		"sample.go:17: package-level var counter",
		"sample.go:19: package-level var errWrapped",
		"sample.go:23: package-level var table",
		"sample.go:26: package-level var Version2",
	}
	if got := auditFile(fset, f); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestProductFollowsTheRules holds every product file (the package's
// non-test files, whatever their build constraints) to auditFile's rules.
func TestProductFollowsTheRules(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	audited := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, problem := range auditFile(fset, f) {
			t.Error(problem)
		}
		audited++
	}
	if audited < 10 {
		t.Errorf("audited %d product files; want all of them (10 or more)", audited)
	}
}
