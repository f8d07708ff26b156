package main

import (
	"strings"
	"testing"
)

func TestTargetsNameTheMissingScenario(t *testing.T) {
	b := &bench{cfg: &config{systems: []string{sysEP}}}
	b.setTargetf(tgtSplice, true, "%d calls", 3)
	if b.compares(tgtConnRate, sysEP, sysBaseline) {
		t.Errorf("compares without baseline: got true; want false")
	}
	got := b.targets()
	for _, want := range []string{
		"| " + targetText[tgtSplice] + " | 3 calls | yes |",
		"| " + targetText[tgtConnRate] + " | not in -systems: `baseline` (bench/run.sh --baseline REV adds it) | not measured |",
		"| " + targetText[tgtFDLimit] + " | the fdlimit scenario did not run | not measured |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("targets: got\n%s\nwant a row %q", got, want)
		}
	}
}
