package test

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// containerfileBuild returns the shell command of the Containerfile's RUN
// instruction that runs go build, continuation lines joined, so the test
// builds exactly what the image gets.
func containerfileBuild(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Containerfile"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	// Join continuation lines the way the Containerfile parser does.
	joined := strings.ReplaceAll(string(data), "\\\n", " ")
	var found []string
	for _, line := range strings.Split(joined, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			found = append(found, strings.TrimSpace(strings.TrimPrefix(line, "RUN ")))
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one RUN instruction with go build in the Containerfile; found %d: %q", len(found), found)
	}
	return found[0]
}

// outputFlag matches the -o argument of the build command.
var outputFlag = regexp.MustCompile(`(^|\s)-o\s+(\S+)`)

// TestImageBinaryIsStatic builds the daemon with the Containerfile's own
// build command and checks that the result runs on an empty base: built
// with cgo off, and an ELF file with no interpreter and no shared
// libraries. A cgo build would need a libc the FROM scratch image lacks.
func TestImageBinaryIsStatic(t *testing.T) {
	command := containerfileBuild(t)
	if !strings.Contains(command, "CGO_ENABLED=0") || !strings.Contains(command, "-trimpath") {
		t.Errorf("Containerfile build command %q lacks CGO_ENABLED=0 or -trimpath", command)
	}
	out := filepath.Join(t.TempDir(), "extractedprism")
	m := outputFlag.FindStringSubmatchIndex(command)
	if m == nil {
		t.Fatalf("no -o in the Containerfile build command %q", command)
	}
	command = command[:m[4]] + out + command[m[5]:]

	// The Containerfile builds in a directory holding go.mod, go.sum and
	// the package's .go files; the repository root is that directory.
	cmd := exec.Command("sh", "-c", command)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "VERSION=v0.0.0-test", "REVISION=test")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", command, err, stderr.String())
	}

	info, err := exec.Command("go", "version", "-m", out).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, info)
	}
	settings := buildSettings(string(info))
	for key, want := range map[string]string{
		"CGO_ENABLED": "0",
		"-trimpath":   "true",
	} {
		if settings[key] != want {
			t.Errorf("go version -m: %s=%q; want %q\n%s", key, settings[key], want, info)
		}
	}
	// -trimpath keeps -ldflags out of the build info, so the stamp is
	// checked by running the binary.
	version, err := exec.Command(out, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", out, err, version)
	}
	// The daemon names the Go release it was built with, which go version
	// -m reads from the binary ("path: go1.26.8" on its first line).
	firstLine, _, _ := strings.Cut(string(info), "\n")
	_, goVersion, _ := strings.Cut(firstLine, ": ")
	if want := "extractedprism v0.0.0-test (revision test, " + goVersion + ")"; strings.TrimSpace(string(version)) != want {
		t.Errorf("--version printed %q; want %q", version, want)
	}

	f, err := elf.Open(out)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("ELF has a %v program header; want a static executable", p.Type)
		}
	}
	if f.Section(".dynamic") != nil || f.Section(".interp") != nil {
		t.Error("ELF has a .dynamic or .interp section; want a static executable")
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatalf("imported libraries: %v", err)
	}
	if len(libs) != 0 {
		t.Errorf("ELF needs shared libraries %v (DT_NEEDED); want none", libs)
	}
}

// buildSettings parses the "build KEY=VALUE" lines of go version -m.
func buildSettings(info string) map[string]string {
	settings := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "build" {
			continue
		}
		rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "build"))
		key, value, ok := strings.Cut(rest, "=")
		if !ok {
			continue
		}
		settings[key] = strings.Trim(value, `"`)
	}
	return settings
}
