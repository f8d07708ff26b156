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

func (b *bench) addTarget(what, measured string, met bool) {
	b.tgts = append(b.tgts, target{what: what, measured: measured, met: met, known: true})
}

// reference returns what the gocopy reference measured, as a suffix for a
// target's measured value, or "" when it did not run.
func (b *bench) reference(measured string) string {
	if !b.has(sysGoCopy) {
		return ""
	}
	return "; Go reference (gocopy): " + measured
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
	if b.has(sysEP) && b.has(sysHAProxy) {
		ep, hp := s.med(sysEP, "rate"), s.med(sysHAProxy, "rate")
		b.addTarget("Connection rate ≥ HAProxy", fmt.Sprintf("%s vs %s conn/s (%s)%s", fmtNum(ep, 0), fmtNum(hp, 0), ratio(ep, hp),
			b.reference(fmt.Sprintf("%s conn/s (%s)", fmtNum(s.med(sysGoCopy, "rate"), 0), ratio(s.med(sysGoCopy, "rate"), hp)))), ep >= hp)
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
	if b.has(sysEP) && b.has(sysHAProxy) {
		for _, conns := range connCounts {
			suffix := fmt.Sprintf("/%d", conns)
			for _, m := range []string{"p50", "p99"} {
				ep, hp := s.med(sysEP+suffix, m), s.med(sysHAProxy+suffix, m)
				b.addTarget(fmt.Sprintf("Request/response %s within 10%% of HAProxy, %d conn", m, conns),
					fmt.Sprintf("%s vs %s µs (%s)", fmtNum(ep, 0), fmtNum(hp, 0), ratio(ep, hp)), ep <= 1.1*hp)
			}
		}
	}
	return nil
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
	if b.has(sysEP) && b.has(sysHAProxy) {
		for _, streams := range streamCounts {
			suffix := fmt.Sprintf("/%d", streams)
			ep, hp := s.med(sysEP+suffix, "gbps"), s.med(sysHAProxy+suffix, "gbps")
			b.addTarget(fmt.Sprintf("Bulk throughput ≥ HAProxy, %d stream(s)", streams),
				fmt.Sprintf("%s vs %s GB/s (%s)", fmtNum(ep, 2), fmtNum(hp, 2), ratio(ep, hp)), ep >= hp)
			c := s.med(sysEP+suffix, "cpugb")
			b.addTarget(fmt.Sprintf("Bulk ≤ 0.2 proxy CPU-s/GB, %d stream(s)", streams),
				fmt.Sprintf("%s CPU-s/GB (HAProxy %s)%s", fmtNum(c, 3), fmtNum(s.med(sysHAProxy+suffix, "cpugb"), 3),
					b.reference(fmtNum(s.med(sysGoCopy+suffix, "cpugb"), 3)+" CPU-s/GB")), c <= 0.2)
		}
	}
	return nil
}

// straceSyscalls are the data-path calls counted under strace.
var straceSyscalls = []string{"splice", "read", "write", "recvfrom", "sendto", "readv", "writev"}

// Splice check: one bulk download per proxy under strace -f -c.
func (b *bench) straceScenario() error {
	if !installed("strace") {
		b.note = append(b.note, "strace is not installed: the splice check did not run.")
		return nil
	}
	type row struct {
		name  string
		calls map[string][2]int // calls, errors
	}
	var rows []row
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
		rows = append(rows, row{name, calls})
	}
	b.section("Splice check (strace)",
		fmt.Sprintf("One download through each proxy (%s through the extractedprism builds, %s through the others) with `strace -f -c -e trace=%s -p PID` attached to the proxying process. Calls (errors, mostly EAGAIN, in parentheses). strace slows the proxy; this run only counts calls.",
			mib(b.cfg.straceBytes), mib(b.cfg.straceBytes/4), strings.Join(straceSyscalls, ",")))
	var t table
	t.head = append([]string{colSystem}, straceSyscalls...)
	t.head = append(t.head, "bytes per successful splice")
	for _, r := range rows {
		cells := []string{r.name}
		for _, sc := range straceSyscalls {
			c := r.calls[sc]
			cell := fmtNum(float64(c[0]), 0)
			if c[1] > 0 {
				cell += fmt.Sprintf(" (%s)", fmtNum(float64(c[1]), 0))
			}
			cells = append(cells, cell)
		}
		per := "–"
		if ok := r.calls["splice"][0] - r.calls["splice"][1]; ok > 0 {
			// Each byte is spliced twice: socket → pipe, pipe → socket.
			per = fmtNum(float64(2*b.cfg.straceBytes)/float64(ok), 0)
		}
		t.add(append(cells, per)...)
		if r.name == sysEP {
			c := r.calls
			verdict := "splice is in effect"
			if c["splice"][0] == 0 || c["read"][0]+c["write"][0] > c["splice"][0] {
				verdict = "splice is NOT in effect"
			}
			b.note = append(b.note, fmt.Sprintf("Splice check: during a %s download extractedprism made %s splice calls and %s read / %s write calls: %s (the remaining reads and writes are the runtime's and the health checks').",
				mib(b.cfg.straceBytes), fmtNum(float64(c["splice"][0]), 0), fmtNum(float64(c["read"][0]), 0), fmtNum(float64(c["write"][0]), 0), verdict))
		}
	}
	b.rep.WriteString(t.String())
	return nil
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

// 4. Idle connections.
//
// Each run holds the connections twice: the second wave shows whether what
// the proxy kept after the first was reused or is lost.
func (b *bench) idleScenario() error {
	n := b.cfg.idleConns
	s := samples{}
	kindsSeen := map[string]string{}
	err := b.interleave(b.proxies(), b.cfg.slowReps, startOpts{}, func(in *instance, rep int) error {
		time.Sleep(500 * time.Millisecond)
		rss0, fd0, kinds0, mem0 := rssKiB(in.pid), fdCount(in.pid), fdKinds(in.pid), kernelKiB()
		first, err := b.idleWave(in, n, kinds0)
		if err != nil {
			return err
		}
		second, err := b.idleWave(in, n, kinds0)
		if err != nil {
			return err
		}
		fd2 := fdCount(in.pid)
		perConn := float64(first.held-rss0) / float64(n)
		returned := 100 * float64(first.held-first.after) / float64(max(first.held-rss0, 1))
		kept := 100 * float64(second.after-first.after) / float64(max(first.held-rss0, 1))
		log.Printf("  idle     %-14s rep %d: RSS %d → %d → %d KiB, again → %d → %d KiB (%.2f KiB/conn, %.0f%% returned, second wave kept %.1f%% more), fds %d → %d → %d, kinds %v → %v, kernel %.2f KiB/conn, closed in %s and %s",
			in.name, rep, rss0, first.held, first.after, second.held, second.after, perConn, returned, kept, fd0, first.fds, fd2, kinds0, first.kinds, float64(first.kernel-mem0)/float64(n), first.closeTook, second.closeTook)
		s.add(in.name, "rss0", float64(rss0)/1024)
		s.add(in.name, "rss1", float64(first.held)/1024)
		s.add(in.name, "perconn", perConn)
		s.add(in.name, "fdper", float64(first.fds-fd0)/float64(n))
		s.add(in.name, "sockper", float64(first.kinds["socket"]-kinds0["socket"])/float64(n))
		s.add(in.name, "pipeper", float64(first.kinds["pipe"]-kinds0["pipe"])/float64(n))
		s.add(in.name, "rss2", float64(first.after)/1024)
		s.add(in.name, "returned", returned)
		s.add(in.name, "rss3", float64(second.held)/1024)
		s.add(in.name, "rss4", float64(second.after)/1024)
		s.add(in.name, "kept", kept)
		s.add(in.name, "fd2", float64(fd2-fd0))
		s.add(in.name, "machine", float64(first.kernel-mem0)/float64(n))
		kindsSeen[in.name] = fmt.Sprintf("%v → %v", kinds0, first.kinds)
		return nil
	})
	if err != nil {
		return err
	}
	b.idleReport(s, n, kindsSeen)
	return nil
}

// wave is one wave of the idle scenario's run.
type wave struct {
	held, after int64 // proxy RSS in KiB with the connections held and settled after they closed
	fds         int   // proxy descriptors while held
	kinds       map[string]int
	kernel      int64 // machine's kernel memory in KiB while held
	closeTook   time.Duration
}

// idleWave opens n idle connections through in, holds them for a second,
// closes them and waits for the proxy to close its sockets (kinds0 is the
// proxy's descriptor count by kind before) and then b.cfg.settle.
func (b *bench) idleWave(in *instance, n int, kinds0 map[string]int) (wave, error) {
	conns, failed, firstErr := openIdle(in, n, 64, 5*time.Second)
	if failed > 0 {
		closeAll(conns)
		return wave{}, fmt.Errorf("%d of %d idle connections failed: %s", failed, n, firstErr)
	}
	time.Sleep(time.Second)
	w := wave{held: rssKiB(in.pid), fds: fdCount(in.pid), kinds: fdKinds(in.pid), kernel: kernelKiB()}
	closeAll(conns)
	start := time.Now()
	for fdKinds(in.pid)["socket"] > kinds0["socket"]+8 && time.Since(start) < 20*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	w.closeTook = time.Since(start).Round(10 * time.Millisecond)
	time.Sleep(b.cfg.settle)
	w.after = rssKiB(in.pid)
	return w, nil
}

// idleReport writes the idle scenario's table, targets and notes.
func (b *bench) idleReport(s samples, n int, kindsSeen map[string]string) {
	b.section("4. Idle connections",
		fmt.Sprintf("%s connections opened through the proxy (each proven by a 1 B echo) and held idle, then closed; then the same again in the same process. RSS of the proxying process before, with the connections open, and %s after they closed. \"Growth returned\" is the share of the first wave's growth gone %s after it closed; \"second wave kept\" is how much higher RSS stays after the second wave than after the first, as a share of the first wave's growth: near 0 when what was kept is reused rather than lost.",
			fmtNum(float64(n), 0), b.cfg.settle, b.cfg.settle))
	var t table
	t.head = []string{colSystem, "RSS before MiB", "RSS held MiB", "KiB/conn", colToHAProxy, "fds/conn (sockets + pipes)", "RSS after close MiB", "growth returned", "second wave: held / after close MiB", "second wave kept", "fds left after close", "kernel KiB/conn (machine)"}
	for _, name := range b.proxies() {
		_, h := rel(s, name, "perconn", "")
		t.add(name, fmtNum(s.med(name, "rss0"), 1), fmtNum(s.med(name, "rss1"), 1), fmtNum(s.med(name, "perconn"), 2), h,
			fmt.Sprintf("%s (%s + %s)", fmtNum(s.med(name, "fdper"), 2), fmtNum(s.med(name, "sockper"), 2), fmtNum(s.med(name, "pipeper"), 2)),
			fmtNum(s.med(name, "rss2"), 1), fmtNum(s.med(name, "returned"), 0)+" %",
			fmtNum(s.med(name, "rss3"), 1)+" / "+fmtNum(s.med(name, "rss4"), 1), fmtNum(s.med(name, "kept"), 1)+" %",
			fmtNum(s.med(name, "fd2"), 0), fmtNum(s.med(name, "machine"), 1))
	}
	b.rep.WriteString(t.String())
	if b.has(sysEP) {
		b.idleTargets(s, kindsSeen)
	}
}

// idleTargets records extractedprism's idle-connection targets and notes.
func (b *bench) idleTargets(s samples, kindsSeen map[string]string) {
	pc, ret, kept := s.med(sysEP, "perconn"), s.med(sysEP, "returned"), s.med(sysEP, "kept")
	b.addTarget("≤ 10 KiB proxy memory per idle connection", fmtNum(pc, 2)+" KiB/conn", pc <= 10)
	b.addTarget("Memory returned after close (≥ 75 % of the growth)", fmt.Sprintf("%s %% returned after %s", fmtNum(ret, 0), b.cfg.settle), ret >= 75)
	b.addTarget("What is kept after close is reused (second wave keeps ≤ 5 % more)", fmtNum(kept, 1)+" % more", kept <= 5)
	fdper, pipes := s.med(sysEP, "fdper"), s.med(sysEP, "pipeper")
	verdict := "confirmed"
	if math.Abs(fdper-2) > 0.1 {
		verdict = "NOT confirmed"
	}
	b.note = append(b.note, fmt.Sprintf("Descriptors: extractedprism holds %s descriptors per idle connection (%s sockets, %s pipe ends), so the claim that an idle connection holds only its two sockets (splice pipes are borrowed while bytes move) is %s. Descriptor kinds before → during: %s. HAProxy and nginx hold 2 (the two sockets).",
		fmtNum(fdper, 2), fmtNum(s.med(sysEP, "sockper"), 2), fmtNum(pipes, 2), verdict, kindsSeen[sysEP]))
	if left := s.med(sysEP, "fd2"); left > 100 {
		b.note = append(b.note, fmt.Sprintf("After the idle connections closed, extractedprism still held %s more descriptors than before, for %s.",
			fmtNum(left, 0), b.cfg.settle))
	}
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
		"Idle proxy with three healthy upstreams after two health-check rounds; extractedprism's /metrics scraped three times before RSS is read.")
	var t table
	t.head = []string{colSystem, "processes", "RSS MiB (proxying process)", "RSS MiB (all processes)", "fds"}
	for _, name := range b.proxies() {
		t.add(name, fmtNum(s.med(name, "procs"), 0), fmtNum(s.med(name, "rss"), 1), fmtNum(s.med(name, "rssall"), 1), fmtNum(s.med(name, "fds"), 0))
	}
	b.rep.WriteString(t.String())
	b.rep.WriteString("\n")
	var bt table
	bt.head = []string{"Binary", "bytes", "MB (10^6)", "MiB"}
	sizeRow := func(label, path string) int64 {
		st, err := os.Stat(path)
		if err != nil {
			return -1
		}
		bt.add(label, fmtNum(float64(st.Size()), 0), fmtNum(float64(st.Size())/1e6, 1), fmtNum(float64(st.Size())/(1<<20), 1))
		return st.Size()
	}
	sizeRow("extractedprism (`go build`)", b.cfg.epBin)
	stripped := int64(-1)
	if b.cfg.epStripped != "" {
		stripped = sizeRow("extractedprism (`go build -ldflags='-s -w'`)", b.cfg.epStripped)
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		sizeRow("haproxy (Debian, dynamically linked)", p)
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		sizeRow("nginx (Debian, dynamically linked)", p)
		sizeRow("nginx stream module", "/usr/lib/nginx/modules/ngx_stream_module.so")
	}
	b.rep.WriteString(bt.String())
	if b.has(sysEP) {
		r := s.med(sysEP, "rss")
		b.addTarget("Idle RSS ≤ 20 MiB", fmtNum(r, 1)+" MiB", r <= 20)
		if stripped > 0 {
			b.addTarget("Stripped binary ≤ 25 MB", fmt.Sprintf("%s MB (%s MiB)", fmtNum(float64(stripped)/1e6, 1), fmtNum(float64(stripped)/(1<<20), 1)), float64(stripped) <= 25e6)
		}
	}
	return nil
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
	if b.has(sysEP) {
		f := s.sum(sysEP, "failed")
		b.addTarget("Failover kill: zero failed new connections", fmt.Sprintf("%s failed over %d runs", fmtNum(f, 0), b.cfg.slowReps), f == 0)
	}
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
func (b *bench) fdLimitScenario() error {
	const (
		nofile = 512
		over   = 600
		fresh  = 20
	)
	type result struct {
		name                      string
		held, served, servedAgain int
		health                    string
		firstOK                   time.Duration
		freshOK                   int
		alive, pass               bool
	}
	var results []result
	err := b.interleave(b.proxies(), 1, startOpts{nofile: nofile}, func(in *instance, rep int) error {
		r := result{name: in.name, health: "–"}
		conns, served := holdOver(in, over)
		r.held = len(conns)
		r.served = len(served)
		r.servedAgain = echoAll(served, 3*time.Second)
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
		r.freshOK = freshConns(in, fresh, 5*time.Second)
		r.alive = in.alive()
		r.pass = r.alive && r.served > 0 && r.servedAgain == r.served && r.firstOK >= 0 && r.freshOK == fresh
		log.Printf("  fdlimit  %-14s: held %d, served %d, still served %d, %s, first new OK after %s, fresh %d/%d, alive %v: pass %v",
			in.name, r.held, r.served, r.servedAgain, r.health, r.firstOK.Round(time.Millisecond), r.freshOK, fresh, r.alive, r.pass)
		results = append(results, r)
		return nil
	})
	if err != nil {
		return err
	}
	b.section("Descriptor limit",
		fmt.Sprintf("Each proxy starts under `ulimit -n %d` (HAProxy without `maxconn` and nginx without `worker_rlimit_nofile`, so both derive their limits from it). %d clients connect and each tries a 64 B echo within 1 s while all stay open; the served ones echo again; then all close, and %d new clients must each get an echo within 5 s. Pass: still alive, everything it accepted still served, and all new clients served.",
			nofile, over, fresh))
	var t table
	t.head = []string{colSystem, "connected", "served while over the limit", "still served", "health endpoints", "first new echo after release", "new clients served", "pass"}
	for _, r := range results {
		first := "never (15 s)"
		if r.firstOK >= 0 {
			first = r.firstOK.Round(time.Millisecond).String()
		}
		pass := "FAIL"
		if r.pass {
			pass = "pass"
		}
		t.add(r.name, strconv.Itoa(r.held), strconv.Itoa(r.served), strconv.Itoa(r.servedAgain), r.health, first, fmt.Sprintf("%d/%d", r.freshOK, fresh), pass)
		if r.name == sysEP {
			b.addTarget("At the descriptor limit: keeps serving, accepts again when descriptors free up",
				fmt.Sprintf("served %d, still served %d, new clients %d/%d", r.served, r.servedAgain, r.freshOK, fresh), r.pass)
		}
	}
	b.rep.WriteString(t.String())
	return nil
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
