package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Column heads shared by the scenarios' tables.
const (
	colSystem    = "System"
	colToDirect  = "÷ direct"  // ratio to the direct row
	colToHAProxy = "÷ HAProxy" // ratio to the haproxy row
)

// rel returns the ratio cells of s[row][metric] to direct and to HAProxy.
func rel(s samples, row, metric, suffix string) (toDirect, toHAProxy string) {
	v := s.med(row, metric)
	return ratio(v, s.med(sysDirect+suffix, metric)), ratio(v, s.med(sysHAProxy+suffix, metric))
}

func (b *bench) has(system string) bool {
	return slices.Contains(b.cfg.systems, system)
}

// installed reports whether program is on the PATH.
func installed(program string) bool {
	_, err := exec.LookPath(program)
	return err == nil
}

// 1. Connection rate.
func (b *bench) connRateScenario() error {
	const workers = 32
	s := samples{}
	err := b.interleave(b.cfg.systems, b.cfg.reps, startOpts{}, func(in *instance, rep int) error {
		r := connRate(in, workers, b.cfg.dur)
		log.Printf("  connrate %-14s rep %d: %8.0f conn/s p50 %6.0f µs p99 %6.0f µs, proxy CPU %5.1f µs/conn, failed %d %s",
			in.name, rep, r.rate, us(r.p50), us(r.p99), us(r.cpuPerConn), r.failed, r.firstErr)
		if r.ok == 0 {
			return fmt.Errorf("no connection succeeded: %s", r.firstErr)
		}
		s.add(in.name, "rate", r.rate)
		s.add(in.name, "p50", us(r.p50))
		s.add(in.name, "p99", us(r.p99))
		s.add(in.name, "failed", float64(r.failed))
		if in.pid != 0 {
			s.add(in.name, "cpu", us(r.cpuPerConn))
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.section("1. Connection rate",
		fmt.Sprintf("%d workers, each in a loop: connect, 64 B echo, close; %s per run. Per-connection time is connect to close.", workers, b.cfg.dur))
	var t table
	t.head = []string{colSystem, "conn/s", colToDirect, colToHAProxy, "p50 µs", colToHAProxy, "p99 µs", colToHAProxy, "proxy CPU µs/conn", colToHAProxy, "failed (all runs)"}
	for _, name := range b.cfg.systems {
		rd, rh := rel(s, name, "rate", "")
		_, p50h := rel(s, name, "p50", "")
		_, p99h := rel(s, name, "p99", "")
		_, cpuh := rel(s, name, "cpu", "")
		t.add(name, fmtNum(s.med(name, "rate"), 0), rd, rh, fmtNum(s.med(name, "p50"), 0), p50h,
			fmtNum(s.med(name, "p99"), 0), p99h, fmtNum(s.med(name, "cpu"), 1), cpuh, fmtNum(s.sum(name, "failed"), 0))
	}
	b.rep.WriteString(t.String())
	if b.compares(tgtConnRate, sysEP, sysBaseline) {
		ep, base := s.med(sysEP, "rate"), s.med(sysBaseline, "rate")
		b.setTargetf(tgtConnRate, ep >= minConnRateRatio*base, "%s vs %s conn/s (%s)", fmtNum(ep, 0), fmtNum(base, 0), ratio(ep, base))
	}
	return nil
}

// 2. Request/response.
func (b *bench) reqRespScenario() error {
	s := samples{}
	connCounts := []int{1, 64}
	warmup := min(b.cfg.dur/10, 500*time.Millisecond)
	for _, conns := range connCounts {
		suffix := fmt.Sprintf("/%d", conns)
		err := b.interleave(b.cfg.systems, b.cfg.reps, startOpts{}, func(in *instance, rep int) error {
			r := pingPong(in, conns, b.cfg.dur, warmup)
			log.Printf("  reqresp  %-14s x%-2d rep %d: %8.0f rt/s p50 %5.0f µs p99 %6.0f µs p99.9 %6.0f µs, proxy CPU %4.1f µs/rt, failed %d %s",
				in.name, conns, rep, r.rate, us(r.p50), us(r.p99), us(r.p999), us(r.cpuPerOp), r.failed, r.firstErr)
			if r.failed > 0 {
				return fmt.Errorf("%d connections failed: %s", r.failed, r.firstErr)
			}
			row := in.name + suffix
			s.add(row, "rate", r.rate)
			s.add(row, "p50", us(r.p50))
			s.add(row, "p99", us(r.p99))
			s.add(row, "p999", us(r.p999))
			if in.pid != 0 {
				s.add(row, "cpu", us(r.cpuPerOp))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	b.reqRespReport(s, connCounts, warmup)
	return nil
}

// reqRespReport writes the request/response section and its target.
func (b *bench) reqRespReport(s samples, connCounts []int, warmup time.Duration) {
	b.section("2. Request/response",
		fmt.Sprintf("64 B ping-pong on 1 and on 64 persistent connections, %s per run (the first %s not recorded). Round-trip times.", b.cfg.dur, warmup))
	var t table
	t.head = []string{colSystem, "conns", "round trips/s", "p50 µs", colToDirect, colToHAProxy, "p99 µs", colToDirect, colToHAProxy, "p99.9 µs", colToHAProxy, "proxy CPU µs/round trip"}
	for _, conns := range connCounts {
		suffix := fmt.Sprintf("/%d", conns)
		for _, name := range b.cfg.systems {
			row := name + suffix
			p50d, p50h := rel(s, row, "p50", suffix)
			p99d, p99h := rel(s, row, "p99", suffix)
			_, p999h := rel(s, row, "p999", suffix)
			t.add(name, strconv.Itoa(conns), fmtNum(s.med(row, "rate"), 0),
				fmtNum(s.med(row, "p50"), 0), p50d, p50h,
				fmtNum(s.med(row, "p99"), 0), p99d, p99h,
				fmtNum(s.med(row, "p999"), 0), p999h, fmtNum(s.med(row, "cpu"), 1))
		}
	}
	b.rep.WriteString(t.String())
	if b.compares(tgtReqResp, sysEP, sysBaseline) {
		met, parts := true, make([]string, 0, len(connCounts))
		for _, conns := range connCounts {
			suffix := fmt.Sprintf("/%d", conns)
			ep, base := s.med(sysEP+suffix, "p99"), s.med(sysBaseline+suffix, "p99")
			met = met && ep <= maxP99Ratio*base
			parts = append(parts, fmt.Sprintf("%s: %s vs %s µs (%s)", plural(conns, "connection"), fmtNum(ep, 0), fmtNum(base, 0), ratio(ep, base)))
		}
		b.setTargetf(tgtReqResp, met, "%s", strings.Join(parts, "; "))
	}
}

// 3. Bulk.
func (b *bench) bulkScenario() error {
	s := samples{}
	streamCounts := []int{1, 4}
	for _, streams := range streamCounts {
		suffix := fmt.Sprintf("/%d", streams)
		err := b.interleave(b.cfg.systems, b.cfg.slowReps, startOpts{}, func(in *instance, rep int) error {
			r := bulk(in, streams, b.cfg.bulkBytes/int64(streams))
			log.Printf("  bulk     %-14s x%d rep %d: %5.2f GB/s in %5.2fs, proxy CPU %5.2fs = %.3f s/GB %s",
				in.name, streams, rep, r.gbps, r.elapsed.Seconds(), r.cpu.Seconds(), r.cpuPerGB, r.err)
			if r.err != "" {
				return errors.New(r.err)
			}
			row := in.name + suffix
			s.add(row, "gbps", r.gbps)
			if in.pid != 0 {
				s.add(row, "cpugb", r.cpuPerGB)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	b.bulkReport(s, streamCounts)
	return nil
}

// bulkReport writes the bulk section and its targets.
func (b *bench) bulkReport(s samples, streamCounts []int) {
	b.section("3. Bulk",
		fmt.Sprintf("%s per run, as 1 stream or as 4 concurrent streams of %s, downloaded through the proxy (upstream → proxy → client, like a large LIST or WATCH response). Proxy CPU is utime+stime of the proxy process over the run.", mib(b.cfg.bulkBytes), mib(b.cfg.bulkBytes/4)))
	var t table
	t.head = []string{colSystem, "streams", "GB/s", colToDirect, colToHAProxy, "proxy CPU-s/GB", colToHAProxy}
	for _, streams := range streamCounts {
		suffix := fmt.Sprintf("/%d", streams)
		for _, name := range b.cfg.systems {
			row := name + suffix
			gd, gh := rel(s, row, "gbps", suffix)
			_, ch := rel(s, row, "cpugb", suffix)
			t.add(name, strconv.Itoa(streams), fmtNum(s.med(row, "gbps"), 2), gd, gh, fmtNum(s.med(row, "cpugb"), 3), ch)
		}
	}
	b.rep.WriteString(t.String())
	// Both calls, so that each row says what is missing.
	if rateOK, cpuOK := b.compares(tgtBulkRate, sysEP, sysHAProxy), b.compares(tgtBulkCPU, sysEP, sysHAProxy); rateOK && cpuOK {
		rateMet, cpuMet := true, true
		rates, cpus := make([]string, 0, len(streamCounts)), make([]string, 0, len(streamCounts))
		for _, streams := range streamCounts {
			suffix := fmt.Sprintf("/%d", streams)
			ep, hp := s.med(sysEP+suffix, "gbps"), s.med(sysHAProxy+suffix, "gbps")
			rateMet = rateMet && ep >= hp
			rates = append(rates, fmt.Sprintf("%s: %s vs %s GB/s (%s)", plural(streams, "stream"), fmtNum(ep, 2), fmtNum(hp, 2), ratio(ep, hp)))
			ec, hc := s.med(sysEP+suffix, "cpugb"), s.med(sysHAProxy+suffix, "cpugb")
			cpuMet = cpuMet && ec <= maxBulkCPURatio*hc
			cpus = append(cpus, fmt.Sprintf("%s: %s vs %s CPU-s/GB (%s)", plural(streams, "stream"), fmtNum(ec, 3), fmtNum(hc, 3), ratio(ec, hc)))
		}
		b.setTargetf(tgtBulkRate, rateMet, "%s", strings.Join(rates, "; "))
		b.setTargetf(tgtBulkCPU, cpuMet, "%s", strings.Join(cpus, "; "))
	}
}

// straceSyscalls are the data-path calls counted under strace.
var straceSyscalls = []string{"splice", "read", "write", "recvfrom", "sendto", "readv", "writev"}

// straceRow is what strace counted during one proxy's download.
type straceRow struct {
	name  string
	bytes int64             // downloaded under strace
	calls map[string][2]int // calls, errors
}

// spliced returns the successful splice calls and the bytes each moved
// on average. Each byte is spliced twice: socket → pipe, pipe → socket.
func (r straceRow) spliced() (calls int, perCall float64) {
	calls = r.calls["splice"][0] - r.calls["splice"][1]
	if calls <= 0 {
		return 0, math.NaN()
	}
	return calls, float64(2*r.bytes) / float64(calls)
}

// otherCalls is the successful data-path calls other than splice.
func (r straceRow) otherCalls() int {
	n := 0
	for _, sc := range straceSyscalls {
		if sc != "splice" {
			n += r.calls[sc][0] - r.calls[sc][1]
		}
	}
	return n
}

// Splice check: one bulk download per proxy under strace -f -c.
func (b *bench) straceScenario() error {
	if !installed("strace") {
		b.note = append(b.note, "strace is not installed: the splice check did not run.")
		b.tgts[tgtSplice] = target{measured: "strace is not installed"}
		return nil
	}
	var rows []straceRow
	for _, name := range b.proxies() {
		in, err := b.start(name, startOpts{})
		if err != nil {
			return err
		}
		// HAProxy and nginx copy in 16 KiB steps, which strace slows a lot:
		// a quarter of the bytes shows their pattern as well.
		n := b.cfg.straceBytes
		if !b.env.isEP(name) {
			n /= 4
		}
		calls, err := b.straceBulk(in, n)
		b.stop(in)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		log.Printf("  strace   %-14s %v", name, calls)
		rows = append(rows, straceRow{name, n, calls})
	}
	b.straceReport(rows)
	return nil
}

// straceReport writes the splice check's section and its target.
func (b *bench) straceReport(rows []straceRow) {
	b.section("Splice check (strace)",
		fmt.Sprintf("One download through each proxy (%s through the extractedprism builds, %s through the others) with `strace -f -c -e trace=%s -p PID` attached to the proxying process. Calls (errors, mostly EAGAIN, in parentheses). strace slows the proxy; this run only counts calls.",
			mib(b.cfg.straceBytes), mib(b.cfg.straceBytes/4), strings.Join(straceSyscalls, ",")))
	var t table
	t.head = append([]string{colSystem}, straceSyscalls...)
	t.head = append(t.head, "bytes per successful splice")
	for _, r := range rows {
		cells := append(make([]string, 0, len(straceSyscalls)+2), r.name)
		for _, sc := range straceSyscalls {
			c := r.calls[sc]
			cell := fmtNum(float64(c[0]), 0)
			if c[1] > 0 {
				cell += fmt.Sprintf(" (%s)", fmtNum(float64(c[1]), 0))
			}
			cells = append(cells, cell)
		}
		_, per := r.spliced()
		t.add(append(cells, fmtNum(per, 0))...)
	}
	b.rep.WriteString(t.String())
	if b.compares(tgtSplice, sysEP) {
		for _, r := range rows {
			if r.name == sysEP {
				b.spliceTarget(r)
			}
		}
	}
}

// spliceTarget records whether splice carried extractedprism's download:
// a copy through a user-space buffer would need thousands of reads and
// writes for it, splice a few hundred calls and no reads.
func (b *bench) spliceTarget(r straceRow) {
	calls, per := r.spliced()
	other := r.otherCalls()
	b.setTargetf(tgtSplice, calls > 0 && other < calls,
		"%s successful splice calls, %s bytes per call, during a %s download; %s successful reads and writes of other kinds (the runtime's and the health checks')",
		fmtNum(float64(calls), 0), fmtNum(per, 0), mib(r.bytes), fmtNum(float64(other), 0))
}

func (b *bench) straceBulk(in *instance, n int64) (map[string][2]int, error) {
	out := filepath.Join(b.env.tmp, fmt.Sprintf("strace-%s.txt", in.name))
	// No context: the deferred Kill below ends strace on every return.
	cmd := exec.CommandContext(context.Background(), "strace", "-f", "-c", "-o", out, "-e", "trace="+strings.Join(straceSyscalls, ","), "-p", strconv.Itoa(in.pid)) //nolint:gosec // fixed program; the arguments are a path in this run's temp dir and a PID
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	// Wait until strace has attached.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, _ := statusKiB(in.pid, "TracerPid"); v != 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("strace did not attach within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the other threads
	if r := bulk(in, 1, n); r.err != "" {
		return nil, errors.New(r.err)
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return nil, errors.New("strace did not stop within 10 s")
	}
	return parseStraceSummary(out)
}

// parseStraceSummary reads the -c table: "% time seconds usecs/call calls
// [errors] syscall".
func parseStraceSummary(path string) (map[string][2]int, error) {
	f, err := os.Open(path) //nolint:gosec // the file strace wrote in this run's temp dir
	if err != nil {
		return nil, err
	}
	defer f.Close()
	calls := map[string][2]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || fs[len(fs)-1] == "total" || fs[len(fs)-1] == "syscall" {
			continue
		}
		n, err := strconv.Atoi(fs[3])
		if err != nil {
			continue
		}
		var e int
		if len(fs) >= 6 {
			e, _ = strconv.Atoi(fs[4])
		}
		calls[fs[len(fs)-1]] = [2]int{n, e}
	}
	return calls, sc.Err()
}

// 5. Footprint.
func (b *bench) footprintScenario() error {
	s := samples{}
	err := b.interleave(b.proxies(), b.cfg.slowReps, startOpts{}, func(in *instance, rep int) error {
		// Two health-check rounds, then three scrapes of /metrics.
		time.Sleep(4500 * time.Millisecond)
		size := 0
		if in.healthAddr != "" {
			for range 3 {
				n, err := in.scrapeMetrics()
				if err != nil {
					return err
				}
				size = n
			}
			time.Sleep(500 * time.Millisecond)
		}
		var total int64
		for _, p := range in.pids {
			total += rssKiB(p)
		}
		log.Printf("  footprint %-13s rep %d: RSS %d KiB (all processes %d KiB), fds %d, /metrics %d B",
			in.name, rep, rssKiB(in.pid), total, fdCount(in.pid), size)
		s.add(in.name, "rss", float64(rssKiB(in.pid))/1024)
		s.add(in.name, "rssall", float64(total)/1024)
		s.add(in.name, "fds", float64(fdCount(in.pid)))
		s.add(in.name, "procs", float64(len(in.pids)))
		return nil
	})
	if err != nil {
		return err
	}
	b.section("5. Footprint",
		"Idle proxy with three healthy upstreams after two health-check rounds; each extractedprism build's /metrics scraped three times before RSS is read.")
	var t table
	t.head = []string{colSystem, "processes", "RSS MiB (proxying process)", "RSS MiB (all processes)", "fds"}
	for _, name := range b.proxies() {
		t.add(name, fmtNum(s.med(name, "procs"), 0), fmtNum(s.med(name, "rss"), 1), fmtNum(s.med(name, "rssall"), 1), fmtNum(s.med(name, "fds"), 0))
	}
	b.rep.WriteString(t.String())
	b.rep.WriteString("\n")
	b.binarySizes()
	if b.compares(tgtIdleRSS, sysEP) {
		b.setTargetf(tgtIdleRSS, s.med(sysEP, "rss") <= maxIdleRSSMiB, "%s (no client connection open, after two health-check rounds and three /metrics scrapes)",
			b.perBuild(func(sys string) string { return fmtNum(s.med(sys, "rss"), 1) + " MiB" }))
	}
	return nil
}

// binarySizes writes the table of the binaries' sizes.
func (b *bench) binarySizes() {
	var bt table
	bt.head = []string{"Binary", "bytes", "MB (10^6)", "MiB"}
	sizeRow := func(label, path string) {
		if st, err := os.Stat(path); err == nil {
			bt.add(label, fmtNum(float64(st.Size()), 0), fmtNum(float64(st.Size())/1e6, 1), fmtNum(float64(st.Size())/(1<<20), 1))
		}
	}
	sizeRow("extractedprism (`go build`)", b.cfg.epBin)
	if b.cfg.epStripped != "" {
		sizeRow("extractedprism (`go build -ldflags='-s -w'`)", b.cfg.epStripped)
	}
	for _, name := range b.cfg.altNames {
		sizeRow(name+" (-ep-alt build)", b.cfg.alt[name])
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		sizeRow("haproxy (Debian, dynamically linked)", p)
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		sizeRow("nginx (Debian, dynamically linked)", p)
		sizeRow("nginx stream module", "/usr/lib/nginx/modules/ngx_stream_module.so")
	}
	b.rep.WriteString(bt.String())
}

// 6. Failover.
func (b *bench) failoverScenario() error {
	const (
		workers = 16
		pace    = 10 * time.Millisecond
		slow    = 100 * time.Millisecond
	)
	s := samples{}
	err := b.interleave(b.without(sysGoCopy), b.cfg.slowReps, startOpts{}, func(in *instance, rep int) error {
		time.Sleep(500 * time.Millisecond)
		recs, killTime := paced(in, workers, pace, b.cfg.failDur, b.cfg.failKillAt, b.ups[0].kill)
		if err := b.ups[0].restart(); err != nil {
			return err
		}
		t := tallyFailover(recs, killTime, slow)
		recovery := t.lastBad.Sub(killTime)
		if t.failedNew > 0 && t.lastBad.After(killTime.Add(b.cfg.failDur-b.cfg.failKillAt-time.Second)) {
			recovery = -1 // still failing in the last second: never recovered
		}
		log.Printf("  failover %-14s rep %d: %d new conns after kill, %d failed, %d slow, max %s, %d broken in flight, recovery %s %s",
			in.name, rep, t.after, t.failedNew, t.slowNew, t.maxNew.Round(time.Millisecond), t.broken, recovery.Round(time.Millisecond), t.firstErr)
		s.add(in.name, "after", float64(t.after))
		s.add(in.name, "failed", float64(t.failedNew))
		s.add(in.name, "slow", float64(t.slowNew))
		s.add(in.name, "broken", float64(t.broken))
		s.add(in.name, "max", float64(t.maxNew)/float64(time.Millisecond))
		s.add(in.name, "recovery", recovery.Seconds())
		s.add(in.name, "p99before", float64(percentile(t.before, 99))/float64(time.Millisecond))
		return nil
	})
	if err != nil {
		return err
	}
	b.section("6. Failover",
		fmt.Sprintf("%d workers each start a connection (connect, 64 B echo, close) every %s for %s; at %s one of the three upstreams is killed (listener and its connections closed) and restarted after the run. Counts are medians per run; 'failed new (all runs)' is the sum.",
			workers, pace, b.cfg.failDur, b.cfg.failKillAt))
	var t table
	t.head = []string{colSystem, "new conns after kill", "failed new (all runs)", "slow new (> 100 ms)", "max new conn ms", "broken in flight", "recovery s", "p99 before kill ms"}
	for _, name := range b.without(sysGoCopy) {
		rec := fmtNum(s.med(name, "recovery"), 3)
		if s.med(name, "recovery") < 0 {
			rec = "never (failing until the end)"
		}
		t.add(name, fmtNum(s.med(name, "after"), 0), fmtNum(s.sum(name, "failed"), 0), fmtNum(s.med(name, "slow"), 0),
			fmtNum(s.med(name, "max"), 1), fmtNum(s.med(name, "broken"), 0), rec, fmtNum(s.med(name, "p99before"), 2))
	}
	b.rep.WriteString(t.String())
	return nil
}

// failoverTally sums up the connections of one failover run.
type failoverTally struct {
	before             []time.Duration // times of the connections started before the kill that succeeded
	broken             int             // started before the kill, failed
	after              int             // started after the kill
	failedNew, slowNew int             // of those, failed; succeeded but slower than slow
	maxNew             time.Duration   // the longest started after the kill
	lastBad            time.Time       // end of the last new one that failed or was slow; the kill when none
	firstErr           string          // of the new ones
}

// tallyFailover sorts recs around killTime; a new connection that took
// longer than slow counts as slow.
func tallyFailover(recs []connRecord, killTime time.Time, slow time.Duration) failoverTally {
	t := failoverTally{lastBad: killTime}
	for _, r := range recs {
		d := r.end.Sub(r.start)
		if r.start.Before(killTime) {
			if r.err != nil {
				t.broken++
			} else {
				t.before = append(t.before, d)
			}
			continue
		}
		t.after++
		t.maxNew = max(t.maxNew, d)
		if r.err != nil {
			t.failedNew++
			if t.firstErr == "" {
				t.firstErr = r.err.Error()
			}
		} else if d > slow {
			t.slowNew++
		}
		if (r.err != nil || d > slow) && r.end.After(t.lastBad) {
			t.lastBad = r.end
		}
	}
	return t
}

// Descriptor limit.
const (
	fdLimitNofile = 512 // the proxies' open-files limit
	fdLimitOver   = 600 // clients held at once, more than fit
	fdLimitFresh  = 20  // new clients after the release
)

// fdLimitResult is one proxy's run of the descriptor-limit scenario.
type fdLimitResult struct {
	name                      string
	held, served, servedAgain int
	fds                       int    // the proxy's descriptors while the clients were held
	limit                     string // an extractedprism build's connection_limit; "–" for the others
	health                    string
	firstOK                   time.Duration // from the release to the first new echo; -1 for never
	freshOK                   int
	alive, pass               bool
}

func (b *bench) fdLimitScenario() error {
	var results []fdLimitResult
	err := b.interleave(b.proxies(), 1, startOpts{nofile: fdLimitNofile}, func(in *instance, rep int) error {
		r := b.fdLimitRun(in)
		log.Printf("  fdlimit  %-14s: held %d, served %d, still served %d, %d descriptors, connection limit %s, %s, first new OK after %s, fresh %d/%d, alive %v: pass %v",
			in.name, r.held, r.served, r.servedAgain, r.fds, r.limit, r.health, r.firstOK.Round(time.Millisecond), r.freshOK, fdLimitFresh, r.alive, r.pass)
		results = append(results, r)
		return nil
	})
	if err != nil {
		return err
	}
	b.section("Descriptor limit",
		fmt.Sprintf("Each proxy starts under `ulimit -n %d` (HAProxy without `maxconn` and nginx without `worker_rlimit_nofile`, so both derive their limits from it). %d clients connect and each tries a 64 B echo within 1 s while all stay open; the served ones echo again; then all close, and %d new clients must each get an echo within 5 s. Descriptors are the proxy's own, from /proc/PID/fd, while all %d are connected. Pass: still alive, everything it accepted still served, and all new clients served.",
			fdLimitNofile, fdLimitOver, fdLimitFresh, fdLimitOver))
	var t table
	t.head = []string{colSystem, "connected", "served while over the limit", "still served", "descriptors held", "connection limit", "health endpoints", "first new echo after release", "new clients served", "pass"}
	for _, r := range results {
		first := "never (15 s)"
		if r.firstOK >= 0 {
			first = r.firstOK.Round(time.Millisecond).String()
		}
		t.add(r.name, strconv.Itoa(r.held), strconv.Itoa(r.served), strconv.Itoa(r.servedAgain), fmt.Sprintf("%d of %d", r.fds, fdLimitNofile),
			r.limit, r.health, first, fmt.Sprintf("%d/%d", r.freshOK, fdLimitFresh), passFail(r.pass))
	}
	b.rep.WriteString(t.String())
	b.fdLimitTarget(results)
	return nil
}

// fdLimitRun holds more clients than in's descriptors allow, checks that
// those it served are still served, releases them and checks new ones.
func (b *bench) fdLimitRun(in *instance) fdLimitResult {
	r := fdLimitResult{name: in.name, limit: "–", health: "–"}
	if b.env.isEP(in.name) {
		if v, err := in.metric("extractedprism_connection_limit"); err == nil {
			r.limit = fmtNum(v, 0)
		}
	}
	conns, served := holdOver(in, fdLimitOver)
	r.held = len(conns)
	r.served = len(served)
	r.servedAgain = echoAll(served, 3*time.Second)
	r.fds = fdCount(in.pid)
	if b.env.isEP(in.name) {
		r.health = fmt.Sprintf("/healthz %d, /readyz %d", in.healthz("/healthz"), in.healthz("/readyz"))
	}
	closeAll(conns)
	released := time.Now()
	r.firstOK = -1
	for time.Since(released) < 15*time.Second {
		if err := echoOnce(in.addr, 64, time.Second); err == nil {
			r.firstOK = time.Since(released)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.freshOK = freshConns(in, fdLimitFresh, 5*time.Second)
	r.alive = in.alive()
	r.pass = r.alive && r.served > 0 && r.servedAgain == r.served && r.firstOK >= 0 && r.freshOK == fdLimitFresh
	return r
}

// fdLimitTarget records extractedprism's run as the descriptor-limit
// target, with today's build's verdict beside it.
func (b *bench) fdLimitTarget(results []fdLimitResult) {
	if !b.compares(tgtFDLimit, sysEP) {
		return
	}
	var ep, base *fdLimitResult
	for i := range results {
		switch results[i].name {
		case sysEP:
			ep = &results[i]
		case sysBaseline:
			base = &results[i]
		}
	}
	if ep == nil {
		return
	}
	measured := fmt.Sprintf("under `ulimit -n %d`: %s: served %d of %d clients (connection limit %s, %d descriptors), %d still served; new clients %d/%d after the release",
		fdLimitNofile, passFail(ep.pass), ep.served, ep.held, ep.limit, ep.fds, ep.servedAgain, ep.freshOK, fdLimitFresh)
	if base != nil {
		measured += fmt.Sprintf(" (%s: %s, served %d)", sysBaseline, passFail(base.pass), base.served)
	}
	b.setTargetf(tgtFDLimit, ep.pass, "%s", measured)
}

// passFail is the table cell for a pass.
func passFail(pass bool) string {
	if pass {
		return "pass"
	}
	return "FAIL"
}

// holdOver opens n connections at once and tries one echo on each within
// 1 s; it returns every open connection and the ones that echoed.
func holdOver(in *instance, n int) (all, served []net.Conn) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	msg := echoMsg(64)
	for i := range n {
		wg.Go(func() {
			c, err := dialer.Dial("tcp", in.target(i))
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(time.Second))
			err = exchange(c, msg, make([]byte, 64))
			_ = c.SetDeadline(time.Time{})
			mu.Lock()
			all = append(all, c)
			if err == nil {
				served = append(served, c)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, served
}

// echoAll echoes once more on every connection, concurrently.
func echoAll(conns []net.Conn, timeout time.Duration) int {
	var ok sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for _, c := range conns {
		ok.Go(func() {
			_ = c.SetDeadline(time.Now().Add(timeout))
			msg := echoMsg(64)
			msg[0] = 'x' // not the first message: any byte is echoed
			if exchange(c, msg, make([]byte, 64)) == nil {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	ok.Wait()
	return n
}

// freshConns opens n new connections at once, each echoing within timeout.
func freshConns(in *instance, n int, timeout time.Duration) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range n {
		wg.Go(func() {
			if echoOnce(in.addr, 64, timeout) == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ok
}
