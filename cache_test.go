package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// What store writes, load and loadCache read back; a missing cache is no
// list, no error and no warning.
func TestEndpointCacheRoundTrip(t *testing.T) {
	logs := &syncBuffer{}
	c := &endpointCache{path: filepath.Join(t.TempDir(), "endpoints.json"), log: slog.New(slog.NewTextHandler(logs, nil))}
	if eps, err := c.load(); err != nil || eps != nil {
		t.Fatalf("load of a missing cache: got %v, %v; want nil, nil", eps, err)
	}
	if eps := c.loadCache(); eps != nil || logs.String() != "" {
		t.Errorf("loadCache of a missing cache: got %q, log %q; want nil and no log", eps, logs.String())
	}
	want := []string{"10.0.0.1:6443", "[fd00::1]:6443"}
	if err := c.store(want); err != nil {
		t.Fatal(err)
	}
	if got, err := c.load(); err != nil || !slices.Equal(got, want) {
		t.Fatalf("load after store: got %v, %v; want %v", got, err, want)
	}
	if got := c.loadCache(); !slices.Equal(got, want) {
		t.Errorf("loadCache after store: got %q; want %q", got, want)
	}
	if !strings.Contains(logs.String(), "endpoint cache loaded") {
		t.Errorf("log: got %q; want the cache reported as loaded", logs.String())
	}
	if leftovers, _ := filepath.Glob(c.path + ".tmp*"); len(leftovers) != 0 {
		t.Errorf("temporary files left after store: %v", leftovers)
	}
}

// A corrupt cache is an error to load, of a bounded size, and loadCache
// logs it and goes on without it: the daemon then starts on its static
// endpoints.
func TestEndpointCacheCorruptionIgnored(t *testing.T) {
	tests := []struct {
		name    string
		content string
	}{
		{"partial file, as a crash mid-write without rename would leave", `{"version":1,"endpoints":["10.0.0.1:64`},
		{"not JSON", "\x00\x01garbage"},
		{"wrong version", `{"version":99,"endpoints":["10.0.0.1:6443"]}`},
		{"invalid endpoint", `{"version":1,"endpoints":["10.0.0.1:99999"]}`},
		{"empty file", ""},
		// What discovery never yields: the cache holds only its results.
		{"metadata address", `{"version":1,"endpoints":["169.254.169.254:80"]}`},
		{"unspecified address", `{"version":1,"endpoints":["0.0.0.0:22"]}`},
		{"hostname", `{"version":1,"endpoints":["api.example.com:6443"]}`},
		{"more endpoints than discovery keeps", `{"version":1,"endpoints":[` + strings.Repeat(`"10.0.0.1:6443",`, maxDiscoveredEndpoints) + `"10.0.0.2:6443"]}`},
		{"larger than the cache can be", `{"version":1,"endpoints":["10.0.0.1:6443"],"pad":"` + strings.Repeat("x", maxCacheBytes) + `"}`},
		// The error stays short, not a log line as long as the entry.
		{"huge bad entry", `{"version":1,"endpoints":["` + strings.Repeat("a", 40<<10) + `"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "endpoints.json")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			logs := &syncBuffer{}
			c := &endpointCache{path: path, log: slog.New(slog.NewTextHandler(logs, nil))}
			if _, err := c.load(); err == nil || len(err.Error()) > 400 {
				t.Errorf("load: got %.500v (%d bytes); want the corruption reported in under 400 bytes", err, len(fmt.Sprint(err)))
			}
			if eps := c.loadCache(); len(eps) != 0 {
				t.Errorf("loadCache: got %v; want none", eps)
			}
			if !strings.Contains(logs.String(), "endpoint cache ignored") {
				t.Errorf("log: got %q; want the cache reported as ignored", logs.String())
			}
		})
	}
}

// What is not a regular file, or cannot be read, is refused at once and
// ignored with a warning: opened as a plain read would open it, a FIFO no
// one writes blocked the start for ever with both ports bound.
func TestEndpointCacheOddFilesIgnored(t *testing.T) {
	dir := t.TempDir()
	fifo, loop, huge := filepath.Join(dir, "fifo"), filepath.Join(dir, "loop"), filepath.Join(dir, "huge")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 100<<20); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ path, want string }{
		{fifo, "is not a regular file but a FIFO"},
		{dir, "is not a regular file but a directory"},
		{loop, "too many levels of symbolic links"},
		// A regular file whose read fails, even for root: address 0 is unmapped.
		{"/proc/self/mem", "input/output error"},
		{huge, fmt.Sprintf("is larger than %d bytes", maxCacheBytes)},
	}
	for _, tt := range tests {
		logs := &syncBuffer{}
		c := &endpointCache{path: tt.path, log: slog.New(slog.NewTextHandler(logs, nil))}
		loaded := make(chan []string, 1)
		go func() { loaded <- c.loadCache() }()
		select {
		case eps := <-loaded:
			if eps != nil || !strings.Contains(logs.String(), "endpoint cache ignored") || !strings.Contains(logs.String(), tt.want) {
				t.Errorf("%s: loadCache got %v, log %q; want none and the cache ignored: %s", tt.path, eps, logs.String(), tt.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: loadCache still waiting after 5s", tt.path)
		}
	}
}

// store never changes the cache file in place: it writes a new file and
// renames it over the old one, so a crash at any point leaves the old list
// or the new one, and a reader of the old file still reads it whole.
func TestEndpointCacheStoreIsAtomic(t *testing.T) {
	c := &endpointCache{path: filepath.Join(t.TempDir(), "endpoints.json"), log: slog.New(slog.DiscardHandler)}
	if err := c.store([]string{"10.0.0.1:6443"}); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(c.path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := c.store([]string{"10.0.0.2:6443"}); err != nil {
		t.Fatal(err)
	}
	oldInfo, err1 := old.Stat()
	newInfo, err2 := os.Stat(c.path)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if os.SameFile(oldInfo, newInfo) {
		t.Error("store rewrote the cache file in place; want a new file renamed over it")
	}
	var f cacheFile
	if b, err := io.ReadAll(old); err != nil || json.Unmarshal(b, &f) != nil || !slices.Equal(f.Endpoints, []string{"10.0.0.1:6443"}) {
		t.Errorf("the old file after a store: got %q (%v); want the old list whole", b, err)
	}
	if got, err := c.load(); err != nil || !slices.Equal(got, []string{"10.0.0.2:6443"}) {
		t.Errorf("load after the second store: got %q, %v; want [10.0.0.2:6443]", got, err)
	}
}

// The writer writes a list only when it differs from the last one written:
// the run loop offers every list it applies, mostly the same discovered
// one. A list whose write failed is written when it comes again, and the
// failed write leaves no temporary file.
func TestCacheWriterWritesOnlyChangedLists(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		c := &endpointCache{path: filepath.Join(t.TempDir(), "endpoints.json"),
			log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
		lists := make(chan []string)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { c.writer(ctx, lists) })
		a, b := []string{"10.0.0.1:6443"}, []string{"10.0.0.2:6443"}
		// offer hands the writer list and waits until it is done with it:
		// file I/O does not block the bubble, so Wait returns only once the
		// writer waits for the next list.
		offer := func(list []string, wantWrites int, wantFile []string) {
			t.Helper()
			lists <- list
			synctest.Wait()
			if got := strings.Count(logs.String(), "endpoint cache written"); got != wantWrites {
				t.Errorf("after %q: got %d writes; want %d", list, got, wantWrites)
			}
			if got, err := c.load(); err != nil || !slices.Equal(got, wantFile) {
				t.Errorf("after %q: cache holds %q (%v); want %q", list, got, err, wantFile)
			}
		}
		offer(a, 1, a)
		offer(a, 1, a)
		offer(b, 2, b)
		offer(b, 2, b)
		// A directory where the cache file goes makes the rename fail.
		if err := os.Remove(c.path); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(c.path, 0o700); err != nil {
			t.Fatal(err)
		}
		lists <- a // TestCacheWriterWarnsOfFailedWrites checks its warning
		synctest.Wait()
		if leftovers, _ := filepath.Glob(c.path + ".tmp*"); len(leftovers) != 0 {
			t.Errorf("temporary files left after a failed store: %v", leftovers)
		}
		if err := os.Remove(c.path); err != nil {
			t.Fatal(err)
		}
		offer(a, 3, a)
		offer(a, 3, a)
		cancel()
		wg.Wait()
	})
}

// offerLatest never blocks the run loop: a list the writer has not taken
// yet gives way to the newer one. An empty list, what discovered returns
// before kubernetes has published, is not offered: the cache keeps what
// discovery last found.
func TestOfferLatest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := make(chan []string, 1)
		offerLatest(ch, nil)
		offerLatest(ch, []string{})
		if got := len(ch); got != 0 {
			t.Errorf("lists waiting after empty offers: got %d; want 0", got)
		}
		offerLatest(ch, []string{"10.0.0.1:6443"})
		offerLatest(ch, []string{"10.0.0.2:6443"}) // would block the bubble if it waited
		if got := len(ch); got != 1 {
			t.Fatalf("lists waiting: got %d; want 1", got)
		}
		if got, want := <-ch, []string{"10.0.0.2:6443"}; !slices.Equal(got, want) {
			t.Errorf("list waiting: got %q; want %q", got, want)
		}
	})
}

// The run loop offers the cache the kubernetes provider's list alone,
// never the static or cached endpoints it applies beside it, and nothing
// before kubernetes has published.
func TestCacheGetsTheDiscoveredListOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kube := newScripted(kubeProviderName, nil)
		h := startMerged(t, []string{"10.0.0.1:6443"}, []string{"10.0.0.9:6443"}, kube)
		h.d.cache = &endpointCache{path: filepath.Join(t.TempDir(), "endpoints.json"), log: slog.New(slog.DiscardHandler)}
		toCache := make(chan []string, 1)
		applied := h.d.apply(nil, toCache)
		if want := []string{"10.0.0.1:6443", "10.0.0.9:6443"}; !slices.Equal(applied, want) {
			t.Errorf("applied at start: got %q; want %q", applied, want)
		}
		if len(toCache) != 0 {
			t.Errorf("offered %q before kubernetes published; want nothing", <-toCache)
		}
		kube.lists <- []string{"10.0.0.2:6443"}
		synctest.Wait()
		applied = h.d.apply(applied, toCache)
		if want := []string{"10.0.0.1:6443", "10.0.0.2:6443"}; !slices.Equal(applied, want) {
			t.Errorf("applied after kubernetes published: got %q; want %q", applied, want)
		}
		select {
		case got := <-toCache:
			if want := []string{"10.0.0.2:6443"}; !slices.Equal(got, want) {
				t.Errorf("offered %q; want %q", got, want)
			}
		default:
			t.Error("nothing offered after kubernetes published; want its list")
		}
		h.stop(t)
	})
}
