package main

// Beyond the spec: the readyz probe keeps its TLS connection to each
// upstream and repeats GET /readyz on it, instead of a connect and a
// handshake per probe. A fleet's probes are most of what its balancers
// cost the API servers: the handshake was about 40 % of a probe there
// (e2e/cmd/fleet -kinds), and a TCP check that connects and resets counts
// as a failed handshake on the API server.
//
// While the kept connection answers, within the first half of the probe's
// time, its answer is the check. A missing or broken one gives way to a
// fresh connect and handshake in the time left; a silent one fails the
// probe, and a fresh connect in the time left checks the upstream is
// reachable. So a black hole, a restart or a refused connect is seen as by
// the TCP check: the connect fails.
//
// Each upstream has its own http.Transport, which keeps the connection
// alive between probes, drops it when the upstream closes it or asks to,
// and sends the request again over a new one when a kept connection turns
// out closed before the answer. Its only way to make a connection is
// dialFresh: a handshake on the connection the probe's TCP check has just
// made, so a probe never connects twice.

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"
)

// keptMaxAge is how long a kept connection serves probes before the next
// probe makes a new one: the handshake is where the upstream's serving
// certificate is verified, and a rotated one that no longer verifies must
// fail a probe within minutes, as it fails the clients' new connections.
// One handshake per five minutes is noise beside one per probe.
const keptMaxAge = 5 * time.Minute

// keptTransport is an upstream's transport, with the credentials its
// connections were made with and when it began to make them.
type keptTransport struct {
	*http.Transport
	creds [sha256.Size]byte
	since time.Time
}

// checkKept probes addr over its kept connection alone, within the first
// half of ctx's time, and reports whether that settled the check: the
// connection answered, 200 or not, or it did not answer in time. A silent
// one fails the probe, as a fresh connection's silence always did, and a
// fresh connect in the time left tells a silent upstream from an
// unreachable one; asking /readyz again there would let an API server
// losing etcd, whose answers hang or pass by turns, pass. The round-trip
// time is the kernel's estimate for the kept connection (none outside
// Linux), which the transport names as it hands it to the request.
func (r *readyzProbe) checkKept(ctx context.Context, addr string, cfg *tls.Config, sum [sha256.Size]byte) (checkResult, bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return checkResult{}, false
	}
	kctx, cancel := context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
	defer cancel()
	var kept net.Conn // GotConn runs in this goroutine, within RoundTrip
	kctx = httptrace.WithClientTrace(kctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { kept = i.Conn }})
	err := r.probe(kctx, addr, nil, cfg, sum)
	switch {
	case errors.Is(kctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		return failedProbe(ctx, addr, fmt.Errorf("readyz: %w", kctx.Err())), true
	case err != nil && !errors.Is(err, errNotReady):
		return checkResult{}, false // no kept connection, or a broken one
	}
	var rtt time.Duration
	if tc, ok := kept.(*tls.Conn); ok { // dialFresh's, as every connection of the transport
		rtt = connRTT(tc.NetConn())
	}
	return checkResult{rtt: rtt, probed: true, notReady: err}, true
}

// failedProbe is the result of a probe that failed for why before a
// request could tell: a TCP check of addr still says whether it is
// reachable.
func failedProbe(ctx context.Context, addr string, why error) checkResult {
	res := tcpCheck(ctx, addr)
	if res.err == nil {
		res.probed, res.notReady = true, why
	}
	return res
}

// transport returns addr's transport, its kept connection closed first
// when it is keptMaxAge old or was made with other credentials than sum.
func (r *readyzProbe) transport(addr string, sum [sha256.Size]byte) *keptTransport {
	r.mu.Lock()
	defer r.mu.Unlock()
	kt := r.kept[addr]
	if kt == nil {
		// No Proxy: the probe is for the upstream itself, whatever the
		// environment says. HTTP/1.1 only (dialFresh offers nothing else):
		// an HTTP/2 connection reads an answer's data up to its flow
		// control window, megabytes, whether the probe reads it or not.
		kt = &keptTransport{Transport: &http.Transport{DialTLSContext: dialFresh, MaxResponseHeaderBytes: maxReadyzResponse}}
		if r.kept == nil {
			r.kept = make(map[string]*keptTransport)
		}
		r.kept[addr] = kt
	}
	if now := time.Now(); kt.creds != sum || now.Sub(kt.since) >= keptMaxAge {
		kt.CloseIdleConnections()
		kt.creds, kt.since = sum, now
	}
	return kt
}

// forget closes addr's kept connection, if any; a probe loop that ends
// calls it (poolConfig.forget). The loop of the same upstream, added again,
// may have a probe on the transport forgotten: CloseIdleConnections also
// closes a connection that turns idle after it, until the next request.
func (r *readyzProbe) forget(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kt := r.kept[addr]; kt != nil {
		kt.CloseIdleConnections()
		delete(r.kept, addr)
	}
}

// freshConn is the connection a probe's TCP check has just made, for
// dialFresh to take once, with the probe's TLS configuration and deadline;
// c is nil for a probe on the kept connection alone.
type freshConn struct {
	c        net.Conn
	cfg      *tls.Config
	deadline time.Time
	taken    atomic.Bool
}

type freshConnKey struct{}

// closeUnused closes f's connection unless dialFresh took it.
func (f *freshConn) closeUnused() {
	if f.taken.CompareAndSwap(false, true) && f.c != nil {
		closeAbortive(f.c)
	}
}

// dialFresh is the transports' DialTLSContext: a TLS handshake on the
// probe's fresh connection, within the probe's deadline. The transport
// detaches a dial from its request's cancellation: a probe cancelled
// before the deadline returns at once, and forget, which follows when the
// probe loop ends, cancels the handshake.
func dialFresh(ctx context.Context, _, _ string) (net.Conn, error) {
	f, _ := ctx.Value(freshConnKey{}).(*freshConn)
	if f == nil || f.c == nil || !f.taken.CompareAndSwap(false, true) {
		return nil, errors.New("no fresh connection for a handshake")
	}
	if sock, ok := f.c.(*net.TCPConn); ok {
		_ = sock.SetLinger(0) // every close of it a reset, as closeAbortive says
	}
	_ = f.c.SetDeadline(f.deadline)
	tc := tls.Client(f.c, f.cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		closeAbortive(f.c)
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	_ = f.c.SetDeadline(time.Time{}) // the transport heeds each request's context
	return tc, nil
}
