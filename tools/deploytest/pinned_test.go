package test

// The release the chart and the examples pin, and the daemon built from
// it. The rule (the package comment): release vX.Y.Z is the commit that
// adds the heading "## [X.Y.Z]" to CHANGELOG.md, found from the history
// alone, since a clone may come without tags.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pinPattern finds where a file names the daemon release it runs: the
// chart's appVersion, an image tag, the app.kubernetes.io/version label
// and a download's V=vX.Y.Z. The chart's own version (version:,
// helm.sh/chart) is not a daemon pin, nor a sample of the daemon's output.
var pinPattern = regexp.MustCompile(`(?:appVersion: "?|app\.kubernetes\.io/version: "|extractedprism/extractedprism:|V=v)([0-9]+\.[0-9]+\.[0-9]+)\b`)

// pinSearched are the files and directories, relative to the repository
// root, where a pin may be; pinRequired are the files that must have one,
// so that a pin rewritten in a form pinPattern misses fails rather than
// drops out.
var (
	pinSearched = []string{"README.md", "docs", "charts", "deploy", "examples"}
	pinRequired = []string{
		"charts/extractedprism/Chart.yaml",
		"deploy/extractedprism.yaml",
		"examples/kubeadm/extractedprism.yaml",
		"examples/kubeadm/README.md",
		"examples/talos/extractedprism-patch.yaml",
		"examples/systemd/README.md",
	}
)

// findPins returns the release every pin under root names, and the files
// that name each release found.
func findPins(root string) (map[string][]string, error) {
	pins := map[string][]string{}
	found := map[string]bool{}
	for _, top := range pinSearched {
		if _, err := os.Stat(filepath.Join(root, top)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			for _, m := range pinPattern.FindAllSubmatch(data, -1) {
				if v := string(m[1]); !slices.Contains(pins[v], rel) {
					pins[v] = append(pins[v], rel)
				}
				found[rel] = true
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, f := range pinRequired {
		if !found[f] {
			return nil, fmt.Errorf("%s names no daemon release that tools/deploytest (pinned_test.go, pinPattern) recognises", f)
		}
	}
	return pins, nil
}

// pinnedVersion returns the one release the chart and the examples pin.
func pinnedVersion(root string) (string, error) {
	pins, err := findPins(root)
	if err != nil {
		return "", err
	}
	if len(pins) != 1 {
		var list []string
		for _, v := range slices.Sorted(maps.Keys(pins)) {
			list = append(list, fmt.Sprintf("%s in %s", v, strings.Join(pins[v], ", ")))
		}
		return "", fmt.Errorf("the chart and every example must pin one daemon release, the one the deployment tests build and run; they pin %s", strings.Join(list, "; "))
	}
	for v := range pins {
		return v, nil
	}
	return "", nil
}

// runGit runs git in repo and returns its trimmed standard output.
func runGit(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// releaseCommit returns the commit of release vX.Y.Z (version is X.Y.Z):
// the oldest commit of HEAD's history that adds "## [X.Y.Z]" to
// CHANGELOG.md. A later commit that touches the heading line (a corrected
// date) matches too, hence the oldest. A tag vX.Y.Z, if the clone has it,
// must name the same commit.
func releaseCommit(repo, version string) (string, error) {
	shallow, err := runGit(repo, "rev-parse", "--is-shallow-repository")
	if err != nil {
		return "", err
	}
	if shallow != "false" {
		return "", fmt.Errorf("%s is a shallow clone: release v%s is the commit that added \"## [%s]\" to CHANGELOG.md, which may not be in it; fetch the full history (git fetch --unshallow, or actions/checkout with fetch-depth: 0)", repo, version, version)
	}
	heading := `^## \[` + regexp.QuoteMeta(version) + `\]`
	out, err := runGit(repo, "log", "--full-history", "--topo-order", "--format=%H", "-G", heading, "--", "CHANGELOG.md")
	if err != nil {
		return "", err
	}
	commits := strings.Fields(out)
	if len(commits) == 0 {
		return "", fmt.Errorf("no commit adds \"## [%s]\" to CHANGELOG.md: release v%s is the commit that adds that heading, and the chart and the examples may pin only a release", version, version)
	}
	commit := commits[len(commits)-1]
	// -q: no tag is no error; a clone may come without tags.
	if tagged, err := runGit(repo, "rev-parse", "-q", "--verify", "refs/tags/v"+version+"^{commit}"); err == nil && tagged != commit {
		return "", fmt.Errorf("tag v%s is commit %s, but release v%s is %s, the commit that added \"## [%s]\" to CHANGELOG.md: the tag must name that commit", version, tagged, version, commit, version)
	}
	return commit, nil
}

// extractTree writes the tree of commit into dir, which must exist.
func extractTree(repo, commit, dir string) error {
	archive := filepath.Join(dir, ".tree.tar")
	if _, err := runGit(repo, "archive", "--format=tar", "-o", archive, commit); err != nil {
		return err
	}
	if out, err := exec.Command("tar", "-x", "-f", archive, "-C", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("tar -x %s: %w\n%s", archive, err, out)
	}
	return os.Remove(archive)
}

// stampFlags returns the -X flags that stamp version and commit into the
// daemon in src, as tools/release/release.sh does, for those of
// main.Version and main.Revision that src declares: the linker ignores -X
// for a variable that does not exist, and a release may predate either.
func stampFlags(src, version, commit string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil {
		return nil, err
	}
	values := map[string]string{"Version": "v" + version, "Revision": commit}
	var flags []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				for _, name := range spec.(*ast.ValueSpec).Names {
					if v, ok := values[name.Name]; ok {
						flags = append(flags, "-X main."+name.Name+"="+v)
					}
				}
			}
		}
	}
	slices.Sort(flags)
	return flags, nil
}

// release is the daemon release the chart and the examples pin.
type release struct {
	version string   // X.Y.Z
	commit  string   // its release commit
	src     string   // that commit's tree
	stamps  []string // the -X flags its build gets
}

// pinnedRelease finds the pinned release and extracts its tree into
// binDir, once per run.
var pinnedRelease = sync.OnceValues(func() (*release, error) {
	version, err := pinnedVersion(repoRoot)
	if err != nil {
		return nil, err
	}
	commit, err := releaseCommit(repoRoot, version)
	if err != nil {
		return nil, err
	}
	rel := &release{version: version, commit: commit, src: filepath.Join(binDir, "src-v"+version)}
	if err := os.Mkdir(rel.src, 0o755); err != nil {
		return nil, err
	}
	if err := extractTree(repoRoot, commit, rel.src); err != nil {
		return nil, err
	}
	if rel.stamps, err = stampFlags(rel.src, version, commit); err != nil {
		return nil, err
	}
	return rel, nil
})

// buildRelease builds the daemon of rel into out as release.sh does:
// -trimpath, no VCS stamp, the version and revision by the linker.
func buildRelease(rel *release, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", strings.Join(rel.stamps, " "), "-o", out, ".")
	cmd.Dir = rel.src
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build of release v%s (commit %s) in %s: %w\n%s", rel.version, rel.commit, rel.src, err, msg)
	}
	return nil
}

// changelogHeading matches a release's heading in CHANGELOG.md.
var changelogHeading = regexp.MustCompile(`(?m)^## \[([0-9]+)\.([0-9]+)\.([0-9]+)\]`)

// changelogSection returns the section of CHANGELOG.md text under the
// heading of version, up to the next heading of its level or the link
// definitions at the end, without trailing blank lines; "" if none.
func changelogSection(text, version string) string {
	var section []string
	in := false
	for line := range strings.SplitSeq(text, "\n") {
		isHeading := strings.HasPrefix(line, "## ")
		if in && (isHeading || linkDefinition.MatchString(line)) {
			break
		}
		in = in || (isHeading && strings.HasPrefix(line, "## ["+version+"]"))
		if in {
			section = append(section, line)
		}
	}
	return strings.TrimRight(strings.Join(section, "\n"), "\n")
}

// linkDefinition matches the link definitions under the last section.
var linkDefinition = regexp.MustCompile(`^\[[^\]]+\]: `)

// firstRuled is the first release the rule holds for: 0.1.0's section
// was edited after the commit that added it, before the rule existed.
var firstRuled = [3]int{0, 2, 0}

// editedReleases returns an error for each released section of the
// CHANGELOG.md text, firstRuled or later, that differs from the section
// its release commit in repo wrote.
func editedReleases(repo, text string) []error {
	var errs []error
	for _, m := range changelogHeading.FindAllStringSubmatch(text, -1) {
		var v [3]int
		for i := range v {
			v[i], _ = strconv.Atoi(m[i+1])
		}
		if slices.Compare(v[:], firstRuled[:]) < 0 {
			continue
		}
		version := fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2])
		commit, err := releaseCommit(repo, version)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		then, err := runGit(repo, "show", commit+":CHANGELOG.md")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if now, was := changelogSection(text, version), changelogSection(then, version); now != was {
			errs = append(errs, fmt.Errorf("CHANGELOG.md: the section of released v%s differs from what its release commit %s wrote; a release's section is never edited (add to [Unreleased] instead)\nnow:\n%s\nreleased:\n%s", version, commit, now, was))
		}
	}
	return errs
}

// TestPinnedRelease builds the pinned release and checks that the build
// says which it is, as a released binary does.
func TestPinnedRelease(t *testing.T) {
	rel, err := pinnedRelease()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the chart and the examples pin v%s, release commit %s", rel.version, rel.commit)
	if len(rel.stamps) == 0 {
		t.Fatalf("release v%s declares neither main.Version nor main.Revision; tools/release/release.sh stamps both", rel.version)
	}
	out, err := exec.Command(daemonBinary(t), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("extractedprism --version: %v\n%s", err, out)
	}
	for _, f := range rel.stamps {
		if _, value, _ := strings.Cut(f, "="); !strings.Contains(string(out), value) {
			t.Errorf("extractedprism --version = %q; want %s in it", out, value)
		}
	}
}

// TestReleasedSectionsUnchanged holds every released section of
// CHANGELOG.md, from firstRuled on, to its release commit's text.
func TestReleasedSectionsUnchanged(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range editedReleases(repoRoot, string(data)) {
		t.Error(err)
	}
}

// scratchRepo is a git repository of a test's own, in a temporary
// directory, read with nobody's configuration.
type scratchRepo struct {
	t   *testing.T
	dir string
	n   int // commits so far, for their dates
}

func newScratchRepo(t *testing.T) *scratchRepo {
	t.Helper()
	r := &scratchRepo{t: t, dir: t.TempDir()}
	r.git("init", "-q", "-b", "main")
	return r
}

// git runs git in the repository and returns its trimmed output.
func (r *scratchRepo) git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-C", r.dir}, args...)...)
	date := fmt.Sprintf("2026-12-01T00:00:%02dZ", r.n)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.com", "GIT_AUTHOR_DATE="+date,
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.com", "GIT_COMMITTER_DATE="+date)
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit writes CHANGELOG.md and commits it, returning the commit.
func (r *scratchRepo) commit(changelog string) string {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, "CHANGELOG.md"), []byte(changelog), 0o600); err != nil {
		r.t.Fatal(err)
	}
	r.n++
	r.git("add", "CHANGELOG.md")
	r.git("commit", "-q", "-m", fmt.Sprintf("commit %d", r.n))
	return r.git("rev-parse", "HEAD")
}

// The scratch history: a mention of the heading in prose, its release,
// its date corrected, and an edit of its text.
const (
	logMention = "# Changelog\n\nNever edit a released section such as `## [0.2.0]`.\n\n## [Unreleased]\n- a\n\n## [0.1.0] - 2026-11-01\n- old\n"
	logRelease = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-07\n- a\n\n## [0.1.0] - 2026-11-01\n- old\n"
	logRedated = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-08\n- a\n\n## [0.1.0] - 2026-11-01\n- old\n"
	logEdited  = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-08\n- a, edited\n\n## [0.1.0] - 2026-11-01\n- old, edited\n\n[0.1.0]: https://example.com/v0.1.0\n"
)

// TestReleaseCommit finds release commits in a scratch history: the commit
// that added the heading, whatever changed after it, and a mention of the
// heading inside a line is no release.
func TestReleaseCommit(t *testing.T) {
	r := newScratchRepo(t)
	r.commit(logMention)
	release := r.commit(logRelease)
	redated := r.commit(logRedated)
	r.commit(logEdited)
	if got, err := releaseCommit(r.dir, "0.2.0"); err != nil || got != release {
		t.Errorf("releaseCommit(0.2.0) = %s, %v; want %s, the commit that added the heading", got, err, release)
	}
	if _, err := releaseCommit(r.dir, "0.3.0"); err == nil || !strings.Contains(err.Error(), `no commit adds "## [0.3.0]" to CHANGELOG.md`) {
		t.Errorf("releaseCommit(0.3.0) error = %v; want that no commit adds its heading", err)
	}

	r.git("tag", "v0.2.0", release)
	if got, err := releaseCommit(r.dir, "0.2.0"); err != nil || got != release {
		t.Errorf("with tag v0.2.0 on the release commit: %s, %v; want %s", got, err, release)
	}
	r.git("tag", "-f", "-a", "-m", "moved", "v0.2.0", redated)
	if _, err := releaseCommit(r.dir, "0.2.0"); err == nil || !strings.Contains(err.Error(), "tag v0.2.0 is commit "+redated) {
		t.Errorf("with tag v0.2.0 on a later commit: error %v; want the tag named as wrong", err)
	}

	shallow := filepath.Join(t.TempDir(), "shallow")
	r.git("clone", "-q", "--depth", "1", "file://"+r.dir, shallow)
	if _, err := releaseCommit(shallow, "0.2.0"); err == nil || !strings.Contains(err.Error(), "shallow clone") {
		t.Errorf("in a shallow clone: error %v; want one saying to fetch the full history", err)
	}
}

// TestEditedReleases holds released sections to their release commit's
// text, from firstRuled on: an edit of 0.2.0's fails, 0.1.0's does not.
func TestEditedReleases(t *testing.T) {
	r := newScratchRepo(t)
	r.commit(logMention)
	r.commit(logRelease)
	if errs := editedReleases(r.dir, logRelease); len(errs) != 0 {
		t.Errorf("the release commit's own text: %v; want no error", errs)
	}
	// A section may move down, under a new release, and keep its text.
	next := strings.Replace(logRelease, "## [Unreleased]\n", "## [Unreleased]\n\n## [0.3.0] - 2027-01-01\n- b\n", 1)
	r.commit(next)
	if errs := editedReleases(r.dir, next); len(errs) != 0 {
		t.Errorf("after release 0.3.0: %v; want no error", errs)
	}
	errs := editedReleases(r.dir, logEdited)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "released v0.2.0 differs") {
		t.Errorf("0.2.0 and 0.1.0 edited: %v; want one error, for 0.2.0", errs)
	}
	if got, want := changelogSection(logEdited, "0.1.0"), "## [0.1.0] - 2026-11-01\n- old, edited"; got != want {
		t.Errorf("changelogSection(0.1.0) = %q; want %q, without the link definitions", got, want)
	}
}

// TestPinnedVersion checks that the pins must agree, and that every file
// of pinRequired must have one.
func TestPinnedVersion(t *testing.T) {
	write := func(root string, pin func(path string) string) {
		for _, f := range pinRequired {
			path := filepath.Join(root, filepath.FromSlash(f))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(pin(f)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	image := func(v string) func(string) string {
		return func(f string) string {
			if strings.HasSuffix(f, "Chart.yaml") {
				return "version: 9.9.9\nappVersion: \"" + v + "\"\n"
			}
			return "image: ghcr.io/extractedprism/extractedprism:" + v + "\n"
		}
	}
	agree := t.TempDir()
	write(agree, image("0.2.0"))
	if v, err := pinnedVersion(agree); err != nil || v != "0.2.0" {
		t.Errorf("every file pins 0.2.0: %q, %v; want 0.2.0", v, err)
	}
	disagree := t.TempDir()
	write(disagree, image("0.2.0"))
	if err := os.WriteFile(filepath.Join(disagree, "README.md"), []byte("V=v0.1.0 A=amd64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pinnedVersion(disagree); err == nil || !strings.Contains(err.Error(), "0.1.0 in README.md") {
		t.Errorf("README.md pins 0.1.0, the rest 0.2.0: error %v; want one naming README.md's pin", err)
	}
	missing := t.TempDir()
	write(missing, func(f string) string {
		if f == "examples/kubeadm/README.md" {
			return "crictl pull ghcr.io/extractedprism/extractedprism:latest\n"
		}
		return image("0.2.0")(f)
	})
	if _, err := pinnedVersion(missing); err == nil || !strings.Contains(err.Error(), "examples/kubeadm/README.md names no daemon release") {
		t.Errorf("a required file without a pin: error %v; want it named", err)
	}
}
