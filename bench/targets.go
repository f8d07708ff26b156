package main

import (
	"fmt"
	"slices"
	"strings"
)

// targetID is one row of the report's Targets table: issue 25's targets
// for the io.Copy data path, in the order.
type targetID int

const (
	tgtConnRate targetID = iota
	tgtReqResp
	tgtBulkRate
	tgtBulkCPU
	tgtSplice
	tgtIdleRSS
	tgtConnMem
	tgtConnFDs
	tgtFDLimit
	numTargets
)

// targetText is what each target asks. "Today's build" is the system
// sysBaseline.
var targetText = [numTargets]string{
	tgtConnRate: "Connection rate ≥ 0.9× today's build",
	tgtReqResp:  "Request/response p99 ≤ 1.2× today's build (1 and 64 connections)",
	tgtBulkRate: "Bulk throughput ≥ HAProxy's (1 and 4 streams)",
	tgtBulkCPU:  "Bulk proxy CPU-s/GB ≤ 0.5× HAProxy's (1 and 4 streams)",
	tgtSplice:   "Splice still in effect (strace)",
	tgtIdleRSS:  "Idle RSS ≤ 20 MiB",
	tgtConnMem:  "≤ 32 KiB RSS per idle connection",
	tgtConnFDs:  "≤ 6 descriptors per idle connection",
	tgtFDLimit:  "Still serving at the descriptor limit",
}

// targetScenario is the scenario that measures each target.
var targetScenario = [numTargets]string{
	tgtConnRate: scnConnRate,
	tgtReqResp:  scnReqResp,
	tgtBulkRate: scnBulk,
	tgtBulkCPU:  scnBulk,
	tgtSplice:   scnStrace,
	tgtIdleRSS:  scnFootprint,
	tgtConnMem:  scnIdle,
	tgtConnFDs:  scnIdle,
	tgtFDLimit:  scnFDLimit,
}

// Target thresholds, as the issue states them.
const (
	minConnRateRatio = 0.9
	maxP99Ratio      = 1.2
	maxBulkCPURatio  = 0.5
	maxIdleRSSMiB    = 20
	maxConnKiB       = 32
	maxConnFDs       = 6
	// fdSlack absorbs the health checks' sockets, which come and go while
	// the descriptors are counted: a few over thousands of connections.
	fdSlack = 0.01
)

// target is what a run measured against one target.
type target struct {
	measured string
	met      bool
	known    bool // false: not measured in this run
}

// setTargetf records what the run measured against target id.
func (b *bench) setTargetf(id targetID, met bool, format string, args ...any) {
	b.tgts[id] = target{measured: fmt.Sprintf(format, args...), met: met, known: true}
}

// compares reports whether the systems target id compares all ran; when
// not, the target's row says which were missing.
func (b *bench) compares(id targetID, systems ...string) bool {
	var missing []string
	for _, s := range systems {
		if !b.has(s) {
			missing = append(missing, "`"+s+"`")
		}
	}
	if len(missing) == 0 {
		return true
	}
	why := "not in -systems: " + strings.Join(missing, ", ")
	if slices.Contains(systems, sysBaseline) && !b.has(sysBaseline) {
		why += " (bench/run.sh --baseline REV adds it)"
	}
	b.tgts[id] = target{measured: why}
	return false
}

// perBuild formats value for extractedprism and, when it ran, for
// today's build: "8.64 KiB; baseline 8.60 KiB".
func (b *bench) perBuild(value func(system string) string) string {
	s := value(sysEP)
	if b.has(sysBaseline) {
		s += "; " + sysBaseline + " " + value(sysBaseline)
	}
	return s
}

// plural is "1 stream" or "4 streams".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// targets is the report's Targets section.
func (b *bench) targets() string {
	var t table
	t.head = []string{"Target", "Measured", "Met"}
	for id, g := range b.tgts {
		met := "no"
		switch {
		case !g.known:
			met = "not measured"
		case g.met:
			met = "yes"
		}
		measured := g.measured
		if measured == "" {
			measured = "the " + targetScenario[id] + " scenario did not run"
		}
		t.add(targetText[id], measured, met)
	}
	return "\n## Targets\n\n" +
		"Issue 25's targets for extractedprism built from this tree. \"Today's build\" is the system `" + sysBaseline + "`, the build bench/run.sh --baseline REV makes of git revision REV (the command line above names it); the figures after \"vs\" are today's build's or HAProxy's, as the target says, and the ratio is extractedprism's figure over theirs. The sections below have the details.\n\n" +
		t.String()
}
