package main

// Beyond the spec: logging never blocks the daemon. A write to stderr
// blocks while its reader (journald, a container log shim) is not reading;
// one stalled write once froze new connections, the liveness beat and
// shutdown. Records go through a bounded queue to one writer goroutine.

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// logQueueRecords bounds the records held for a log reader that is not
	// reading: at a few hundred bytes a record (errors cut to maxLogError)
	// about 1 MiB, minutes of state changes at info level.
	logQueueRecords = 4096
	// logFlushTimeout bounds how long the exit waits for queued lines: long
	// enough for a working stderr, short enough that a stuck one cannot
	// hold up a restart.
	logFlushTimeout = 2 * time.Second
	// maxLogError bounds an error's text in a log line. Errors carry text
	// from peers, such as the names in a certificate, tens of KiB of it.
	maxLogError = 2 << 10
)

// newLogger returns a logger writing JSON records of at least level to w.
func newLogger(level slog.Level, w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: nameLevel}))
}

// nameLevel prints the levels above Error by name ("FATAL") instead of as
// an offset ("ERROR+6"), durations as text ("30s") where JSON would have
// nanoseconds, and errors cut to maxLogError bytes.
func nameLevel(groups []string, a slog.Attr) slog.Attr {
	switch v := a.Value.Any().(type) {
	case time.Duration:
		return slog.String(a.Key, v.String())
	case error:
		if text := v.Error(); len(text) > maxLogError {
			return slog.String(a.Key, cutText(text, maxLogError)+"...")
		}
	case slog.Level:
		for name, l := range logLevels() {
			if l == v && l > slog.LevelError && len(groups) == 0 && a.Key == slog.LevelKey {
				return slog.String(a.Key, strings.ToUpper(name))
			}
		}
	}
	return a
}

// logSink is the queue between the logger and stderr. Write queues a copy
// of each record without blocking, dropping and counting it when the queue
// is full; run, the one writer, writes the queue to out in order.
type logSink struct {
	out        io.Writer
	records    chan []byte
	dropped    atomic.Int64  // since the last warning
	stop, done chan struct{} // done is closed when run returns
}

func newLogSink(out io.Writer) *logSink {
	return &logSink{out: out, records: make(chan []byte, logQueueRecords), stop: make(chan struct{}), done: make(chan struct{})}
}

// Write queues a copy of p (slog reuses its buffer). It reports success
// even for a dropped record: the logger has nothing better to do.
func (s *logSink) Write(p []byte) (int, error) {
	select {
	case s.records <- bytes.Clone(p):
	default:
		s.dropped.Add(1)
	}
	return len(p), nil
}

// run writes queued records to out until close is called, then what is
// left. Write errors are ignored: EPIPE is expected once the reader has
// gone (SIGPIPE is caught), and nobody else could report them.
func (s *logSink) run() {
	defer close(s.done)
	for {
		select {
		case r := <-s.records:
			s.write(r)
		case <-s.stop:
			// run is the only reader: a record counted is there to take.
			for len(s.records) > 0 {
				s.write(<-s.records)
			}
			return
		}
	}
}

// write writes r and then, once out takes lines again, how many were
// dropped meanwhile: straight to out, at warn whatever --log-level says.
func (s *logSink) write(r []byte) {
	_, _ = s.out.Write(r)
	for n := s.dropped.Swap(0); n > 0; n = s.dropped.Swap(0) {
		newLogger(slog.LevelWarn, s.out).Warn("log lines dropped: the log reader was not keeping up", "dropped", n)
	}
}

// close makes run write what is queued and return, waits for it at most
// timeout, and reports whether it returned: a writer stuck on out cannot be
// interrupted, and the process ending is what ends it then.
func (s *logSink) close(timeout time.Duration) bool {
	close(s.stop)
	return !await(s.done, timeout)
}

// logNote is a log line the pool writes once its lock is released, so that
// formatting and writing a line never lengthen its critical sections.
type logNote struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	args  []any
}

// note queues a log line of u; p.mu must be held.
func (p *pool) note(u *upstream, level slog.Level, msg string, args ...any) {
	p.notes = append(p.notes, logNote{u.log, level, msg, args})
}

// unlock releases p.mu and writes the lines noted while it was held.
func (p *pool) unlock() {
	notes := p.notes
	p.notes = nil
	p.mu.Unlock()
	for _, n := range notes {
		n.log.Log(p.ctx, n.level, n.msg, n.args...)
	}
}

// noteUsableLocked logs an error when the last usable upstream goes, once
// for the whole episode (each upstream's own lines say why), and when one
// is usable again. New connections then get only last-resort dials, and
// the node is about to lose the API.
func (p *pool) noteUsableLocked(usable int) {
	switch {
	case p.closed:
	case usable == 0 && p.unusableSince.IsZero():
		p.unusableSince = time.Now()
		p.notes = append(p.notes, logNote{p.log, slog.LevelError, "no upstream usable: new connections get last-resort dials only",
			[]any{"upstreams", len(p.upstreams)}})
	case usable > 0 && !p.unusableSince.IsZero():
		p.notes = append(p.notes, logNote{p.log, slog.LevelInfo, "upstream usable again",
			[]any{"usable", usable, "after", time.Since(p.unusableSince).Round(time.Millisecond)}})
		p.unusableSince = time.Time{}
	}
}

// rateLog spaces a repeated line: up to burst lines (at least one) in
// every, the first at once; past them occurrences are only counted, and the
// next line says how many were left out.
type rateLog struct {
	every time.Duration
	burst int
	mu    sync.Mutex // guards the fields below
	start time.Time  // of the current window; zero before the first line
	lines int        // logged in the current window
	left  int        // left out since the last line
}

// note counts one occurrence at now and reports whether a line is due, with
// how many occurrences were left out before it.
func (r *rateLog) note(now time.Time) (left int, due bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.start) >= r.every {
		r.start, r.lines = now, 0
	}
	if r.lines >= max(r.burst, 1) {
		r.left++
		return 0, false
	}
	r.lines++
	left, r.left = r.left, 0
	return left, true
}

// await waits until done is closed or d passes, and reports whether d
// passed first; a context's Done channel makes it a sleep that ends early.
// Every backoff, and every bounded wait for goroutines to end, uses it.
func await(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// backoff is a retry delay that doubles from first up to limit with each
// failure in a row; cur is zero before the first.
type backoff struct{ first, limit, cur time.Duration }

// next returns the delay after one more failure.
func (b *backoff) next() time.Duration {
	b.cur = min(max(2*b.cur, b.first), b.limit)
	return b.cur
}

// reset starts the next failure over from first.
func (b *backoff) reset() { b.cur = 0 }

// jitter returns d varied at random by up to spread either way, so that
// the nodes of a fleet do not act in lockstep.
func jitter(d, spread time.Duration) time.Duration {
	return d - spread + rand.N(2*spread+1) //nolint:gosec // spreading needs no unpredictability
}

// startLogging returns the daemon's logger, writing through a logSink to
// stderr, and the function that flushes it at exit.
func startLogging(level slog.Level, stderr io.Writer) (*slog.Logger, func()) {
	// A write to a closed stderr (a log shipper or `| tee` that went away)
	// would kill the daemon with SIGPIPE and drop every proxied connection.
	// With SIGPIPE notified the write just fails. Unlike signal.Ignore,
	// this is not inherited by programs the daemon starts (a kubeconfig
	// credential plugin).
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	sink := newLogSink(stderr)
	go sink.run()
	return newLogger(level, sink), func() {
		// A writer still stuck after the flush's bound may yet meet a
		// closed pipe, so SIGPIPE then stays caught until the exit.
		if sink.close(logFlushTimeout) {
			signal.Stop(pipes)
		}
	}
}

// writeExitError writes the final error line, waiting for it at most as
// long as for the log: a reader that stopped reading must not hold the exit.
func writeExitError(w io.Writer, err error) {
	written := make(chan struct{})
	go func() { fmt.Fprintln(w, "extractedprism:", err); close(written) }()
	await(written, logFlushTimeout)
}
