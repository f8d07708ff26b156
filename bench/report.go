package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// historyHeading starts the hand-written section at the end of
// RESULTS.md (the performance history), which every run keeps.
const historyHeading = "## History"

// writeReport writes report to path, followed by what the file held from
// a line "## History" to its end, if it held one.
func writeReport(path, report string) error {
	old, err := os.ReadFile(path) //nolint:gosec // -o is the operator's own path
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read the report being replaced: %w", err)
	}
	//nolint:gosec // the report is for everyone to read, like the RESULTS.md it usually replaces
	if err := os.WriteFile(path, []byte(withHistory(report, string(old))), 0o644); err != nil {
		return fmt.Errorf("write the report: %w", err)
	}
	return nil
}

// withHistory returns report followed, after a blank line, by old from
// its first line that is exactly historyHeading to its end; report alone
// when old has no such line. A line ending in CR LF counts too: an editor
// that wrote one must not make the next run drop the history.
func withHistory(report, old string) string {
	for off := 0; off < len(old); {
		line, rest, _ := strings.Cut(old[off:], "\n")
		if strings.TrimSuffix(line, "\r") == historyHeading {
			if !strings.HasSuffix(report, "\n") {
				report += "\n"
			}
			return report + "\n" + old[off:]
		}
		off = len(old) - len(rest)
	}
	return report
}
