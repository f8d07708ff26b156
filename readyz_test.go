package main

// Tests of --health-check=readyz against real HTTPS servers on 127.0.0.1:0:
// the probe itself (status, TLS verification, credentials, deadlines, size
// and descriptor bounds), and the pool and proxy driven by it (selection,
// fallback, eviction of an unready upstream's connections, the
// upstream_ready metric). Every API server here is also the proxied
// backend: clients do TLS through the proxy and ask /whoami which one
// answered.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// rzServerName is the name the API servers' certificates carry and the
// probes verify, as --health-check-server-name defaults to.
const rzServerName = "kubernetes.default.svc"

// Pool timing for the real-socket pool tests: an interval fast enough to
// keep the file short and well above scheduling noise under -race. The
// timeout is longer than the interval (the daemon forbids that, the pool
// does not care): no pool test has an upstream that stalls, and a short one
// fails probes of a loaded machine at random.
const (
	rzInterval = 200 * time.Millisecond
	rzTimeout  = time.Second
)

type rzCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	pool *x509.CertPool
}

// rzLeaf is a certificate issued by an rzCA, in PEM and ready for crypto/tls.
type rzLeaf struct {
	certPEM, keyPEM []byte
	pair            tls.Certificate
}

// rzCreate makes a key and a certificate from tmpl signed by parentKey, or
// self-signed when parent is nil.
func rzCreate(t *testing.T, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62)); err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func rzNewCA(t *testing.T, cn string) *rzCA {
	t.Helper()
	der, key := rzCreate(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &rzCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: pool}
}

func (ca *rzCA) issue(t *testing.T, tmpl *x509.Certificate) rzLeaf {
	t.Helper()
	der, key := rzCreate(t, tmpl, ca.cert, ca.key)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := rzLeaf{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if l.pair, err = tls.X509KeyPair(l.certPEM, l.keyPEM); err != nil {
		t.Fatal(err)
	}
	return l
}

// serving issues an API server certificate for rzServerName, 127.0.0.1 and
// ::1, valid between notBefore and notAfter.
func (ca *rzCA) serving(t *testing.T, notBefore, notAfter time.Time) rzLeaf {
	t.Helper()
	return ca.issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{rzServerName},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

func (ca *rzCA) client(t *testing.T, cn string) rzLeaf {
	t.Helper()
	return ca.issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// rzPKI is the serving side every test needs: a CA, a valid API server
// certificate, and the CA written to a file for --health-check-ca-file.
type rzPKI struct {
	ca      *rzCA
	serving rzLeaf
	dir     string
	caFile  string
}

func rzNewPKI(t *testing.T) *rzPKI {
	t.Helper()
	ca := rzNewCA(t, "kubernetes")
	k := &rzPKI{
		ca:      ca,
		serving: ca.serving(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour)),
		dir:     t.TempDir(),
	}
	k.caFile = filepath.Join(k.dir, "ca.crt")
	rzWrite(t, k.caFile, ca.pem)
	return k
}

// probe returns a readyzProbe that trusts the test CA, without credentials.
func (k *rzPKI) probe() *readyzProbe {
	return &readyzProbe{caFile: k.caFile, serverName: rzServerName}
}

func rzWrite(t *testing.T, path string, parts ...[]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(parts, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

// rzStartHTTPS serves handler over HTTPS on 127.0.0.1:0 with cert; adjust,
// if not nil, changes the TLS config (client authentication). It returns the
// listening address.
func rzStartHTTPS(t *testing.T, cert tls.Certificate, adjust func(*tls.Config), handler http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(handler)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	if adjust != nil {
		adjust(srv.TLS)
	}
	// Failed handshakes are the point of several tests; keep them out of
	// the test output.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// rzAPIServer is a fake API server: /readyz answers the status the test
// sets, /whoami answers its name, so a client through the proxy can tell
// which upstream it reached.
type rzAPIServer struct {
	name   string
	addr   string
	status atomic.Int32 // what /readyz answers
}

func rzStartAPIServer(t *testing.T, name string, cert tls.Certificate) *rzAPIServer {
	t.Helper()
	s := &rzAPIServer{name: name}
	s.status.Store(http.StatusOK)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(s.status.Load()))
	})
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, name)
	})
	s.addr = rzStartHTTPS(t, cert, nil, mux)
	return s
}

// rzProbe is p's probe over c alone, with the credentials p reads.
func rzProbe(ctx context.Context, p *readyzProbe, addr string, c net.Conn) error {
	cfg, sum, err := p.tlsConfig()
	if err != nil {
		return err
	}
	return p.probe(ctx, addr, c, cfg, sum)
}

func rzCheck(p *readyzProbe, addr string, timeout time.Duration) (checkResult, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	res := p.check(ctx, addr)
	return res, time.Since(start)
}

func rzWantReady(t *testing.T, res checkResult) {
	t.Helper()
	if res.err != nil || !res.probed || res.notReady != nil || res.rtt <= 0 {
		t.Fatalf("check: got err=%v probed=%v notReady=%v rtt=%v; want a passed probe with a connect time",
			res.err, res.probed, res.notReady, res.rtt)
	}
}

// rzWantFailedProbe fails the test unless res is a connect followed by a
// failed probe.
func rzWantFailedProbe(t *testing.T, res checkResult) {
	t.Helper()
	if res.err != nil || !res.probed || res.notReady == nil {
		t.Fatalf("check: got err=%v probed=%v notReady=%v; want a connect and a failed probe",
			res.err, res.probed, res.notReady)
	}
}

func TestReadyzProbeStatus(t *testing.T) {
	tests := []struct {
		name      string
		answer    http.HandlerFunc
		wantReady bool
	}{
		{"200 is ready", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }, true},
		{"500 is not ready", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }, false},
		{"redirect to /healthz is not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/healthz", http.StatusFound)
		}, false},
	}
	pki := rzNewPKI(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen atomic.Pointer[string]
			var healthz atomic.Int32
			mux := http.NewServeMux()
			mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
				s := r.Method + " " + r.Host + " " + r.URL.Path
				seen.Store(&s)
				tt.answer(w, r)
			})
			mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
				healthz.Add(1)
				w.WriteHeader(http.StatusOK)
			})
			addr := rzStartHTTPS(t, pki.serving.pair, nil, mux)

			res, _ := rzCheck(pki.probe(), addr, 2*time.Second)
			if tt.wantReady {
				rzWantReady(t, res)
			} else {
				rzWantFailedProbe(t, res)
				if !errors.Is(res.notReady, errNotReady) {
					t.Errorf("notReady: got %v; want it to wrap %v", res.notReady, errNotReady)
				}
			}
			want := "GET " + rzServerName + " /readyz"
			if got := seen.Load(); got == nil || *got != want {
				t.Errorf("request seen by the server: got %v; want %q", got, want)
			}
			if got := healthz.Load(); got != 0 {
				t.Errorf("requests to /healthz: got %v; want 0", got)
			}
		})
	}
}

// The probe verifies the server's certificate against the CA and the
// server name, and sends nothing to a server that fails it. An IP address
// as the server name is verified against the certificate's IP addresses;
// an IPv6 one once made every probe fail: it went into the URL without
// brackets.
func TestReadyzProbeVerifiesServerCertificate(t *testing.T) {
	pki := rzNewPKI(t)
	otherCA := rzNewCA(t, "someone else")
	tests := []struct {
		name       string
		cert       rzLeaf
		serverName string
		wantHost   string // the Host header of a passed probe; "" if verification fails
	}{
		{"wrong server name", pki.serving, "other.example", ""},
		{"expired certificate", pki.ca.serving(t, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)), rzServerName, ""},
		{"unknown CA", otherCA.serving(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour)), rzServerName, ""},
		{"IPv4 address", pki.serving, "127.0.0.1", "127.0.0.1"},
		{"IPv6 address", pki.serving, "::1", "[::1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hits atomic.Int32
			var host atomic.Pointer[string]
			addr := rzStartHTTPS(t, tt.cert.pair, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				host.Store(&r.Host)
				w.WriteHeader(http.StatusOK)
			}))
			p := pki.probe()
			p.serverName = tt.serverName
			res, _ := rzCheck(p, addr, 2*time.Second)
			if tt.wantHost != "" {
				rzWantReady(t, res)
				if got := host.Load(); got == nil || *got != tt.wantHost {
					t.Errorf("Host header: got %v; want %q", got, tt.wantHost)
				}
				return
			}
			rzWantFailedProbe(t, res)
			if _, ok := errors.AsType[*tls.CertificateVerificationError](res.notReady); !ok {
				t.Errorf("notReady: got %v; want a certificate verification error", res.notReady)
			}
			if got := hits.Load(); got != 0 {
				t.Errorf("requests reaching the server: got %v; want 0", got)
			}
		})
	}
}

func TestReadyzProbeBoundedByDeadline(t *testing.T) {
	pki := rzNewPKI(t)
	silent := startUpstream(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	slow := rzStartHTTPS(t, pki.serving.pair, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done(): // the probe gave up and closed
		case <-time.After(3 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	}))
	// A deadline a loaded machine still connects within (its connect
	// failing would be a failed check, not a failed probe), well short of
	// the slow answer.
	const timeout = time.Second
	tests := []struct{ name, addr string }{
		{"accepts TCP but never answers TLS", silent.addr},
		{"slow /readyz", slow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, elapsed := rzCheck(pki.probe(), tt.addr, timeout)
			rzWantFailedProbe(t, res)
			if elapsed >= 2*time.Second {
				t.Errorf("check took %v; want it bounded by the %v deadline (< 2s, the slow answer takes 3s)", elapsed, timeout)
			}
		})
	}
}

// rzCountingConn counts the bytes a probe read from an upstream's answer.
type rzCountingConn struct {
	net.Conn
	read atomic.Int64
}

func (c *rzCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// rzEndlessHeader answers any request with a header line that never ends,
// until the client goes away or 5 s pass.
func rzEndlessHeader(cert tls.Certificate) func(net.Conn) {
	return func(c net.Conn) {
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := http.ReadRequest(bufio.NewReader(tc)); err != nil {
			return
		}
		if _, err := io.WriteString(tc, "HTTP/1.1 200 OK\r\nX-Filler: "); err != nil {
			return
		}
		filler := bytes.Repeat([]byte("a"), 16<<10)
		for {
			if _, err := tc.Write(filler); err != nil {
				return
			}
		}
	}
}

// A status line and headers beyond maxReadyzResponse fail the probe, which
// reads off the socket no more than the limit, plus the handshake and what
// crypto/tls reads ahead (a record or two). TestHostileReadyzUpstreams has
// the bodies, which are not read, and headers of many lines.
func TestReadyzProbeBoundsResponseSize(t *testing.T) {
	pki := rzNewPKI(t)
	endless := startUpstream(t, rzEndlessHeader(pki.serving.pair))
	hugeHeader := rzStartHTTPS(t, pki.serving.pair, nil, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Filler", strings.Repeat("a", 1<<20))
		w.WriteHeader(http.StatusOK)
	}))
	const maxRead = 2 * maxReadyzResponse
	const timeout = time.Second
	for _, addr := range []string{endless.addr, hugeHeader} {
		// probe, not check, so the test can count what it reads off the
		// socket; check is probe on a fresh connection.
		raw, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c := &rzCountingConn{Conn: raw}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		err = rzProbe(ctx, pki.probe(), addr, c)
		elapsed := time.Since(start)
		cancel()
		closeAbortive(raw)
		if err == nil {
			t.Errorf("probe: got nil error; want a failure, the headers exceed %d bytes", maxReadyzResponse)
		}
		if got := c.read.Load(); got > maxRead {
			t.Errorf("bytes read by the probe: got %d; want at most %d", got, maxRead)
		}
		if elapsed >= timeout {
			t.Errorf("probe took %v; want less than its %v deadline", elapsed, timeout)
		}
	}
}

func TestReadyzProbeClientCertificate(t *testing.T) {
	pki := rzNewPKI(t)
	clientCA := rzNewCA(t, "kubernetes-client")
	strangerCA := rzNewCA(t, "stranger")
	var hits atomic.Int32
	var seenCN atomic.Pointer[string]
	addr := rzStartHTTPS(t, pki.serving.pair, func(c *tls.Config) {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = clientCA.pool
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		cn := r.TLS.PeerCertificates[0].Subject.CommonName
		seenCN.Store(&cn)
		w.WriteHeader(http.StatusOK)
	}))
	// probeAs runs one check with p and, when it passes, returns the
	// client certificate name the server saw.
	probeAs := func(t *testing.T, p *readyzProbe, wantPass bool) string {
		t.Helper()
		before := hits.Load()
		res, _ := rzCheck(p, addr, 2*time.Second)
		if !wantPass {
			rzWantFailedProbe(t, res)
			if got := hits.Load() - before; got != 0 {
				t.Errorf("requests reaching the server: got %v; want 0", got)
			}
			return ""
		}
		rzWantReady(t, res)
		return *seenCN.Load()
	}

	t.Run("no certificate", func(t *testing.T) {
		probeAs(t, pki.probe(), false)
	})
	t.Run("separate files", func(t *testing.T) {
		leaf := clientCA.client(t, "system:node:separate")
		p := pki.probe()
		p.certFile, p.keyFile = filepath.Join(pki.dir, "sep.crt"), filepath.Join(pki.dir, "sep.key")
		rzWrite(t, p.certFile, leaf.certPEM)
		rzWrite(t, p.keyFile, leaf.keyPEM)
		if got, want := probeAs(t, p, true), "system:node:separate"; got != want {
			t.Errorf("client certificate seen: got %q; want %q", got, want)
		}
	})
	t.Run("one file", func(t *testing.T) {
		leaf := clientCA.client(t, "system:node:combined")
		p := pki.probe()
		p.certFile = filepath.Join(pki.dir, "combined.pem")
		p.keyFile = p.certFile
		rzWrite(t, p.certFile, leaf.certPEM, leaf.keyPEM)
		if got, want := probeAs(t, p, true), "system:node:combined"; got != want {
			t.Errorf("client certificate seen: got %q; want %q", got, want)
		}
	})
	t.Run("rotation", func(t *testing.T) {
		// One probe value for the whole sequence, as the daemon keeps one
		// for its lifetime: every change below must be picked up from the
		// file without a restart.
		p := pki.probe()
		p.certFile = filepath.Join(pki.dir, "rotating.pem")
		p.keyFile = p.certFile
		probeAs(t, p, false) // the kubelet has not written it yet

		first := clientCA.client(t, "system:node:first")
		rzWrite(t, p.certFile, first.certPEM, first.keyPEM)
		if got, want := probeAs(t, p, true), "system:node:first"; got != want {
			t.Errorf("after the file appeared: got %q; want %q", got, want)
		}
		second := clientCA.client(t, "system:node:second")
		rzWrite(t, p.certFile, second.keyPEM, second.certPEM) // key first: order must not matter
		if got, want := probeAs(t, p, true), "system:node:second"; got != want {
			t.Errorf("after rotation: got %q; want %q", got, want)
		}
		stranger := strangerCA.client(t, "system:node:second")
		rzWrite(t, p.certFile, stranger.certPEM, stranger.keyPEM)
		probeAs(t, p, false)
	})
	// The kubelet rotates the pair right after the probe read the
	// certificate: one file must be read once (a second read would pair the
	// old certificate with the new key), two files read again.
	first, second := clientCA.client(t, "system:node:first"), clientCA.client(t, "system:node:second")
	for _, tt := range []struct {
		name     string
		combined bool
		want     string
	}{{"rotated between reads of one file", true, "system:node:first"}, {"rotated between reads of two files", false, "system:node:second"}} {
		t.Run(tt.name, func(t *testing.T) {
			p := pki.probe()
			p.certFile, p.keyFile = filepath.Join(pki.dir, "pair.crt"), filepath.Join(pki.dir, "pair.key")
			write := func(l rzLeaf) {
				if tt.combined {
					rzWrite(t, p.certFile, l.certPEM, l.keyPEM)
					return
				}
				rzWrite(t, p.certFile, l.certPEM)
				rzWrite(t, p.keyFile, l.keyPEM)
			}
			if tt.combined {
				p.keyFile = p.certFile
			}
			write(first)
			rotated := false
			p.readFile = func(path string) ([]byte, error) {
				b, err := readFileAtMost(path, maxCredentialBytes)
				if path == p.certFile && !rotated {
					rotated = true
					write(second)
				}
				return b, err
			}
			if got := probeAs(t, p, true); got != tt.want {
				t.Errorf("client certificate seen: got %q; want %q", got, tt.want)
			}
		})
	}
}

func TestReadyzProbeBearerToken(t *testing.T) {
	pki := rzNewPKI(t)
	var want atomic.Pointer[string]
	var seen atomic.Pointer[string]
	seen.Store(new(string))
	var hits atomic.Int32
	setWant := func(tok string) { want.Store(&tok) }
	setWant("token-one")
	addr := rzStartHTTPS(t, pki.serving.pair, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		auth := r.Header.Get("Authorization")
		seen.Store(&auth)
		if auth != "Bearer "+*want.Load() {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	p := pki.probe()
	p.tokenFile = filepath.Join(pki.dir, "token")
	check := func() checkResult {
		res, _ := rzCheck(p, addr, 2*time.Second)
		return res
	}

	rzWantFailedProbe(t, check()) // no token file yet
	if got := hits.Load(); got != 0 {
		t.Errorf("requests sent without a token file: got %v; want 0", got)
	}

	rzWrite(t, p.tokenFile, []byte("token-one\n"))
	rzWantReady(t, check())
	if got, want := *seen.Load(), "Bearer token-one"; got != want {
		t.Errorf("Authorization: got %q; want %q", got, want)
	}

	setWant("token-two") // the old token is revoked before the file changes
	res := check()
	rzWantFailedProbe(t, res)
	if !errors.Is(res.notReady, errNotReady) {
		t.Errorf("probe with a revoked token: got %v; want it to wrap %v", res.notReady, errNotReady)
	}

	rzWrite(t, p.tokenFile, []byte("token-two"))
	rzWantReady(t, check())
	if got, want := *seen.Load(), "Bearer token-two"; got != want {
		t.Errorf("Authorization after rotation: got %q; want %q", got, want)
	}

	if err := os.Remove(p.tokenFile); err != nil {
		t.Fatal(err)
	}
	before := hits.Load()
	rzWantFailedProbe(t, check())
	if got := hits.Load() - before; got != 0 {
		t.Errorf("requests sent after the token file vanished: got %v; want 0", got)
	}
}

// Each credential file is read within a bound and only if it is a regular
// file: one over 1 MiB, or a FIFO no one writes, fails the probe at once,
// before anything is sent.
func TestReadyzProbeBoundsCredentialFiles(t *testing.T) {
	pki := rzNewPKI(t)
	var hits atomic.Int32
	addr := rzStartHTTPS(t, pki.serving.pair, nil, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	huge, fifo := filepath.Join(pki.dir, "huge"), filepath.Join(pki.dir, "fifo")
	rzWrite(t, huge, nil)
	if err := os.Truncate(huge, maxCredentialBytes+1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{huge, fifo} {
		for _, set := range []func(*readyzProbe){
			func(p *readyzProbe) { p.caFile = file },
			func(p *readyzProbe) { p.certFile, p.keyFile = file, file },
			func(p *readyzProbe) { p.tokenFile = file },
		} {
			p := pki.probe()
			set(p)
			done := make(chan checkResult, 1)
			go func() { res, _ := rzCheck(p, addr, 5*time.Second); done <- res }()
			select {
			case res := <-done:
				rzWantFailedProbe(t, res)
				if !strings.Contains(fmt.Sprint(res.notReady), file) {
					t.Errorf("probe with %s: got %v; want it refused, naming the file", file, res.notReady)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("probe with %s still reading it after 10s", file)
			}
		}
	}
	if got := hits.Load(); got != 0 {
		t.Errorf("requests sent: got %v; want 0", got)
	}
}

func rzSettle(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func TestReadyzProbeLeaksNothing(t *testing.T) {
	pki := rzNewPKI(t)
	ready := rzStartAPIServer(t, "ready", pki.serving.pair)
	unready := rzStartAPIServer(t, "unready", pki.serving.pair)
	unready.status.Store(http.StatusInternalServerError)
	wrongName := pki.probe()
	wrongName.serverName = "other.example"
	refused := deadAddr(t)

	kinds := []struct {
		name    string
		probe   *readyzProbe
		addr    string
		outcome func(checkResult) bool
	}{
		{"200", pki.probe(), ready.addr, func(r checkResult) bool { return r.probed && r.notReady == nil }},
		{"500", pki.probe(), unready.addr, func(r checkResult) bool { return errors.Is(r.notReady, errNotReady) }},
		{"TLS error", wrongName, ready.addr, func(r checkResult) bool {
			var verr *tls.CertificateVerificationError
			return errors.As(r.notReady, &verr)
		}},
		{"refused", pki.probe(), refused, func(r checkResult) bool { return r.err != nil && !r.probed && r.notReady == nil }},
	}
	// A leaked socket is closed by its finalizer once the GC runs, which
	// would hide the leak; keep the GC off until the count is taken.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// Warm up, so lazily started goroutines and descriptors of the
	// runtime and the servers are in the baseline.
	for _, k := range kinds {
		rzCheck(k.probe, k.addr, 2*time.Second)
	}
	fdsBefore := procOpenFDs(t)
	goroutinesBefore := runtime.NumGoroutine()

	const probes = 300
	unexpected := 0
	for i := range probes {
		k := kinds[i%len(kinds)]
		if res, _ := rzCheck(k.probe, k.addr, 2*time.Second); !k.outcome(res) {
			unexpected++
			if unexpected <= 3 {
				t.Errorf("probe %d (%s): got err=%v probed=%v notReady=%v; want the %s outcome",
					i, k.name, res.err, res.probed, res.notReady, k.name)
			}
		}
	}
	const tolerance = 5
	fdsMax, goroutinesMax := fdsBefore+tolerance, goroutinesBefore+tolerance
	waitFor(t, fmt.Sprintf("at most %d descriptors and %d goroutines after %d probes (%d and %d before)",
		fdsMax, goroutinesMax, probes, fdsBefore, goroutinesBefore), func() bool {
		return procOpenFDs(t) <= fdsMax && runtime.NumGoroutine() <= goroutinesMax
	})
}

// rzReadyGauge returns upstream_ready{upstream=addr} as the registry exports
// it, and whether that series exists. It gathers instead of calling
// WithLabelValues, which would create the series it is asked about.
func rzReadyGauge(t *testing.T, px *testProxy, addr string) (float64, bool) {
	t.Helper()
	return seriesValue(t, px.reg, "extractedprism_upstream_ready", map[string]string{"upstream": addr})
}

func rzWaitReady(t *testing.T, px *testProxy, addr string, want float64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("upstream_ready{%s} == %v", addr, want), func() bool {
		v, ok := rzReadyGauge(t, px, addr)
		return ok && v == want
	})
}

// rzSpread makes n connections through the proxy and counts which API
// server answered each.
func rzSpread(t *testing.T, proxyAddr string, roots *x509.CertPool, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		h := rzHold(t, proxyAddr, roots)
		who, err := h.whoami()
		_ = h.tc.Close()
		if err != nil {
			t.Fatalf("request through the proxy: %v", err)
		}
		got[who]++
	}
	return got
}

// rzHeld is one client connection through the proxy carrying HTTP/1.1 over
// TLS, kept open between requests like a kubelet's watch connection.
type rzHeld struct {
	tc *tls.Conn
	br *bufio.Reader
}

func rzHold(t *testing.T, proxyAddr string, roots *x509.CertPool) *rzHeld {
	t.Helper()
	tc := tls.Client(dialProxy(t, proxyAddr), &tls.Config{RootCAs: roots, ServerName: rzServerName})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS through the proxy: %v", err)
	}
	return &rzHeld{tc: tc, br: bufio.NewReader(tc)}
}

// whoami asks over the held connection which API server it reaches.
func (h *rzHeld) whoami() (string, error) {
	_ = h.tc.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.NewRequest(http.MethodGet, "https://"+rzServerName+"/whoami", nil)
	if err != nil {
		return "", err
	}
	if err := req.Write(h.tc); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(h.br, req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.Close {
		return "", errors.New("server closes the connection after the answer")
	}
	return string(body), nil
}

// closed reports whether the connection has been closed under the client:
// a read fails with something other than its short deadline. The API
// server sends nothing unasked, so a read that returns is the close.
func (h *rzHeld) closed() bool {
	_ = h.tc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := h.br.Peek(1)
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// closedBy polls until the connection is closed or until passes, and
// returns when it found it closed.
func (h *rzHeld) closedBy(until time.Time) (time.Time, bool) {
	for {
		if h.closed() {
			return time.Now(), true
		}
		if time.Now().After(until) {
			return time.Time{}, false
		}
	}
}

// rzRig is two API servers, A and B, behind a readyz proxy, with one
// connection held on each. failB fails the next client dial to B, once.
type rzRig struct {
	pki      *rzPKI
	px       *testProxy
	a, b     *rzAPIServer
	onA, onB *rzHeld
	failB    atomic.Bool
}

// rzStartRig lists A alone until its first probe has passed, holds a
// connection to it, then lists A and B and holds a connection to B once B
// is ready too.
func rzStartRig(t *testing.T, drain time.Duration) *rzRig {
	t.Helper()
	r := &rzRig{pki: rzNewPKI(t)}
	r.a = rzStartAPIServer(t, "A", r.pki.serving.pair)
	r.b = rzStartAPIServer(t, "B", r.pki.serving.pair)
	wrap := func(next dialFunc) dialFunc {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == r.b.addr && r.failB.CompareAndSwap(true, false) {
				return nil, errors.New("test: dial to B refused once")
			}
			return next(ctx, network, addr)
		}
	}
	r.px = startProxyCheck(t, poolConfig{interval: rzInterval, timeout: rzTimeout, drainTimeout: drain, readyz: true},
		r.pki.probe().check, wrap, r.a.addr)
	rzWaitReady(t, r.px, r.a.addr, 1)
	r.onA = rzHold(t, r.px.addr, r.pki.ca.pool)
	rzWantAlive(t, r.onA, "first held connection", "A")
	r.px.pool.update([]string{r.a.addr, r.b.addr})
	rzWaitReady(t, r.px, r.b.addr, 1)
	for range 50 {
		h := rzHold(t, r.px.addr, r.pki.ca.pool)
		who, err := h.whoami()
		if err != nil {
			t.Fatalf("request through the proxy: %v", err)
		}
		if who == "B" {
			r.onB = h
			return r
		}
		_ = h.tc.Close()
	}
	t.Fatal("50 new connections with A and B ready: none reached B")
	return nil
}

func rzWantAlive(t *testing.T, h *rzHeld, what, who string) {
	t.Helper()
	if got, err := h.whoami(); err != nil || got != who {
		t.Fatalf("%s: answered by %q (err %v); want %s", what, got, err, who)
	}
}

// Selection follows readiness: with no upstream ready the TCP-healthy ones
// are picked at random, and the pool is still ready; with both ready, both
// are used; one not ready gets nothing while the other is ready, and gets
// some again once ready. How many probes turn an upstream not ready or
// ready is the pool's count alone: TestReadinessStateMachine has it.
func TestReadyzSelectionFollowsReadiness(t *testing.T) {
	pki := rzNewPKI(t)
	a := rzStartAPIServer(t, "A", pki.serving.pair)
	b := rzStartAPIServer(t, "B", pki.serving.pair)
	a.status.Store(http.StatusInternalServerError)
	b.status.Store(http.StatusInternalServerError)
	px := startProxyCheck(t, poolConfig{interval: rzInterval, timeout: rzTimeout, drainTimeout: time.Second, readyz: true},
		pki.probe().check, nil, a.addr, b.addr)
	spread := func() map[string]int { return rzSpread(t, px.addr, pki.ca.pool, 20) }
	setReady := func(s *rzAPIServer, ready bool) {
		status, want := http.StatusOK, 1.0
		if !ready {
			status, want = http.StatusInternalServerError, 0
		}
		s.status.Store(int32(status))
		rzWaitReady(t, px, s.addr, want)
	}
	rzWaitReady(t, px, a.addr, 0)
	rzWaitReady(t, px, b.addr, 0)
	// Both must be picked at random: the last resort alone would also
	// connect, but always to the same upstream.
	if got := spread(); got["A"] == 0 || got["B"] == 0 {
		t.Errorf("connections with no upstream ready: got %v; want both TCP-healthy upstreams to get some", got)
	}
	if !px.pool.ready() {
		t.Error("pool.ready() with both upstreams TCP-healthy and none ready: got false; want true")
	}
	if got := testutil.ToFloat64(px.m.upstreamsActive); got != 2 {
		t.Errorf("upstreams_active: got %v; want 2", got)
	}
	for _, addr := range []string{a.addr, b.addr} {
		if got := testutil.ToFloat64(px.m.healthStatus.WithLabelValues(addr)); got != 1 {
			t.Errorf("health_check_status{%s}: got %v; want 1", addr, got)
		}
	}

	setReady(a, true)
	setReady(b, true)
	if got := spread(); got["A"] == 0 || got["B"] == 0 {
		t.Errorf("connections with A and B ready: got %v; want both to get some", got)
	}
	setReady(a, false)
	if got := spread(); got["B"] != 20 {
		t.Errorf("connections with A not ready: got %v; want all on B", got)
	}
	setReady(a, true)
	if got := spread(); got["A"] == 0 {
		t.Errorf("connections with A ready again: got %v; want A to get some", got)
	}
}

// rzEvicted reports whether the closing of addr's connections has fired
// (and has not been called off since). No metric shows it; the test needs
// it to know that what it connects next comes after the closing.
func rzEvicted(px *testProxy, addr string) bool {
	px.pool.mu.Lock()
	defer px.pool.mu.Unlock()
	u, ok := px.pool.upstreams[addr]
	return ok && u.evicted
}

// An upstream that turns not ready while another is ready loses its
// connections after the drain timeout; the other's stay, and new ones go
// to it. A connection that reaches the unready upstream after the closing
// is one of its connections too and is closed as well, or the client stays
// on the unready API server for the whole outage. A client gets there
// through the last resort when its dial to the ready upstream fails, or
// with a dial in flight when the closing fired. When the closing fires, is
// called off, or (--drain-timeout 0) is immediate are the pool's decisions
// alone: TestUnreadyUpstreamLosesConnectionsAfterDrainTimeout,
// TestEvictionCalledOff and TestEvictionDrainZeroClosesAtOnce cover them on
// the bubble's clock.
func TestReadyzUnreadyConnectionsClosedAfterDrainTimeout(t *testing.T) {
	const drain = 500 * time.Millisecond
	r := rzStartRig(t, drain)
	// A's first failed probe begins after this, and the drain timeout runs
	// from then.
	before := time.Now()
	r.a.status.Store(http.StatusInternalServerError)
	rzWaitReady(t, r.px, r.a.addr, 0)
	at, ok := r.onA.closedBy(time.Now().Add(drain + 2*time.Second))
	if !ok {
		t.Fatalf("connection to A still open %v after A turned not ready; want it closed after the drain timeout (%v)",
			time.Since(before), drain)
	}
	if d := at.Sub(before); d < drain {
		t.Errorf("connection to A closed %v after A's probes began to fail; want at least the drain timeout (%v)", d, drain)
	}
	rzWantAlive(t, r.onB, "connection to B after A's were closed", "B")
	if got := rzSpread(t, r.px.addr, r.pki.ca.pool, 10); got["B"] != 10 {
		t.Errorf("reconnections: got %v; want all on B", got)
	}

	waitFor(t, "the closing of A's connections to fire", func() bool { return rzEvicted(r.px, r.a.addr) })
	r.failB.Store(true)
	h := rzHold(t, r.px.addr, r.pki.ca.pool)
	connected := time.Now()
	rzWantAlive(t, h, "connection whose dial to B failed (the last resort)", "A")
	if v, _ := rzReadyGauge(t, r.px, r.b.addr); v != 1 {
		t.Fatalf("upstream_ready{B} after one failed client dial: got %v; want 1", v)
	}
	if v, _ := rzReadyGauge(t, r.px, r.a.addr); v != 0 {
		t.Fatalf("upstream_ready{A}: got %v; want 0", v)
	}
	if _, ok := h.closedBy(connected.Add(drain + 2*rzInterval + 300*time.Millisecond)); !ok {
		t.Errorf("connection to unready A, with B ready: still open %v after it was made; want it closed after the drain timeout (%v)",
			time.Since(connected), drain)
	}
}

// rzStalledReadyz serves a /readyz that answers 200 once release is
// closed, its request is cancelled or 10 s pass; the request's arrival is
// signalled on the channel returned.
func rzStalledReadyz(t *testing.T, cert tls.Certificate, release <-chan struct{}) (string, <-chan struct{}) {
	entered := make(chan struct{}, 1)
	addr := rzStartHTTPS(t, cert, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	}))
	return addr, entered
}

func rzArrived(entered <-chan struct{}) bool {
	select {
	case <-entered:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

func TestReadyzMetricOnlyAfterFirstProbe(t *testing.T) {
	t.Run("readyz", func(t *testing.T) {
		pki := rzNewPKI(t)
		release := make(chan struct{})
		addr, entered := rzStalledReadyz(t, pki.serving.pair, release)
		px := startProxyCheck(t, poolConfig{interval: time.Minute, timeout: 5 * time.Second, drainTimeout: time.Second, readyz: true},
			pki.probe().check, nil, addr)
		unblock := sync.OnceFunc(func() { close(release) })
		t.Cleanup(unblock) // before the proxy's cleanup
		if !rzArrived(entered) {
			t.Fatal("first probe never reached /readyz")
		}
		if v, ok := rzReadyGauge(t, px, addr); ok {
			t.Errorf("upstream_ready while the first probe runs: got series with %v; want no series", v)
		}
		unblock()
		rzWaitReady(t, px, addr, 1)
	})
	t.Run("readyz, unreachable", func(t *testing.T) {
		pki := rzNewPKI(t)
		dead := deadAddr(t)
		px := startProxyCheck(t, poolConfig{interval: 100 * time.Millisecond, timeout: 100 * time.Millisecond, drainTimeout: time.Second, readyz: true},
			pki.probe().check, nil, dead)
		waitFor(t, "two failed checks", func() bool {
			return testutil.ToFloat64(px.m.healthStatus.WithLabelValues(dead)) == 0
		})
		if v, ok := rzReadyGauge(t, px, dead); ok {
			t.Errorf("upstream_ready of an upstream never probed: got series with %v; want no series", v)
		}
	})
	t.Run("tcp", func(t *testing.T) {
		up := startUpstream(t, echo)
		px := startProxy(t, poolConfig{interval: 100 * time.Millisecond, timeout: 100 * time.Millisecond}, up.addr)
		waitFor(t, "two health checks", func() bool { return up.acceptedCount() >= 2 })
		if n := testutil.CollectAndCount(px.m.upstreamReady); n != 0 {
			t.Errorf("upstream_ready series in tcp mode: got %d; want 0", n)
		}
	})
}

// pool.close stops the probe goroutines; the daemon calls it on shutdown.
// A /readyz that does not answer must not hold that up until the probe's
// deadline (--health-timeout, 15 s by default): a TCP check stops at once
// when cancelled, and so must the request of a readyz check.
func TestReadyzPoolCloseInterruptsStalledProbe(t *testing.T) {
	pki := rzNewPKI(t)
	addr, entered := rzStalledReadyz(t, pki.serving.pair, nil)
	const timeout = 3 * time.Second
	pl := newPool(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()),
		poolConfig{interval: time.Minute, timeout: timeout, drainTimeout: time.Second, readyz: true},
		pki.probe().check, randomSelector{})
	pl.update([]string{addr})
	if !rzArrived(entered) {
		pl.close()
		t.Fatal("first probe never reached /readyz")
	}
	start := time.Now()
	pl.close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("pool.close with a probe waiting on /readyz took %v; want under 1s (probe deadline %v)", d, timeout)
	}
}
