package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// checkResult is the outcome of one health check.
type checkResult struct {
	rtt time.Duration // connect time of a successful TCP check, or the kept connection's round trip
	err error         // the TCP check failed
	// probed is set when a /readyz probe ran, after a successful connect;
	// notReady is its failure, nil when the upstream answered 200.
	probed   bool
	notReady error
	// start is when the check began: a probe that timed out saw the
	// upstream failing from then.
	start time.Time
}

// checkFunc runs one health check of addr within ctx's deadline.
type checkFunc func(ctx context.Context, addr string) checkResult

// tcpCheck connects to addr and closes the connection at once. The connect
// time includes name resolution for hostname endpoints.
func tcpCheck(ctx context.Context, addr string) checkResult {
	c, rtt, err := connectTimed(ctx, addr)
	if err != nil {
		return checkResult{err: err}
	}
	closeAbortive(c)
	return checkResult{rtt: rtt}
}

func connectTimed(ctx context.Context, addr string) (net.Conn, time.Duration, error) {
	start := time.Now()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, fmt.Errorf("health check %s: %w", addr, err)
	}
	return c, time.Since(start), nil
}

// closeAbortive closes c with a reset instead of a FIN. A probe that closes
// normally leaves a TIME_WAIT socket behind for every check; one check every
// few seconds from every node adds up on the API servers.
func closeAbortive(c net.Conn) {
	if tc, ok := c.(interface{ SetLinger(sec int) error }); ok { // a *net.TCPConn, or a healthConn around one
		_ = tc.SetLinger(0) // best effort: a plain close is still correct
	}
	_ = c.Close()
}

// probeJitter is the daemon's poolConfig.jitter: a fleet of nodes booted
// together, or that all added an upstream at the same moment, would
// otherwise probe each API server in lockstep, every node in the same
// instant of each interval.
const probeJitter = 0.1

// probeLoop checks u at once and then every interval until ctx is done. Each
// upstream has its own loop, so a black-holed upstream never delays the
// checks of the others. After a failed check the next one starts
// quickRecheck after it began (at once after a check that timed out), and a
// failed client dial asks for one at once. With jitter, the second check
// comes at a random point of the first interval, so the loops of a fleet
// take random phases, and each interval after it is varied; the first
// check stays at once, as readiness at start waits for it.
func (p *pool) probeLoop(ctx context.Context, u *upstream) {
	t := time.NewTimer(0)
	defer t.Stop()
	if p.cfg.forget != nil {
		defer p.cfg.forget(u.addr)
	}
	for checks := 0; ; checks++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-u.recheck:
		}
		start := time.Now()
		if checks > 0 {
			// The first check is of an upstream just added, which is not
			// ready yet, or taken back from a drain: it gets no slow mark,
			// and the loop's start stays off the pool's lock.
			p.probing(u, true)
		}
		checkCtx, cancel := context.WithTimeout(ctx, p.cfg.timeout) // each check has its own deadline
		res := p.check(checkCtx, u.addr)
		cancel()
		res.start = start
		if ctx.Err() != nil {
			return // stopped mid-check: the result says nothing about u
		}
		// Jitter only shortens an interval, so the first probe after an
		// API server starts failing /readyz comes at most one interval
		// after it. Without jitter: interval itself.
		spread := time.Duration(float64(p.cfg.interval) * p.cfg.jitter / 2)
		next := jitter(p.cfg.interval-spread, spread)
		if checks == 0 && p.cfg.jitter != 0 {
			next = time.Duration(rand.Int64N(int64(p.cfg.interval)) + 1) //nolint:gosec // spreading needs no unpredictability
		}
		if isLocalExhaustion(res.err) || isLocalExhaustion(res.notReady) {
			// Out of descriptors here: blaming u would mark every
			// upstream dead at once. Try again next interval.
			u.log.Warn("health check skipped: local resources exhausted", "err", cmp.Or(res.err, res.notReady))
			p.probing(u, false)
		} else if p.reportCheck(u, res) && p.cfg.quickRecheck > 0 {
			next = min(p.cfg.quickRecheck-time.Since(start), next)
		}
		t.Reset(next)
	}
}

// readyzProbe is the --health-check=readyz check: a TCP connect, then an
// HTTPS GET /readyz, both within the check deadline. The request goes over
// the upstream's kept connection when there is one (see keptprobe.go), else
// over the connection just made, which is then kept. Credentials are read
// from their files on every probe, so rotation needs no restart, and a
// credential that does not exist yet fails the probe, not the daemon.
type readyzProbe struct {
	// certFile and keyFile hold the client certificate and may be one
	// file; tokenFile holds a bearer token.
	caFile, certFile, keyFile, tokenFile string
	serverName                           string // the serving certificate is verified against it
	// readFile, if set, replaces readFileAtMost for the credentials: tests
	// rotate a file between two reads with it.
	readFile func(path string) ([]byte, error)
	mu       sync.Mutex                // guards kept
	kept     map[string]*keptTransport // by upstream address
}

// maxCredentialBytes bounds each credential file a probe reads: a CA bundle
// of every public root is about 200 KiB.
const maxCredentialBytes = 1 << 20

func (r *readyzProbe) read(path string) ([]byte, error) {
	if r.readFile != nil {
		return r.readFile(path)
	}
	return readFileAtMost(path, maxCredentialBytes)
}

// maxReadyzResponse bounds what a probe reads of an answer's status line
// and headers, and again of its body, so an upstream sending endless
// headers or an endless body costs a few kilobytes, not memory or time.
const maxReadyzResponse = 64 << 10

var errNotReady = errors.New("readyz: not ready")

// check probes addr over its kept connection if that answers (see
// checkKept), else over a fresh connection, as a TCP check and a
// handshake. The credentials are read once per check.
func (r *readyzProbe) check(ctx context.Context, addr string) checkResult {
	cfg, sum, err := r.tlsConfig()
	if err != nil {
		return failedProbe(ctx, addr, err)
	}
	if res, ok := r.checkKept(ctx, addr, cfg, sum); ok {
		return res
	}
	c, rtt, err := connectTimed(ctx, addr)
	if err != nil {
		r.forget(addr) // refused or unreachable: the kept connection is of no use
		return checkResult{err: err}
	}
	return checkResult{rtt: rtt, probed: true, notReady: r.probe(ctx, addr, c, cfg, sum)}
}

// probe sends GET /readyz to addr within ctx, with the TLS configuration
// cfg made from the credentials sum, over its kept connection or a TLS
// connection on c (none if c is nil), and reports nil for a 200 answer.
// Redirects are not followed: they are answers other than 200. c is closed
// unless it became the kept connection. The token is read for each probe.
func (r *readyzProbe) probe(ctx context.Context, addr string, c net.Conn, cfg *tls.Config, sum [sha256.Size]byte) error {
	dl, _ := ctx.Deadline()
	fresh := &freshConn{c: c, cfg: cfg, deadline: dl}
	defer fresh.closeUnused()
	// The name only fills the Host header: the request goes over the
	// connection already made. An IPv6 address needs brackets in a URL:
	// JoinHostPort adds them, and the port it joins is trimmed again.
	host := strings.TrimSuffix(net.JoinHostPort(r.serverName, ""), ":")
	ctx = context.WithValue(ctx, freshConnKey{}, fresh)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+"/readyz", nil)
	if err != nil {
		return fmt.Errorf("readyz: %w", err)
	}
	req.Header.Set("User-Agent", "extractedprism")
	if r.tokenFile != "" {
		tok, err := r.read(r.tokenFile)
		if err != nil {
			return fmt.Errorf("readyz: read token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := r.transport(addr, sum).RoundTrip(req)
	if err != nil {
		return fmt.Errorf("readyz: %w", err)
	}
	// Only the status counts. A body read to its end, within the bound,
	// leaves the connection to the next probe; the transport closes it
	// otherwise.
	_, _ = io.CopyN(io.Discard, resp.Body, maxReadyzResponse)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: status %d", errNotReady, resp.StatusCode)
	}
	return nil
}

// tlsConfig builds the probe's TLS configuration from the credential
// files, and returns the sum that identifies the credentials: of the CA
// bundle and the client certificate chain. A probe with other credentials
// does not use a connection made with the old ones.
func (r *readyzProbe) tlsConfig() (cfg *tls.Config, sum [sha256.Size]byte, err error) {
	caPEM, err := r.read(r.caFile)
	if err != nil {
		return nil, sum, fmt.Errorf("readyz: read CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, sum, fmt.Errorf("readyz: no certificate in CA file %s", r.caFile)
	}
	cfg = &tls.Config{
		RootCAs:    roots,
		ServerName: r.serverName,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
	}
	creds := [][]byte{caPEM}
	if r.certFile != "" {
		cert, err := r.keyPair()
		if err != nil {
			return nil, sum, fmt.Errorf("readyz: load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
		creds = append(creds, cert.Certificate...)
	}
	return cfg, sha256.Sum256(slices.Concat(creds...)), nil
}

// keyPair reads the client certificate and key. One file holding both, as
// the kubelet's kubelet-client-current.pem does, is read once, so a
// rotation cannot pair the old certificate with the new key. Two files are
// read again once if they do not match: the rotation of both fell between
// the two reads.
func (r *readyzProbe) keyPair() (cert tls.Certificate, err error) {
	for range 2 {
		certPEM, rerr := r.read(r.certFile)
		keyPEM := certPEM
		if rerr == nil && r.keyFile != r.certFile {
			keyPEM, rerr = r.read(r.keyFile)
		}
		if rerr != nil {
			return cert, rerr
		}
		if cert, err = tls.X509KeyPair(certPEM, keyPEM); err == nil || r.keyFile == r.certFile {
			return cert, err
		}
	}
	return cert, err
}
