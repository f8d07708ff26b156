package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// kpServer is a fake API server that counts what the probes cost it: TCP
// connections accepted, TLS handshakes, and requests, with the client
// certificate's name of the last request.
type kpServer struct {
	srv              *httptest.Server
	addr             string
	accepted, closed atomic.Int32
	handshakes, reqs atomic.Int32
	status           atomic.Int32
	hang             atomic.Bool   // /readyz waits for release
	hangNext         atomic.Bool   // the next /readyz waits for release
	release          chan struct{} // closed by unhang, at the latest at the test's end
	unhang           func()
	mu               sync.Mutex
	lastClient       string
}

func kpStart(t *testing.T, k *rzPKI) *kpServer {
	t.Helper()
	s := &kpServer{release: make(chan struct{})}
	s.status.Store(http.StatusOK)
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.reqs.Add(1)
		if s.hang.Load() || s.hangNext.CompareAndSwap(true, false) {
			<-s.release
		}
		if len(r.TLS.PeerCertificates) > 0 {
			s.mu.Lock()
			s.lastClient = r.TLS.PeerCertificates[0].Subject.CommonName
			s.mu.Unlock()
		}
		w.WriteHeader(int(s.status.Load()))
	}))
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{k.serving.pair}, ClientAuth: tls.RequestClientCert,
		VerifyConnection: func(tls.ConnectionState) error { s.handshakes.Add(1); return nil }}
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.accepted.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		default:
		}
	}
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the TCP checks' connections end in resets
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	s.unhang = sync.OnceFunc(func() { close(s.release) })
	t.Cleanup(s.unhang) // runs first: the handlers return, then Close
	s.addr = s.srv.Listener.Addr().String()
	return s
}

func (s *kpServer) client() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastClient
}

func kpCounts(t *testing.T, s *kpServer, handshakes, reqs int32) {
	t.Helper()
	if h, r := s.handshakes.Load(), s.reqs.Load(); h != handshakes || r != reqs {
		t.Errorf("server saw %d handshakes and %d requests; want %d and %d", h, r, handshakes, reqs)
	}
}

func TestReadyzProbeKeepsConnection(t *testing.T) {
	pki := rzNewPKI(t)
	s := kpStart(t, pki)
	p := pki.probe()
	const probes = 10
	for range probes {
		res, _ := rzCheck(p, s.addr, 2*time.Second)
		rzWantReady(t, res)
	}
	// One connection and one handshake for ten probes: no connect that
	// the server reads as a failed handshake.
	kpCounts(t, s, 1, probes)
	if got := s.accepted.Load(); got != 1 {
		t.Errorf("server accepted %d connections; want 1, the kept one", got)
	}

	// An answer other than 200 on the kept connection is the upstream's
	// answer: the probe fails, and the connection stays.
	s.status.Store(http.StatusInternalServerError)
	res, _ := rzCheck(p, s.addr, 2*time.Second)
	rzWantFailedProbe(t, res)
	kpCounts(t, s, 1, probes+1)
}

// An upstream that closed the kept connection (an idle timeout, a restart
// that came back before the next probe) costs a new handshake, not a
// failed probe.
func TestReadyzProbeRedialsClosedConnection(t *testing.T) {
	pki := rzNewPKI(t)
	s := kpStart(t, pki)
	p := pki.probe()
	res, _ := rzCheck(p, s.addr, 2*time.Second)
	rzWantReady(t, res)
	s.srv.CloseClientConnections()
	for range 3 {
		res, _ = rzCheck(p, s.addr, 2*time.Second)
		rzWantReady(t, res)
	}
	kpCounts(t, s, 2, 4)

	// A refused connect drops the kept connection: the upstream is gone.
	addr := s.addr
	s.srv.Close()
	res, _ = rzCheck(p, addr, 2*time.Second)
	if res.err == nil {
		t.Fatalf("check of a closed server: got no error")
	}
	if _, kept := p.kept[addr]; kept {
		t.Errorf("a kept connection to %s survived a refused connect", addr)
	}
}

// An upstream that hangs on the kept connection fails the probe at half
// its time, as a hung answer always failed it: a fresh connect in the time
// left finds it reachable (no handshake, no second request, which an API
// server losing etcd might pass), and the next probe makes a new
// connection.
func TestReadyzProbeHungKeptConnection(t *testing.T) {
	pki := rzNewPKI(t)
	s := kpStart(t, pki)
	p := pki.probe()
	res, _ := rzCheck(p, s.addr, 2*time.Second)
	rzWantReady(t, res)
	s.hangNext.Store(true) // the next request only
	const timeout = 400 * time.Millisecond
	res, elapsed := rzCheck(p, s.addr, timeout)
	rzWantFailedProbe(t, res)
	if !errors.Is(res.notReady, context.DeadlineExceeded) || elapsed < timeout/2 || elapsed > timeout {
		t.Errorf("hung kept connection: got %v after %v; want the deadline after %v, within %v", res.notReady, elapsed, timeout/2, timeout)
	}
	if res.rtt <= 0 {
		t.Errorf("hung kept connection: no connect time; want the fresh connect's")
	}
	kpCounts(t, s, 1, 2)
	waitFor(t, "the server to accept the fresh connect", func() bool { return s.accepted.Load() == 2 })
	res, _ = rzCheck(p, s.addr, 2*time.Second)
	rzWantReady(t, res)
	kpCounts(t, s, 2, 3)
}

// A kept connection that hangs while the upstream cannot be reached
// (a black hole): the probe's fresh connect fails, so the check fails as
// a TCP check would, not as a failed probe.
func TestReadyzProbeHungKeptConnectionUnreachable(t *testing.T) {
	pki := rzNewPKI(t)
	s := kpStart(t, pki)
	p := pki.probe()
	res, _ := rzCheck(p, s.addr, 2*time.Second)
	rzWantReady(t, res)
	s.hang.Store(true)
	_ = s.srv.Listener.Close() // new connects are refused; the kept one hangs
	res, _ = rzCheck(p, s.addr, 400*time.Millisecond)
	if res.err == nil {
		t.Errorf("hung kept connection, connect refused: got %+v; want a failed connect", res)
	}
}

// A rotated client certificate is presented at the next probe: a kept
// connection made with other credentials is not used.
func TestReadyzProbeRotationMakesNewConnection(t *testing.T) {
	pki := rzNewPKI(t)
	s := kpStart(t, pki)
	p := pki.probe()
	p.certFile = filepath.Join(pki.dir, "client.pem")
	p.keyFile = p.certFile
	for i, name := range []string{"system:node:a", "system:node:a", "system:node:b", "system:node:b"} {
		if i == 0 || i == 2 {
			c := pki.ca.client(t, name)
			rzWrite(t, p.certFile, c.certPEM, c.keyPEM)
		}
		res, _ := rzCheck(p, s.addr, 2*time.Second)
		rzWantReady(t, res)
		if got := s.client(); got != name {
			t.Errorf("probe %d: the upstream saw client %q; want %q", i, got, name)
		}
	}
	kpCounts(t, s, 2, 4)
}

// A probe loop that ends forgets its upstream's transport while the loop
// of the same upstream, added again, has a probe on it: the connection that
// probe leaves is closed, not kept by a transport no probe uses any more.
func TestReadyzProbeForgetDuringProbe(t *testing.T) {
	pki := rzNewPKI(t)
	s := kpStart(t, pki)
	p := pki.probe()
	s.hang.Store(true)
	done := make(chan checkResult, 1)
	go func() { res, _ := rzCheck(p, s.addr, 5*time.Second); done <- res }()
	waitFor(t, "the probe to reach /readyz", func() bool { return s.reqs.Load() == 1 })
	p.forget(s.addr)
	s.unhang()
	rzWantReady(t, <-done)
	waitFor(t, "the probe's connection closed", func() bool { return s.accepted.Load() == s.closed.Load() })
}

// TestKeptTransportUsable: transport keeps addr's connections for a probe
// with the same credentials within keptMaxAge, and closes them to begin
// anew (since is reset) for other credentials or once they are that old.
func TestKeptTransportUsable(t *testing.T) {
	sum := sha256.Sum256([]byte("creds"))
	tests := []struct {
		name string
		sum  [sha256.Size]byte
		age  time.Duration
		want bool
	}{
		{"same credentials", sum, time.Minute, true},
		{"other credentials", sha256.Sum256([]byte("rotated")), time.Minute, false},
		{"just within the age", sum, keptMaxAge - time.Second, true},
		{"too old", sum, keptMaxAge, false},
	}
	for _, tt := range tests {
		var r readyzProbe
		since := time.Now().Add(-tt.age)
		r.transport("a:1", sum).since = since
		kt := r.transport("a:1", tt.sum)
		if got := kt.since.Equal(since); got != tt.want {
			t.Errorf("%s: kept = %v; want %v", tt.name, got, tt.want)
		}
		if kt.creds != tt.sum {
			t.Errorf("%s: transport records other credentials than the probe's", tt.name)
		}
	}
}

// kpPool is a readyz pool, closed at the test's end, of two fake API
// servers, probed every minute with the kept connection.
func kpPool(t *testing.T) (pl *pool, a, b *kpServer) {
	t.Helper()
	pki := rzNewPKI(t)
	a, b = kpStart(t, pki), kpStart(t, pki)
	p := pki.probe()
	pl = newPool(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()),
		poolConfig{interval: time.Minute, timeout: 2 * time.Second, drainTimeout: time.Second, readyz: true, forget: p.forget},
		p.check, randomSelector{})
	t.Cleanup(pl.close)
	pl.update([]string{a.addr, b.addr})
	return pl, a, b
}

// An upstream removed from the list, and every upstream at the pool's
// close, leaves no kept connection open: its probe loop forgets it.
func TestReadyzPoolForgetsKeptConnection(t *testing.T) {
	pl, a, b := kpPool(t)
	open := func(s *kpServer) int32 { return s.accepted.Load() - s.closed.Load() }
	waitFor(t, "both upstreams probed, each connection kept", func() bool {
		return a.reqs.Load() == 1 && b.reqs.Load() == 1 && open(a) == 1 && open(b) == 1
	})
	pl.update([]string{a.addr})
	waitFor(t, "the removed upstream's kept connection closed", func() bool { return open(b) == 0 })
	if open(a) != 1 {
		t.Errorf("the remaining upstream has %d open connections; want its kept one", open(a))
	}
	pl.close()
	waitFor(t, "the kept connection closed at the pool's close", func() bool { return open(a) == 0 })
}

// An upstream whose kept connection still answers while new connects fail
// (its listener gone, its accept queue full): a failed client dial makes
// the check it asks for connect afresh, so two failures exclude it, as
// with a TCP check, rather than the kept connection's answer undoing each.
func TestReadyzFailedDialConnectsAfresh(t *testing.T) {
	pl, a, _ := kpPool(t)
	state := func() health {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		return pl.upstreams[a.addr].h
	}
	waitFor(t, "a ready", func() bool { return state().state == upReady })
	_ = a.srv.Listener.Close() // the kept connection is served on
	pl.mu.Lock()
	u := pl.upstreams[a.addr]
	pl.mu.Unlock()
	pl.reportDial(u, syscall.ECONNREFUSED)
	waitFor(t, "a unhealthy after a failed dial and the check it asked for", func() bool { return !state().healthy() })
}
