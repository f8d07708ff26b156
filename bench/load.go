package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const dialTimeout = 2 * time.Second

var dialer = net.Dialer{Timeout: dialTimeout}

// echoMsg returns an n-byte echo message: the mode byte, then a pattern.
func echoMsg(n int) []byte {
	m := make([]byte, n)
	m[0] = modeEcho
	for i := 1; i < n; i++ {
		m[i] = byte('a' + i%26)
	}
	return m
}

// exchange writes msg on c and reads it back into buf, within the
// deadline already set on c.
func exchange(c net.Conn, msg, buf []byte) error {
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if _, err := io.ReadFull(c, buf[:len(msg)]); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(buf[:len(msg)], msg) {
		return errors.New("echo mismatch")
	}
	return nil
}

// echoConn dials addr, exchanges msg once and closes: one short-lived
// client connection.
func echoConn(addr string, msg, buf []byte, timeout time.Duration) error {
	c, err := dialer.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	return exchange(c, msg, buf)
}

func echoOnce(addr string, n int, timeout time.Duration) error {
	msg := echoMsg(n)
	return echoConn(addr, msg, make([]byte, n), timeout)
}

// connRateResult is one run of the connection-rate scenario.
type connRateResult struct {
	ok, failed int
	rate       float64 // successful connections per second
	p50, p99   time.Duration
	cpuPerConn time.Duration // proxy utime+stime per connection
	firstErr   string
}

// connRate runs workers that each connect, echo 64 bytes and close, back
// to back, for dur.
func connRate(in *instance, workers int, dur time.Duration) connRateResult {
	cpu0 := in.cpu()
	start := time.Now()
	deadline := start.Add(dur)
	lats := make([][]time.Duration, workers)
	fails := make([]int, workers)
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			msg, buf := echoMsg(64), make([]byte, 64)
			lat := make([]time.Duration, 0, 1<<14)
			for n := w; time.Now().Before(deadline); n += workers {
				t0 := time.Now()
				if err := echoConn(in.target(n), msg, buf, 2*time.Second); err != nil {
					fails[w]++
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			lats[w] = lat
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lats...)
	r := connRateResult{ok: len(all)}
	for _, f := range fails {
		r.failed += f
	}
	r.rate = float64(r.ok) / elapsed.Seconds()
	r.p50, r.p99 = percentile(all, 50), percentile(all, 99)
	if r.ok > 0 {
		r.cpuPerConn = (in.cpu() - cpu0) / time.Duration(r.ok)
	}
	if v, ok := firstErr.Load().(string); ok {
		r.firstErr = v
	}
	return r
}

// pingPongResult is one run of the request/response scenario.
type pingPongResult struct {
	ops, failed    int
	rate           float64 // round trips per second
	p50, p99, p999 time.Duration
	cpuPerOp       time.Duration // proxy utime+stime per round trip
	firstErr       string
}

// pingPong exchanges 64-byte messages on conns persistent connections for
// dur; round trips of the first warmup are not recorded.
func pingPong(in *instance, conns int, dur, warmup time.Duration) pingPongResult {
	lats := make([][]time.Duration, conns)
	errs := make([]error, conns)
	var ready, wg sync.WaitGroup
	startGate := make(chan struct{})
	var startAt time.Time
	ready.Add(conns)
	for i := range conns {
		wg.Go(func() {
			c, err := dialer.Dial("tcp", in.target(i))
			ready.Done()
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close()
			<-startGate
			_ = c.SetDeadline(startAt.Add(dur + 10*time.Second))
			lats[i], errs[i] = pingPongLoop(c, startAt, dur, warmup)
		})
	}
	ready.Wait()
	cpu0 := in.cpu()
	startAt = time.Now()
	close(startGate)
	wg.Wait()
	all := slices.Concat(lats...)
	r := pingPongResult{ops: len(all)}
	if r.ops > 0 {
		// Warm-up round trips are not counted but cost CPU: scale.
		r.cpuPerOp = time.Duration(float64(in.cpu()-cpu0) * float64(dur-warmup) / float64(dur) / float64(r.ops))
	}
	for _, err := range errs {
		if err != nil {
			r.failed++
			if r.firstErr == "" {
				r.firstErr = err.Error()
			}
		}
	}
	r.rate = float64(r.ops) / (dur - warmup).Seconds()
	r.p50, r.p99, r.p999 = percentile(all, 50), percentile(all, 99), percentile(all, 99.9)
	return r
}

// pingPongLoop exchanges 64-byte messages on c from startAt until dur
// after it. It returns the round-trip times of those that began after
// warmup, and the error that ended the loop early.
func pingPongLoop(c net.Conn, startAt time.Time, dur, warmup time.Duration) ([]time.Duration, error) {
	msg, buf := echoMsg(64), make([]byte, 64)
	recordFrom, deadline := startAt.Add(warmup), startAt.Add(dur)
	lat := make([]time.Duration, 0, 1<<16)
	for {
		t0 := time.Now()
		if !t0.Before(deadline) {
			return lat, nil
		}
		if err := exchange(c, msg, buf); err != nil {
			return lat, err
		}
		if t0.After(recordFrom) {
			lat = append(lat, time.Since(t0))
		}
	}
}

// bulkResult is one run of the bulk scenario.
type bulkResult struct {
	bytes    int64
	elapsed  time.Duration
	gbps     float64       // 1e9 bytes per second
	cpu      time.Duration // proxy utime+stime during the run
	cpuPerGB float64       // proxy CPU seconds per 1e9 bytes
	err      string
}

// bulk downloads perStream bytes on each of streams connections at once
// and measures the proxy's CPU time around it.
func bulk(in *instance, streams int, perStream int64) bulkResult {
	var cpu0 time.Duration
	if in.pid != 0 {
		cpu0, _ = cpuTime(in.pid)
	}
	timeout := 30*time.Second + time.Duration(perStream*int64(streams)/(20<<20))*time.Second
	got := make([]int64, streams)
	errs := make([]error, streams)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() { got[i], errs[i] = download(in.target(i), perStream, timeout) })
	}
	wg.Wait()
	r := bulkResult{elapsed: time.Since(start)}
	if in.pid != 0 {
		cpu1, _ := cpuTime(in.pid)
		r.cpu = cpu1 - cpu0
	}
	for i := range streams {
		r.bytes += got[i]
		if errs[i] != nil && r.err == "" {
			r.err = errs[i].Error()
		}
	}
	r.gbps = float64(r.bytes) / r.elapsed.Seconds() / 1e9
	if r.bytes > 0 {
		r.cpuPerGB = r.cpu.Seconds() / (float64(r.bytes) / 1e9)
	}
	return r
}

func download(addr string, n int64, timeout time.Duration) (int64, error) {
	if n < 0 {
		return 0, fmt.Errorf("download: negative length %d", n)
	}
	c, err := dialer.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	var hdr [9]byte
	hdr[0] = modeGenerate
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	buf := make([]byte, bulkBufSize)
	var got int64
	for {
		k, err := c.Read(buf)
		got += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return got, err
		}
	}
	if got != n {
		return got, fmt.Errorf("download: got %d bytes; want %d", got, n)
	}
	return got, nil
}

// openIdle opens n connections to in, each proven end to end by a one-byte
// echo, with at most par in progress at once.
func openIdle(in *instance, n, par int, timeout time.Duration) ([]net.Conn, int, string) {
	conns := make([]net.Conn, n)
	var failed atomic.Int64
	var firstErr atomic.Value
	idx := make(chan int, n)
	for i := range n {
		idx <- i
	}
	close(idx)
	msg := []byte{modeEcho}
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			buf := make([]byte, 1)
			for i := range idx {
				c, err := dialer.Dial("tcp", in.target(i))
				if err == nil {
					_ = c.SetDeadline(time.Now().Add(timeout))
					err = exchange(c, msg, buf)
					_ = c.SetDeadline(time.Time{})
					if err != nil {
						_ = c.Close()
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	held := slices.DeleteFunc(conns, func(c net.Conn) bool { return c == nil })
	s, _ := firstErr.Load().(string)
	return held, int(failed.Load()), s
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// connRecord is one connection of the failover scenario.
type connRecord struct {
	start, end time.Time
	err        error
}

// paced runs workers that each start one short connection every pace
// (back to back when a connection takes longer) for dur. At killAt after
// the start, kill runs. It returns every connection and the kill time.
func paced(in *instance, workers int, pace, dur, killAt time.Duration, kill func()) ([]connRecord, time.Time) {
	start := time.Now()
	deadline := start.Add(dur)
	recs := make([][]connRecord, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			msg, buf := echoMsg(64), make([]byte, 64)
			// Spread the workers over one pace so starts are even.
			next := start.Add(pace * time.Duration(w) / time.Duration(workers))
			for n := w; ; n += workers {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				err := echoConn(in.target(n), msg, buf, 3*time.Second)
				recs[w] = append(recs[w], connRecord{start: t0, end: time.Now(), err: err})
				next = next.Add(pace)
				if now := time.Now(); next.Before(now) {
					next = now
				}
			}
		})
	}
	killTime := start.Add(killAt)
	time.Sleep(time.Until(killTime))
	killTime = time.Now()
	kill()
	wg.Wait()
	return slices.Concat(recs...), killTime
}
