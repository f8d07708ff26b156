package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReportKeepsHistory(t *testing.T) {
	const report = "# extractedprism performance benchmark\n\nnew figures\n"
	const history = "## History\n\n### 2026-12-01\n\nhand-written\n\n## Later heading\n\nstill history\n"
	tests := []struct {
		name string
		old  *string // nil: no file before
		want string
	}{
		{"no file before", nil, report},
		{"empty file", new(""), report},
		{"no history", new("# old report\n\nold figures\n"), report},
		{"history at the end", new("# old report\n\nold figures\n\n" + history), report + "\n" + history},
		{"history only", new(history), report + "\n" + history},
		{"history without a final newline", new("# old\n\n## History\nlast line"), report + "\n## History\nlast line"},
		{"CR LF line endings", new("# old\r\n\r\n## History\r\nkept\r\n"), report + "\n## History\r\nkept\r\n"},
		{"only the exact heading counts", new("# old\n\n## History of the upstreams\n\n### History\n\n ## History\n"), report},
		{"from the first heading", new("# old\n\n## History\n\none\n\n## History\n\ntwo\n"), report + "\n## History\n\none\n\n## History\n\ntwo\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "RESULTS.md")
			if tt.old != nil {
				if err := os.WriteFile(path, []byte(*tt.old), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := writeReport(path, report); err != nil {
				t.Fatalf("writeReport: %v", err)
			}
			if got := readFile(t, path); got != tt.want {
				t.Errorf("got %q; want %q", got, tt.want)
			}
		})
	}
}

func TestWriteReportTwiceKeepsOneHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	const history = "## History\n\nhand-written\n"
	if err := os.WriteFile(path, []byte("# old\n\n"+history), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, report := range []string{"# first run\n", "# second run\n"} {
		if err := writeReport(path, report); err != nil {
			t.Fatalf("writeReport: %v", err)
		}
	}
	if got, want := readFile(t, path), "# second run\n\n"+history; got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}

func TestWriteReportAddsTheFinalNewline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RESULTS.md")
	if err := os.WriteFile(path, []byte("## History\nkept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeReport(path, "no newline"); err != nil {
		t.Fatalf("writeReport: %v", err)
	}
	if got, want := readFile(t, path), "no newline\n\n## History\nkept\n"; got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}

func TestWriteReportUnreadableOldFile(t *testing.T) {
	// A directory where the report goes cannot be read as the old report;
	// the history it might hold must not be silently overwritten.
	path := t.TempDir()
	if err := writeReport(path, "report\n"); err == nil {
		t.Errorf("writeReport over a directory: got nil error; want one")
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
