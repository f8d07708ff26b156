package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/pki"
	"github.com/extractedprism/extractedprism/e2e/proc"
)

// The fault cases: three API servers on 192.0.2.11-13 behind every
// daemon (an EndpointSlice may not name a loopback address, so this runs in
// a network namespace of its own with those on its lo; see faultUsage), watchers holding long-lived connections through each daemon, and
// one fault on the third API server:
//
//   - removal: it leaves the kubernetes EndpointSlice, which every daemon
//     watches, so every node learns of it within milliseconds;
//   - quorum: its etcd connection goes through a relay that stops passing
//     bytes, so it answers TCP but its /readyz fails, as an API server
//     cut off from etcd quorum does.
//
// Each watcher redials at once when its connection ends, as a kubelet
// does; the figures are those reconnects, all to the survivors.

const faultAPIServers = 3

// faultFigures are one fault run's moves.
type faultFigures struct {
	name, fault   string
	moved, failed int
	peak          int           // reconnects in the busiest 100 ms
	first, last   time.Duration // first and last reconnect after the fault
}

// relay passes a TCP stream to target until blackhole, then drops it.
type relay struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	done   chan struct{}
}

func startRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target, done: make(chan struct{})}
	go r.accept()
	return r, nil
}

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.pass(c)
	}
}

func (r *relay) pass(c net.Conn) {
	t, err := net.Dial("tcp", r.target)
	if err != nil {
		_ = c.Close()
		return
	}
	go r.copy(t, c)
	r.copy(c, t)
}

// copy passes src to dst until the black hole, then reads nothing more and
// holds both open until the relay closes.
func (r *relay) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for !r.holed.Load() {
		n, err := src.Read(buf)
		if err != nil || r.holed.Load() {
			break
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			break
		}
	}
	<-r.done
	_ = src.Close()
	_ = dst.Close()
}

func (r *relay) close() {
	_ = r.ln.Close()
	close(r.done)
}

// apiServer is one of the fault cases' API servers, with what it takes to
// start it again after a kill.
type apiServer struct {
	addr, log string
	argv      []string
	p         *proc.Process
}

// start runs s (again) and waits until it is ready.
func (s *apiServer) start(ctx context.Context, tlsCfg *tls.Config) error {
	p, err := proc.Start("kube-apiserver", s.log, s.argv, nil)
	if err != nil {
		return err
	}
	s.p = p
	var d net.Dialer
	if err := controlplane.WaitReady(ctx, d.DialContext, tlsCfg, s.addr, p.Done()); err != nil {
		return fmt.Errorf("%s: %w\n%s", s.addr, err, p.Tail(2000))
	}
	return nil
}

// startAPIServers starts faultAPIServers more API servers on one port of
// 192.0.2.11 and up, on l's etcd; the last one's etcd goes through a relay.
func startAPIServers(ctx context.Context, l *controlplane.Local) (servers []*apiServer, rl *relay, err error) {
	b, err := controlplane.DefaultBinaries()
	if err != nil {
		return nil, nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	if rl, err = startRelay(strings.TrimPrefix(l.EtcdURL, "http://")); err != nil {
		return nil, nil, err
	}
	tlsCfg, err := controlplane.ClientTLS(l.CA, l.Admin, "")
	if err != nil {
		return nil, rl, err
	}
	for i := range faultAPIServers {
		ip := "192.0.2." + strconv.Itoa(11+i)
		serving, err := l.CA.APIServer("fleet-api-"+strconv.Itoa(i), ip)
		if err != nil {
			return servers, rl, err
		}
		etcd := l.EtcdURL
		if i == faultAPIServers-1 {
			etcd = "http://" + rl.ln.Addr().String()
		}
		s := &apiServer{addr: net.JoinHostPort(ip, strconv.Itoa(port)), log: filepath.Join(l.Dir, "apiserver-"+ip+".log"),
			argv: controlplane.APIServerArgs(b.APIServer, controlplane.APIServerConfig{
				Address: ip, Port: port, EtcdServers: []string{etcd},
				Certs:   controlplane.Certs{CA: l.CA.CertFile(), Serving: serving, SA: l.SA},
				CertDir: filepath.Join(l.Dir, "certs-"+ip), EndpointReconciler: "none",
			})}
		servers = append(servers, s)
		if err := s.start(ctx, tlsCfg); err != nil {
			return servers, rl, err
		}
	}
	return servers, rl, nil
}

func addrsOf(servers []*apiServer) []string {
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.addr)
	}
	return addrs
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "192.0.2.11:0")
	if err != nil {
		return 0, fmt.Errorf("%w\n%s", err, faultUsage)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// writeSlice makes addrs the kubernetes service's one EndpointSlice.
func writeSlice(ctx context.Context, cs kubernetes.Interface, addrs []string) error {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(port)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		s.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(n))}}
	}
	api := cs.DiscoveryV1().EndpointSlices("default")
	old, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	s.ResourceVersion = old.ResourceVersion
	_, err = api.Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// dials records when each watcher connection was made.
type dials struct {
	mu     sync.Mutex
	at     []time.Time
	failed int
}

func (d *dials) add(ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ok {
		d.at = append(d.at, time.Now())
	} else {
		d.failed++
	}
}

// watcher holds a watch through the daemon at addr and redials at once
// when it ends, until ctx is done.
func watcher(ctx context.Context, addr string, cfg *tls.Config, d *dials) {
	for ctx.Err() == nil {
		start := time.Now()
		c, err := (&tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}).DialContext(ctx, "tcp", addr)
		d.add(err == nil)
		if err == nil {
			stop := context.AfterFunc(ctx, func() { _ = c.Close() })
			_, err = io.WriteString(c, "GET /api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=3600 HTTP/1.1\r\nHost: kubernetes.default.svc\r\n\r\n")
			if err == nil {
				_, _ = io.Copy(io.Discard, c)
			}
			stop()
			_ = c.Close()
		}
		if time.Since(start) < 100*time.Millisecond {
			time.Sleep(100 * time.Millisecond) // a refused or failing path is not a storm
		}
	}
}

// faultEnv is a running fault case: the control plane, its API servers
// and the fleet of daemons in front of them.
type faultEnv struct {
	l       *controlplane.Local
	cs      kubernetes.Interface
	servers []*apiServer
	rl      *relay
}

// withFaultFleet starts a control plane with faultAPIServers API servers
// and o.nodes daemons of binary, with extra arguments, runs fn and stops it
// all.
func withFaultFleet(ctx context.Context, o options, binary string, extra []string, fn func(env faultEnv) error) error {
	l, err := controlplane.StartLocal(ctx, localOptions(o))
	if err != nil {
		return err
	}
	defer l.Stop()
	servers, rl, err := startAPIServers(ctx, l)
	defer func() {
		for _, s := range servers {
			if s.p != nil {
				_ = s.p.Stop(10 * time.Second)
			}
		}
		if rl != nil {
			rl.close()
		}
	}()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(l.RESTConfig())
	if err != nil {
		return err
	}
	if err := writeSlice(ctx, cs, addrsOf(servers)); err != nil {
		return err
	}
	client, err := l.CA.Client("node", "system:node:fleet", "system:nodes")
	if err != nil {
		return err
	}
	daemons, err := startFaultFleet(o, binary, l, addrsOf(servers), client, extra)
	defer stopFleet(daemons)
	if err != nil {
		return err
	}
	time.Sleep(2 * o.interval)
	return fn(faultEnv{l: l, cs: cs, servers: servers, rl: rl})
}

// measureFault runs one fleet of binary through one fault.
func measureFault(ctx context.Context, o options, name, binary string) (faultFigures, error) {
	f := faultFigures{name: name, fault: o.fault}
	err := withFaultFleet(ctx, o, binary, nil, func(env faultEnv) error {
		var err error
		f, err = runFault(ctx, o, f, env)
		return err
	})
	return f, err
}

// startWatchers starts o.watchers watchers through each daemon; stop ends
// them and waits for them.
func startWatchers(ctx context.Context, o options, l *controlplane.Local, d *dials) (stop func(), err error) {
	cfg, err := controlplane.ClientTLS(l.CA, l.Admin, "kubernetes.default.svc")
	if err != nil {
		return nil, err
	}
	cfg.NextProtos = []string{"http/1.1"}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range o.nodes {
		addr := "127.0.0.1:" + strconv.Itoa(20000+2*i)
		for range o.watchers {
			wg.Go(func() { watcher(wctx, addr, cfg, d) })
		}
	}
	return func() { cancel(); wg.Wait() }, nil
}

// runFault starts the watchers, lets them settle, injects the fault and
// records the reconnects.
func runFault(ctx context.Context, o options, f faultFigures, env faultEnv) (faultFigures, error) {
	var d dials
	stop, err := startWatchers(ctx, o, env.l, &d)
	if err != nil {
		return f, err
	}
	time.Sleep(5 * time.Second)
	faultAt := time.Now()
	switch o.fault {
	case "removal":
		addrs := addrsOf(env.servers)
		err = writeSlice(ctx, env.cs, addrs[:len(addrs)-1])
	case "quorum":
		env.rl.holed.Store(true)
	default:
		err = fmt.Errorf("-fault: %q is neither removal, quorum nor restore", o.fault)
	}
	if err == nil {
		time.Sleep(o.drain + 4*o.interval + 5*time.Second)
	}
	stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	f.failed = d.failed
	fillMoves(&f, d.at, faultAt)
	return f, err
}

// fillMoves sets f's figures from the dial times after faultAt.
func fillMoves(f *faultFigures, at []time.Time, faultAt time.Time) {
	buckets := map[int]int{}
	for _, t := range at {
		if !t.After(faultAt) {
			continue
		}
		since := t.Sub(faultAt)
		if f.moved == 0 || since < f.first {
			f.first = since
		}
		f.last = max(f.last, since)
		f.moved++
		buckets[int(since/(100*time.Millisecond))]++
	}
	for _, n := range buckets {
		f.peak = max(f.peak, n)
	}
}

func startFaultFleet(o options, binary string, l *controlplane.Local, addrs []string, client pki.Pair, extra []string) ([]*proc.Process, error) {
	var ps []*proc.Process
	for i := range o.nodes {
		port := 20000 + 2*i
		p, err := proc.Start("extractedprism", filepath.Join(l.Dir, "daemon-"+strconv.Itoa(i)+".log"), append([]string{binary,
			// One static seed, as a kubeadm node has its control-plane
			// endpoint: the static list is merged with the discovered
			// one, so a static entry would never be removed.
			"--endpoints", addrs[0], "--kubeconfig", l.Kubeconfig,
			"--bind-port", strconv.Itoa(port), "--health-port", strconv.Itoa(port + 1),
			"--health-check", "readyz", "--health-check-ca-file", l.CA.CertFile(), "--health-check-server-name", "kubernetes.default.svc",
			"--health-check-cert-file", client.Cert, "--health-check-key-file", client.Key,
			"--health-interval", o.interval.String(), "--health-timeout", (o.interval / 2).String(),
			"--drain-timeout", o.drain.String(), "--log-level", "info",
		}, extra...), nil)
		if err != nil {
			return ps, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func reportFaults(o options, fs []faultFigures) {
	fmt.Printf("fault: %s of one of 3 API servers; %d daemons, %d watchers each, readyz every %s, drain timeout %s\n\n",
		o.fault, o.nodes, o.watchers, o.interval, o.drain)
	fmt.Println("| daemon | connections moved | failed dials | peak reconnects per 100 ms | first / last move after the fault |")
	fmt.Println("|---|---|---|---|---|")
	for _, f := range fs {
		fmt.Printf("| %s | %d | %d | %d | %.1f s / %.1f s |\n", f.name, f.moved, f.failed, f.peak, f.first.Seconds(), f.last.Seconds())
	}
}

// faultUsage says how to run the fault cases.
const faultUsage = `-fault runs in a network namespace with 192.0.2.11-13 on its loopback:
  go build -o /tmp/fleet ./cmd/fleet
  unshare -n sh -c 'ip link set lo up && for i in 11 12 13; do ip addr add 192.0.2.$i/32 dev lo; done &&
    /tmp/fleet -fault removal -daemon before=... -daemon after=...'`

var errNoDaemons = errors.New("give at least one -daemon name=path")

// runFaults measures each daemon binary through o.fault.
func runFaults(ctx context.Context, o options) error {
	if len(o.daemons) == 0 {
		return errNoDaemons
	}
	var fs []faultFigures
	for _, d := range o.daemons {
		name, path, ok := strings.Cut(d, "=")
		if !ok {
			return fmt.Errorf("-daemon %q: want name=path", d)
		}
		f, err := measureFault(ctx, o, name, path)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fs = append(fs, f)
	}
	reportFaults(o, fs)
	return nil
}
