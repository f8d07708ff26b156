package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// updateReadme rewrites README.md's flag table from the --help text instead
// of comparing them: the table is generated, so a flag's help changes in
// one place, config.go, and this writes it out.
var updateReadme = flag.Bool("update", false, "rewrite README.md's flag table from the --help text")

// regenerate is the command that rewrites the table; failures name it.
const regenerate = "go test -run TestREADMEFlagTable -update ."

// The table sits between these lines of README.md.
const (
	flagsBegin = "<!-- flags:begin (generated from --help: " + regenerate + ") -->\n"
	flagsEnd   = "<!-- flags:end -->\n"
)

// TestREADMEFlagTable holds README.md's flag table to the text --help
// prints, so an operator reading either sees the same flags, variables,
// defaults and descriptions.
func TestREADMEFlagTable(t *testing.T) {
	var help bytes.Buffer
	printUsage(&help)
	want, rows := flagTable(t, help.String())
	fs, _ := newFlagSet(&config{})
	if n := countFlags(fs); rows != n {
		t.Fatalf("the --help text gave %d table rows, the flag set has %d flags: its line format changed and flagTable must follow", rows, n)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := bytes.Cut(readme, []byte(flagsBegin))
	table, after, ok2 := bytes.Cut(rest, []byte(flagsEnd))
	if !ok || !ok2 {
		t.Fatalf("README.md lacks the lines %q and %q around its flag table", flagsBegin, flagsEnd)
	}
	if string(table) == want {
		return
	}
	if *updateReadme {
		out := bytes.Join([][]byte{before, []byte(flagsBegin), []byte(want), []byte(flagsEnd), after}, nil)
		if err := os.WriteFile("README.md", out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's flag table differs from --help; regenerate it with: %s\n%s", regenerate, lineDiff(string(table), want))
}

func countFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// flagTable turns the flag lines of the --help text into a Markdown table,
// and returns it with its number of rows.
func flagTable(t *testing.T, help string) (string, int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("| Flag | Variable | Default | Description |\n|---|---|---|---|\n")
	rows := 0
	for line := range strings.Lines(help) {
		if !strings.HasPrefix(line, "  --") {
			continue
		}
		flagCell, env, def, desc := parseUsageLine(t, strings.TrimSuffix(line, "\n"))
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", code(flagCell), code(env), code(def), cell(desc))
		rows++
	}
	return b.String(), rows
}

// parseUsageLine splits a line that usageText wrote,
// "  --name type  (EP_NAME) description (default value)", into the flag
// with its type, the variable, the default and the description; the last
// three may be empty.
func parseUsageLine(t *testing.T, line string) (flagCell, env, def, desc string) {
	t.Helper()
	flagCell, rest, ok := strings.Cut(strings.TrimPrefix(line, "  "), "  ")
	if !ok || rest == "" {
		t.Fatalf("--help line %q: no two spaces between the flag and its description", line)
	}
	if strings.HasPrefix(rest, "(EP_") {
		env, rest, ok = strings.Cut(rest[1:], ") ")
		if !ok {
			t.Fatalf("--help line %q: the variable's parenthesis is not closed", line)
		}
	}
	desc = rest
	if i := strings.LastIndex(rest, " (default "); i >= 0 && strings.HasSuffix(rest, ")") {
		desc, def = rest[:i], strings.TrimSuffix(rest[i+len(" (default "):], ")")
	}
	return flagCell, env, def, desc
}

// code formats s as inline code, or nothing if s is empty.
func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}

// cell escapes the one character that would end a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// lineDiff lists the lines of got that want lacks and the other way round,
// enough to see which flag changed.
func lineDiff(got, want string) string {
	var b strings.Builder
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(want, "\n")
	for _, l := range gotLines {
		if !slices.Contains(wantLines, l) {
			b.WriteString("README.md: " + l + "\n")
		}
	}
	for _, l := range wantLines {
		if !slices.Contains(gotLines, l) {
			b.WriteString("--help:    " + l + "\n")
		}
	}
	return b.String()
}
