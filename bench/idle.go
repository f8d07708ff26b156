package main

import (
	"fmt"
	"log"
	"strings"
	"time"
)

// 4. Idle connections.
//
// Each run holds the connections twice: the second wave shows whether what
// the proxy kept after the first was reused or is lost.
func (b *bench) idleScenario() error {
	n, err := b.idleCount()
	if err != nil {
		return err
	}
	b.cfg.idleConns = n
	s := samples{}
	kindsSeen := map[string]string{}
	err = b.interleave(b.proxies(), b.cfg.slowReps, startOpts{}, func(in *instance, rep int) error {
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
		fd2, kinds2 := fdCount(in.pid), fdKinds(in.pid)
		perConn := float64(first.held-rss0) / float64(n)
		returned := 100 * float64(first.held-first.after) / float64(max(first.held-rss0, 1))
		kept := 100 * float64(second.after-first.after) / float64(max(first.held-rss0, 1))
		log.Printf("  idle     %-14s rep %d: RSS %d → %d → %d KiB, again → %d → %d KiB (%.2f KiB/conn, %.0f%% returned, second wave kept %.1f%% more), fds %d → %d → %d, kinds %v → %v → %v, kernel %.2f KiB/conn, closed in %s and %s",
			in.name, rep, rss0, first.held, first.after, second.held, second.after, perConn, returned, kept, fd0, first.fds, fd2, kinds0, first.kinds, kinds2, float64(first.kernel-mem0)/float64(n), first.closeTook, second.closeTook)
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
		s.add(in.name, "pipe2", float64(kinds2["pipe"]-kinds0["pipe"]))
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

// Idle connection count.
const (
	// minIdleConns is the fewest idle connections that still give a
	// per-connection figure above the noise of the proxy's own descriptors
	// and allocations.
	minIdleConns = 500
	// idleSample is how many idle connections probeIdle holds to count the
	// descriptors of one.
	idleSample = 200
	// idleMargin is left below an extractedprism build's bounds: the
	// connections of the wave before, still closing (the wave waits until
	// at most 8 sockets are left), hold slots and descriptors for a moment.
	idleMargin = 50
	// epReserve is what an extractedprism build's descriptor bound leaves
	// for the daemon itself (listeners, health checks, /metrics), as the
	// daemon's own reserve does.
	epReserve = 256
	// benchReserve is what this process's bound leaves for itself (the
	// upstreams' listeners, the runtime).
	benchReserve = 200
)

// idleProbe is what one extractedprism build showed with a sample of idle
// connections.
type idleProbe struct {
	system string
	limit  int     // its extractedprism_connection_limit; 0 when it has none
	fdsPer float64 // descriptors it held per idle connection
}

// idleBound is one limit on the idle connections every system can hold.
type idleBound struct {
	n   int
	why string
}

// idleBounds lists the limits on the idle connections under the open-files
// limit nofile, which every proxy inherits. This process holds the client
// and the upstream end of each connection. HAProxy and nginx are configured
// from nofile (haproxyConfig, nginxConfig). An extractedprism build is held
// to its connection limit, past which clients wait in the listen backlog
// and fail the wave's echo, and to the descriptors its idle connections
// were measured to hold, which need not match what the build counts for
// them (io.Copy keeps a splice pipe for each direction waiting to read).
func idleBounds(nofile int, systems []string, probes []idleProbe) []idleBound {
	bounds := []idleBound{{(nofile - benchReserve) / 2,
		"this process holds both ends of each connection under an open-files limit of " + fmtNum(float64(nofile), 0)}}
	for _, s := range systems {
		switch s {
		case sysHAProxy:
			bounds = append(bounds, idleBound{haproxyMaxconn(nofile), "HAProxy's maxconn"})
		case sysNginx:
			bounds = append(bounds, idleBound{nginxWorkerConns(nofile) / 2, "nginx's worker_connections, two a proxied connection"})
		}
	}
	for _, p := range probes {
		if p.limit > 0 {
			bounds = append(bounds, idleBound{p.limit - idleMargin,
				fmt.Sprintf("%s's connection limit of %s", p.system, fmtNum(float64(p.limit), 0))})
		}
		if p.fdsPer > 0 {
			bounds = append(bounds, idleBound{int(float64(nofile-epReserve)/p.fdsPer) - idleMargin,
				fmt.Sprintf("%s holds %s descriptors per idle connection under an open-files limit of %s", p.system, fmtNum(p.fdsPer, 2), fmtNum(float64(nofile), 0))})
		}
	}
	return bounds
}

// tightest returns the bound below want, the smallest, or want itself
// with no reason when none is below it.
func tightest(want int, bounds []idleBound) idleBound {
	best := idleBound{n: want}
	for _, bd := range bounds {
		if bd.n < best.n {
			best = bd
		}
	}
	return best
}

// idleCount returns how many idle connections every proxy can hold at
// once, at most -idle-conns, and notes what lowered it.
func (b *bench) idleCount() (int, error) {
	var probes []idleProbe
	for _, name := range b.proxies() {
		if !b.env.isEP(name) {
			continue
		}
		p, err := b.probeIdle(name)
		if err != nil {
			return 0, err
		}
		probes = append(probes, p)
	}
	want := b.cfg.idleConns
	bd := tightest(want, idleBounds(b.env.nofile, b.proxies(), probes))
	if bd.n < minIdleConns {
		return 0, fmt.Errorf("only %d idle connections fit (%s); raise the open-files limit", bd.n, bd.why)
	}
	if bd.n < want {
		log.Printf("idle connections lowered from %d to %d: %s", want, bd.n, bd.why)
		note := fmt.Sprintf("The idle scenario held %s connections, not the %s asked for: %s.", fmtNum(float64(bd.n), 0), fmtNum(float64(want), 0), bd.why)
		if b.env.nofile < 1<<20 {
			note += fmt.Sprintf(" The open-files limit could not be raised to 1,048,576 here (it stayed at %s).", fmtNum(float64(b.env.nofile), 0))
		}
		b.note = append(b.note, note+" Per-connection figures do not depend on the count.")
	}
	return bd.n, nil
}

// probeIdle starts extractedprism build name once, reads its connection
// limit and counts the descriptors a sample of idle connections holds.
func (b *bench) probeIdle(name string) (idleProbe, error) {
	in, err := b.start(name, startOpts{})
	if err != nil {
		return idleProbe{}, err
	}
	defer b.stop(in)
	p := idleProbe{system: name}
	if v, err := in.metric("extractedprism_connection_limit"); err == nil {
		p.limit = int(v)
	} else {
		log.Printf("  idle     %-14s probe: no connection limit (%v); counting descriptors only", name, err)
	}
	sample := idleSample
	if p.limit > 0 {
		sample = min(sample, p.limit/2)
	}
	if sample < 1 {
		return p, fmt.Errorf("%s: a connection limit of %d leaves no idle connections", name, p.limit)
	}
	time.Sleep(500 * time.Millisecond)
	fd0 := fdCount(in.pid)
	conns, failed, firstErr := openIdle(in, sample, 16, 5*time.Second)
	defer closeAll(conns)
	if failed > 0 {
		return p, fmt.Errorf("%s: %d of %d sample idle connections failed: %s", name, failed, sample, firstErr)
	}
	time.Sleep(200 * time.Millisecond)
	p.fdsPer = float64(fdCount(in.pid)-fd0) / float64(sample)
	log.Printf("  idle     %-14s probe: connection limit %d, %.2f descriptors per idle connection (%d held)", name, p.limit, p.fdsPer, sample)
	return p, nil
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
		fmt.Sprintf("%s connections opened through the proxy (each proven by a 1 B echo) and held idle, then closed; then the same again in the same process. RSS of the proxying process before, with the connections open, and %s after they closed; descriptors from /proc/PID/fd before and with the connections open. \"Growth returned\" is the share of the first wave's growth gone %s after it closed; \"second wave kept\" is how much higher RSS stays after the second wave than after the first, as a share of the first wave's growth: near 0 when what was kept is reused rather than lost.",
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
	b.idleTargets(s, kindsSeen)
}

// idleTargets records the per-connection targets and notes what the
// extractedprism builds' descriptors were.
func (b *bench) idleTargets(s samples, kindsSeen map[string]string) {
	memOK, fdsOK := b.compares(tgtConnMem, sysEP), b.compares(tgtConnFDs, sysEP)
	if memOK && fdsOK {
		b.setTargetf(tgtConnMem, s.med(sysEP, "perconn") <= maxConnKiB, "RSS growth per connection: %s", b.perBuild(func(sys string) string {
			return fmtNum(s.med(sys, "perconn"), 2) + " KiB"
		}))
		b.setTargetf(tgtConnFDs, s.med(sysEP, "fdper") <= maxConnFDs+fdSlack, "per connection: %s", b.perBuild(func(sys string) string {
			return fmt.Sprintf("%s = %s sockets + %s pipe ends", fmtNum(s.med(sys, "fdper"), 2), fmtNum(s.med(sys, "sockper"), 2), fmtNum(s.med(sys, "pipeper"), 2))
		}))
	}
	var kinds []string
	for _, name := range b.proxies() {
		if !b.env.isEP(name) {
			continue
		}
		kinds = append(kinds, name+" "+kindsSeen[name])
		if left := s.med(name, "fd2"); left > 100 {
			b.note = append(b.note, fmt.Sprintf("%s after the idle connections closed, %s still held %s more descriptors than before (%s of them pipe ends).",
				b.cfg.settle, name, fmtNum(left, 0), fmtNum(s.med(name, "pipe2"), 0)))
		}
	}
	if len(kinds) > 0 {
		b.note = append(b.note, "Descriptors by kind, before → with the idle connections open: "+strings.Join(kinds, "; ")+". HAProxy and nginx hold 2 per connection (its two sockets).")
	}
}
