package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/pki"
)

// probeKinds is what one probe can cost the API server, each measured
// alone at the same rate: the parts of a probe apart, so a cheaper probe
// is chosen by what it saves, not by what it is hoped to.
var probeKinds = map[string]func(*kindProber) error{
	// connect: a TCP connect closed with a reset, the TCP check alone.
	"connect": func(k *kindProber) error { return k.connect() },
	// full: the readyz probe today, a fresh connection and a full
	// handshake with the client certificate for every probe.
	"full": func(k *kindProber) error { return k.fresh(k.tls) },
	// resume: the same with a TLS session cache, each handshake resumed.
	"resume": func(k *kindProber) error { return k.fresh(k.resumed) },
	// kept: GET /readyz on a kept connection, and the TCP check as a
	// fresh connect beside it.
	"kept": func(k *kindProber) error {
		if err := k.connect(); err != nil {
			return err
		}
		return k.onKept()
	},
	// kept-only: GET /readyz on a kept connection, nothing else.
	"kept-only": func(k *kindProber) error { return k.onKept() },
	// full-anon and kept-anon: full and kept without a client
	// certificate, as anonymous (system:public-info-viewer).
	"full-anon": func(k *kindProber) error { return k.fresh(k.anon) },
	"kept-anon": func(k *kindProber) error {
		if err := k.connect(); err != nil {
			return err
		}
		return k.get(k.keptAnon)
	},
}

type kindProber struct {
	addr               string
	tls, resumed, anon *tls.Config
	kept, keptAnon     *http.Client
}

func newKindProber(l *controlplane.Local, client pki.Pair) (*kindProber, error) {
	cfg, err := controlplane.ClientTLS(l.CA, client, "kubernetes.default.svc")
	if err != nil {
		return nil, err
	}
	cfg.NextProtos = []string{"http/1.1"}
	resumed := cfg.Clone()
	resumed.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	anon := cfg.Clone()
	anon.Certificates = nil
	return &kindProber{addr: l.Addr, tls: cfg, resumed: resumed, anon: anon, kept: keptClient(cfg), keptAnon: keptClient(anon)}, nil
}

func keptClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg.Clone(), MaxIdleConnsPerHost: 1000}}
}

func (k *kindProber) connect() error {
	c, err := net.DialTimeout("tcp", k.addr, 5*time.Second)
	if err != nil {
		return err
	}
	resetClose(c)
	return nil
}

func (k *kindProber) fresh(cfg *tls.Config) error {
	c, err := net.DialTimeout("tcp", k.addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer resetClose(c)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, cfg)
	req, _ := http.NewRequest(http.MethodGet, "https://kubernetes.default.svc/readyz", nil)
	req.Close = true
	if err := req.Write(tc); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return status(resp)
}

func (k *kindProber) onKept() error { return k.get(k.kept) }

func (k *kindProber) get(c *http.Client) error {
	resp, err := c.Get("https://" + k.addr + "/readyz")
	if err != nil {
		return err
	}
	_, _ = bufio.NewReader(resp.Body).WriteTo(discard{})
	_ = resp.Body.Close()
	return status(resp)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func status(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}

func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// kindResult is one kind's figures.
type kindResult struct {
	kind            string
	probes, failed  int
	apiCPU, idleCPU time.Duration
	handshakeErrors int // the API server's count over the measured window
}

// measureKinds runs each kind at rate probes per second for o.duration on
// one control plane, with an idle window of the same length before each.
func measureKinds(ctx context.Context, o options, kinds []string, rate int) ([]kindResult, error) {
	l, err := controlplane.StartLocal(ctx, localOptions(o))
	if err != nil {
		return nil, err
	}
	defer l.Stop()
	client, err := l.CA.Client("node", "system:node:fleet", "system:nodes")
	if err != nil {
		return nil, err
	}
	var rs []kindResult
	for _, kind := range kinds {
		f, ok := probeKinds[kind]
		if !ok {
			return rs, fmt.Errorf("-kinds: unknown kind %q", kind)
		}
		k, err := newKindProber(l, client)
		if err != nil {
			return rs, err
		}
		r, err := measureKind(ctx, o, l, kind, k, f, rate)
		k.kept.CloseIdleConnections()
		k.keptAnon.CloseIdleConnections()
		if err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// measureKind runs one kind, after an idle window of the same length.
func measureKind(ctx context.Context, o options, l *controlplane.Local, kind string, k *kindProber, f func(*kindProber) error, rate int) (kindResult, error) {
	r := kindResult{kind: kind}
	idle0 := cpuTime(l.APIServerPid())
	time.Sleep(o.duration)
	r.idleCPU = cpuTime(l.APIServerPid()) - idle0
	cpu, counts, err := window(o, kind, l, func() { r.probes, r.failed = runKind(ctx, k, f, rate, o.duration) })
	r.apiCPU, r.handshakeErrors = cpu, counts.handshakeErrors
	return r, err
}

// runKind starts rate probes a second for d, each in its own goroutine,
// and waits for them.
func runKind(ctx context.Context, k *kindProber, f func(*kindProber) error, rate int, d time.Duration) (probes, failed int) {
	var wg sync.WaitGroup
	var n, bad atomic.Int64
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		<-t.C
		wg.Go(func() {
			n.Add(1)
			if f(k) != nil {
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load()), int(bad.Load())
}

func reportKinds(o options, rate int, rs []kindResult) {
	fmt.Printf("probe kinds: %d probes/s for %s each, one kube-apiserver, client certificate, %s keys\n\n", rate, o.duration, o.keys)
	fmt.Println("| kind | probes | failed | API server CPU ms per probe (idle subtracted) | TLS handshake errors |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range rs {
		per := 0.0
		if r.probes > 0 {
			per = float64((r.apiCPU - r.idleCPU).Microseconds()) / 1000 / float64(r.probes)
		}
		fmt.Printf("| %s | %d | %d | %.3f | %d |\n", r.kind, r.probes, r.failed, per, r.handshakeErrors)
	}
}

func splitKinds(s string) []string { return strings.Split(s, ",") }
