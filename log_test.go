package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// stallWriter passes writes to buf until stalled is set, then blocks every
// write until release is closed, as a log pipe does once its reader stops
// reading (a stuck journald or container log shim) and the pipe is full.
// Each write that blocks is first copied to attempted, so a test can wait
// for the line the daemon tried to log.
type stallWriter struct {
	buf       syncBuffer
	attempted syncBuffer
	stalled   atomic.Bool
	release   chan struct{}
}

func (w *stallWriter) Write(p []byte) (int, error) {
	if w.stalled.Load() {
		_, _ = w.attempted.Write(p)
		<-w.release
	}
	return w.buf.Write(p)
}

func TestNewLogger(t *testing.T) {
	tests := []struct {
		threshold slog.Level
		level     slog.Level
		want      string // the printed level; "" when the record is dropped
	}{
		{threshold: slog.LevelDebug, level: slog.LevelDebug, want: "DEBUG"},
		{threshold: slog.LevelInfo, level: slog.LevelDebug, want: ""},
		{threshold: slog.LevelInfo, level: slog.LevelError, want: "ERROR"},
		{threshold: slog.LevelInfo, level: levelDPanic, want: "DPANIC"},
		{threshold: slog.LevelInfo, level: levelPanic, want: "PANIC"},
		{threshold: slog.LevelInfo, level: levelFatal, want: "FATAL"},
		{threshold: levelPanic, level: slog.LevelError, want: ""},
		{threshold: levelPanic, level: levelFatal, want: "FATAL"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v at %v", tt.level, tt.threshold), func(t *testing.T) {
			var out bytes.Buffer
			newLogger(tt.threshold, &out).Log(context.Background(), tt.level, "hello")
			if tt.want == "" {
				if out.Len() != 0 {
					t.Errorf("got %q; want nothing", out.String())
				}
				return
			}
			var record struct {
				Level string `json:"level"`
				Msg   string `json:"msg"`
			}
			if err := json.Unmarshal(out.Bytes(), &record); err != nil {
				t.Fatalf("decode %q: got %v; want nil", out.String(), err)
			}
			if record.Level != tt.want || record.Msg != "hello" {
				t.Errorf("got level %q msg %q; want level %q msg %q", record.Level, record.Msg, tt.want, "hello")
			}
		})
	}
}

// Durations are logged as text (JSON would have them in nanoseconds), and
// a long error, such as one repeating an upstream certificate's names, is
// cut in the log line.
func TestLoggerValues(t *testing.T) {
	var out bytes.Buffer
	newLogger(slog.LevelInfo, &out).With("interval", 20*time.Second).Warn("hello", "timeout", 1500*time.Millisecond,
		"err", errors.New(strings.Repeat("n", 50<<10)), "short", errors.New("kept"))
	var record map[string]any
	if err := json.Unmarshal(out.Bytes(), &record); err != nil {
		t.Fatalf("decode %q: %v", out.String(), err)
	}
	if record["timeout"] != "1.5s" || record["interval"] != "20s" {
		t.Errorf("durations: got timeout %v, interval %v; want \"1.5s\", \"20s\"", record["timeout"], record["interval"])
	}
	if got, _ := record["err"].(string); len(got) != maxLogError+3 || !strings.HasSuffix(got, "...") {
		t.Errorf("err of %d bytes; want %d ending in ...", len(got), maxLogError+3)
	}
	if record["short"] != "kept" {
		t.Errorf("short error: got %v; want \"kept\"", record["short"])
	}
}

// writeLines writes each line to w as one record, through one reused
// buffer as slog does.
func writeLines(t *testing.T, w io.Writer, lines ...string) {
	t.Helper()
	var buf []byte
	for _, l := range lines {
		buf = append(buf[:0], l+"\n"...)
		if n, err := w.Write(buf); n != len(buf) || err != nil {
			t.Fatalf("Write(%q): got %d, %v; want %d, nil", l, n, err, len(buf))
		}
	}
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + " " + strconv.Itoa(i)
	}
	return out
}

// stalledSink returns a running sink whose writer is stuck writing first
// to w until w.release is closed. Call inside a synctest bubble.
func stalledSink(t *testing.T, first string) (*logSink, *stallWriter) {
	t.Helper()
	w := &stallWriter{release: make(chan struct{})}
	w.stalled.Store(true)
	s := newLogSink(w)
	go s.run()
	writeLines(t, s, first)
	synctest.Wait() // run is blocked writing first
	return s, w
}

// A full queue drops records without blocking the logger, and once the
// reader takes lines again one warning counts them.
func TestLogSinkDropsWhenFullAndWarns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, w := stalledSink(t, "first")
		queued := numbered("queued", logQueueRecords)
		writeLines(t, s, queued...)
		writeLines(t, s, numbered("dropped", 5)...)
		if got := s.dropped.Load(); got != 5 {
			t.Errorf("dropped while stalled: got %d; want 5", got)
		}
		close(w.release)
		if !s.close(logFlushTimeout) {
			t.Fatal("close: run did not return")
		}
		lines := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
		if len(lines) != 2+len(queued) {
			t.Fatalf("lines: got %d; want %d", len(lines), 2+len(queued))
		}
		if lines[0] != "first" || !slices.Equal(lines[2:], queued) {
			t.Errorf("records around the warning: got %q, then %q...; want first, then the queued ones in order", lines[0], lines[2:4])
		}
		var warning struct {
			Level   string `json:"level"`
			Msg     string `json:"msg"`
			Dropped int    `json:"dropped"`
		}
		if err := json.Unmarshal([]byte(lines[1]), &warning); err != nil {
			t.Fatalf("warning %q: got %v; want JSON", lines[1], err)
		}
		if warning.Level != "WARN" || !strings.Contains(warning.Msg, "dropped") || warning.Dropped != 5 {
			t.Errorf("warning: got %q; want WARN saying 5 lines were dropped", lines[1])
		}
	})
}

// close writes what is queued before it returns, in order, so the last
// lines of a daemon that stops are not lost.
func TestLogSinkCloseFlushesQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, w := stalledSink(t, "line 0")
		want := numbered("line", 10)
		writeLines(t, s, want[1:]...)
		closed := make(chan bool, 1)
		go func() { closed <- s.close(time.Minute) }()
		synctest.Wait() // close has asked run to stop and waits for it
		close(w.release)
		if !<-closed {
			t.Fatal("close: run did not return")
		}
		if got := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n"); !slices.Equal(got, want) {
			t.Errorf("got %q; want %q", got, want)
		}
	})
}

// A stderr that takes nothing must not keep the daemon from exiting.
func TestLogSinkCloseIsBoundedWhileWriteIsStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, w := stalledSink(t, "stuck")
		writeLines(t, s, "queued")
		start := time.Now()
		if s.close(logFlushTimeout) {
			t.Error("close: got true; want false while run is stuck writing")
		}
		if got := time.Since(start); got != logFlushTimeout {
			t.Errorf("close took %v; want %v", got, logFlushTimeout)
		}
		close(w.release) // the bubble ends only when run does
		<-s.done
	})
}
