// Package harness runs extractedprism in front of a real three-node control
// plane built from network namespaces, drives a client workload through
// it, injects faults and measures what the clients saw.
//
// Topology (all inside namespaces this package creates; nothing is added to
// the namespace the test runs in):
//
//	hub:  bridge br0
//	cp1   192.0.2.11  etcd (:2379 client, :2380 peer) + kube-apiserver :6443
//	cp2   192.0.2.12  same
//	cp3   192.0.2.13  same
//	cp4   192.0.2.14  kube-apiserver only, added by the membership scenario
//	w1    192.0.2.21  extractedprism on 127.0.0.1:7445 (health :7446) and
//	                  every client of the workload
//
// Each API server uses only its local etcd member. Traffic goes only to
// loopback or to these 192.0.2.0/24 addresses inside the namespaces.
package harness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/netns"
	"github.com/extractedprism/extractedprism/e2e/pki"
	"github.com/extractedprism/extractedprism/e2e/proc"
)

// Addresses of the topology.
var (
	Subnet   = netip.MustParsePrefix("192.0.2.0/24")
	CPNames  = []string{"cp1", "cp2", "cp3"}
	nodeAddr = map[string]netip.Addr{
		"cp1": netip.MustParseAddr("192.0.2.11"),
		"cp2": netip.MustParseAddr("192.0.2.12"),
		"cp3": netip.MustParseAddr("192.0.2.13"),
		"cp4": netip.MustParseAddr("192.0.2.14"),
		"w1":  netip.MustParseAddr("192.0.2.21"),
	}
)

const (
	apiPort = 6443
	// ProxyAddr is where extractedprism listens inside w1.
	ProxyAddr = "127.0.0.1:7445"
	// HealthAddr is extractedprism's health server inside w1.
	HealthAddr = "127.0.0.1:7446"
	// extraAddr is an address of w1 that the compaction scenario publishes
	// in an extra EndpointSlice; a relay on it forwards to cp2.
	extraAddr = "192.0.2.31"
	nftTable  = "epe2e"
)

// APIAddr returns the API server address of a control-plane node.
func APIAddr(node string) string {
	return netip.AddrPortFrom(nodeAddr[node], apiPort).String()
}

// Cluster is the running topology. Its methods are safe for concurrent use.
type Cluster struct {
	Dir   string
	Net   *netns.Net
	W1    *netns.Node
	CA    *pki.CA
	Admin pki.Pair // system:masters client certificate
	Probe pki.Pair // client certificate for extractedprism's readyz probe
	SA    pki.Pair
	bins  controlplane.Binaries
	logf  func(format string, args ...any)

	mu        sync.Mutex // guards cps and nodeCerts
	cps       map[string]*cpNode
	nodeCerts int // node certificates issued (RotateNodeCert)
}

type cpNode struct {
	name    string
	node    *netns.Node
	etcd    *proc.Process
	api     *proc.Process
	serving pki.Pair
	direct  kubernetes.Interface // see DirectClient
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	Dir      string // logs, certificates, etcd data
	Binaries controlplane.Binaries
	Logf     func(format string, args ...any) // progress messages; may be nil
}

// StartCluster sweeps namespaces left by earlier runs, builds the topology
// and starts etcd and the API servers on cp1-cp3, returning once all three
// are ready and the kubernetes EndpointSlice lists them. Close it.
func StartCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, e := range netns.Sweep(netns.DefaultPrefix) {
		logf("sweep: %v", e)
	}
	c := &Cluster{Dir: o.Dir, bins: o.Binaries, logf: logf, cps: map[string]*cpNode{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.CA, err = pki.NewCA(filepath.Join(o.Dir, "pki")); err != nil {
		return nil, err
	}
	if c.Admin, err = c.CA.Client("admin", "admin", "system:masters"); err != nil {
		return nil, err
	}
	if c.Probe, err = c.CA.Client("probe", "extractedprism-probe"); err != nil {
		return nil, err
	}
	if c.SA, err = pki.ServiceAccountKeys(c.CA.Dir); err != nil {
		return nil, err
	}
	if c.Net, err = netns.New(netns.DefaultPrefix, Subnet); err != nil {
		return nil, err
	}
	if c.W1, err = c.Net.AddNode("w1", nodeAddr["w1"]); err != nil {
		return nil, err
	}
	var initial []string
	for _, name := range CPNames {
		initial = append(initial, name+"=http://"+nodeAddr[name].String()+":2380")
	}
	for _, name := range CPNames {
		if err := c.addCP(name); err != nil {
			return nil, err
		}
		cp := c.cps[name]
		args := controlplane.EtcdArgs(c.bins.Etcd, controlplane.EtcdConfig{
			Name:            name,
			DataDir:         filepath.Join(o.Dir, "etcd-"+name),
			ListenClient:    []string{etcdURL(name), "http://127.0.0.1:2379"},
			AdvertiseClient: etcdURL(name),
			ListenPeer:      "http://" + nodeAddr[name].String() + ":2380",
			AdvertisePeer:   "http://" + nodeAddr[name].String() + ":2380",
			InitialCluster:  strings.Join(initial, ","),
			ClusterToken:    c.Net.Prefix(),
		})
		cp.etcd, err = proc.Start("etcd-"+name, c.logPath("etcd-"+name), append(cp.node.Command(), args...), nil)
		if err != nil {
			return nil, err
		}
	}
	logf("starting etcd on %v", CPNames)
	for _, name := range CPNames {
		if err := controlplane.WaitEtcdHealthy(ctx, c.W1.DialContext, etcdURL(name)); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, c.cps[name].etcd.Tail(2000))
		}
	}
	logf("starting kube-apiserver on %v", CPNames)
	for _, name := range CPNames {
		if err := c.StartAPIServer(name); err != nil {
			return nil, err
		}
	}
	if err := c.WaitAPIServers(ctx, CPNames); err != nil {
		return nil, err
	}
	return c, nil
}

func etcdURL(node string) string { return "http://" + nodeAddr[node].String() + ":2379" }

func (c *Cluster) logPath(name string) string { return filepath.Join(c.Dir, name+".log") }

// addCP creates a control-plane namespace and its serving certificate.
func (c *Cluster) addCP(name string) error {
	node, err := c.Net.AddNode(name, nodeAddr[name])
	if err != nil {
		return err
	}
	serving, err := c.CA.APIServer("apiserver-"+name, nodeAddr[name].String())
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cps[name] = &cpNode{name: name, node: node, serving: serving}
	return nil
}

func (c *Cluster) cp(name string) (*cpNode, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp := c.cps[name]
	if cp == nil {
		return nil, fmt.Errorf("no control-plane node %s", name)
	}
	return cp, nil
}

// apiServerConfig is the API server of a node: on cp1-cp3 it uses its local
// etcd member only; cp4 has no member and uses all three.
func (c *Cluster) apiServerConfig(cp *cpNode) controlplane.APIServerConfig {
	etcd := []string{"http://127.0.0.1:2379"}
	var delay time.Duration
	if cp.etcd == nil {
		etcd = nil
		for _, name := range CPNames {
			etcd = append(etcd, etcdURL(name))
		}
		// cp4 leaves the EndpointSlice at once on SIGTERM but keeps
		// serving this long, so extractedprism's drain, not the API
		// server's own shutdown, is what closes its connections.
		delay = 20 * time.Second
	}
	return controlplane.APIServerConfig{
		Address:                   nodeAddr[cp.name].String(),
		Port:                      apiPort,
		EtcdServers:               etcd,
		Certs:                     controlplane.Certs{CA: c.CA.CertFile(), Serving: cp.serving, SA: c.SA},
		CertDir:                   filepath.Join(c.Dir, "certdir-"+cp.name),
		ShutdownDelay:             delay,
		NoEndpointSliceWatchCache: true,
	}
}

// StartAPIServer starts the API server of a node whose API server is not
// running; it does not wait for it to become ready.
func (c *Cluster) StartAPIServer(name string) error {
	cp, err := c.cp(name)
	if err != nil {
		return err
	}
	if cp.api != nil {
		if exited, _ := cp.api.Exited(); !exited {
			return nil
		}
	}
	argv := append(cp.node.Command(), controlplane.APIServerArgs(c.bins.APIServer, c.apiServerConfig(cp))...)
	p, err := proc.Start("kube-apiserver-"+name, c.logPath("kube-apiserver-"+name), argv, nil)
	if err != nil {
		return err
	}
	c.mu.Lock()
	cp.api = p
	c.mu.Unlock()
	return nil
}

// KillAPIServer sends SIGKILL to a node's API server and waits for it.
func (c *Cluster) KillAPIServer(name string) error {
	cp, err := c.cp(name)
	if err != nil {
		return err
	}
	if cp.api != nil {
		cp.api.Kill()
	}
	return nil
}

// StopAPIServer sends SIGTERM to a node's API server and returns without
// waiting; Done reports the exit.
func (c *Cluster) StopAPIServer(name string) (<-chan struct{}, error) {
	cp, err := c.cp(name)
	if err != nil {
		return nil, err
	}
	if cp.api == nil {
		done := make(chan struct{})
		close(done)
		return done, nil
	}
	return cp.api.Done(), cp.api.Signal(os.Interrupt)
}

// WaitAPIServers waits until each named API server answers /readyz 200
// and the kubernetes EndpointSlice lists exactly the running ones.
func (c *Cluster) WaitAPIServers(ctx context.Context, names []string) error {
	tlsCfg, err := controlplane.ClientTLS(c.CA, c.Admin, "")
	if err != nil {
		return err
	}
	for _, name := range names {
		cp, err := c.cp(name)
		if err != nil {
			return err
		}
		if err := controlplane.WaitReady(ctx, c.W1.DialContext, tlsCfg, APIAddr(name), cp.api.Done()); err != nil {
			return fmt.Errorf("%w\n%s", err, cp.api.Tail(3000))
		}
	}
	return nil
}

// WaitEndpointSlice waits until the kubernetes EndpointSlice in default
// lists exactly the API servers of the named nodes.
func (c *Cluster) WaitEndpointSlice(ctx context.Context, names []string) error {
	var want []string
	for _, n := range names {
		want = append(want, nodeAddr[n].String())
	}
	slices.Sort(want)
	var last []string
	var lastErr error
	for {
		cs, err := c.DirectClient()
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var es *discoveryv1.EndpointSlice
			es, err = cs.DiscoveryV1().EndpointSlices("default").Get(cctx, "kubernetes", metav1.GetOptions{})
			cancel()
			if err == nil {
				last = sliceAddresses(es)
				if slices.Equal(last, want) {
					return nil
				}
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the kubernetes EndpointSlice to list %v: %w (last: %v, %v)", want, ctx.Err(), last, lastErr)
		case <-time.After(time.Second):
		}
	}
}

func sliceAddresses(es *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, ep := range es.Endpoints {
		out = append(out, ep.Addresses...)
	}
	slices.Sort(out)
	return out
}

// RESTConfig returns an admin configuration for host, dialled from w1.
// Each call yields a client with its own connections: a custom proxy
// function makes client-go skip its transport cache.
func (c *Cluster) RESTConfig(host, serverName string) *rest.Config {
	return &rest.Config{
		Host: "https://" + host,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:     c.CA.CertFile(),
			CertFile:   c.Admin.Cert,
			KeyFile:    c.Admin.Key,
			ServerName: serverName,
		},
		Dial:  c.W1.DialContext,
		Proxy: http.ProxyURL(nil),
		QPS:   50,
		Burst: 100,
	}
}

// DirectClient returns an admin client for the first control-plane node
// whose API server process is running, bypassing extractedprism. Clients
// are kept per node, so polling does not pile up idle connections in w1.
func (c *Cluster) DirectClient() (kubernetes.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range CPNames {
		cp := c.cps[name]
		if cp == nil || cp.api == nil {
			continue
		}
		if exited, _ := cp.api.Exited(); exited {
			continue
		}
		if cp.direct == nil {
			cfg := c.RESTConfig(APIAddr(name), "")
			cfg.Timeout = 10 * time.Second
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return nil, err
			}
			cp.direct = cs
		}
		return cp.direct, nil
	}
	return nil, errors.New("no API server is running")
}

// BlackHole takes a node's link down (or back up).
func (c *Cluster) BlackHole(name string, on bool) error {
	return c.Net.SetLink(name, !on)
}

// Partition drops the node's etcd peer traffic (TCP port 2380, both ways)
// with nftables inside its namespace, or removes the rule. The API server
// stays reachable; its etcd member falls into the minority.
func (c *Cluster) Partition(ctx context.Context, name string, on bool) error {
	cp, err := c.cp(name)
	if err != nil {
		return err
	}
	if !on {
		out, err := cp.node.Exec("nft", "delete", "table", "inet", nftTable).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") {
			return fmt.Errorf("nft delete table in %s: %v: %s", name, err, out)
		}
		return nil
	}
	rules := fmt.Sprintf(`table inet %[1]s {
	chain input { type filter hook input priority 0; tcp dport 2380 drop; tcp sport 2380 drop; }
	chain output { type filter hook output priority 0; tcp dport 2380 drop; tcp sport 2380 drop; }
}
`, nftTable)
	cmd := cp.node.Exec("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %v: %s", name, err, out)
	}
	return nil
}

// AddCP4 creates cp4 and starts its API server (no etcd member: it uses the
// three existing ones). It does not wait for readiness.
func (c *Cluster) AddCP4() error {
	if _, err := c.cp("cp4"); err == nil {
		return c.StartAPIServer("cp4")
	}
	if err := c.addCP("cp4"); err != nil {
		return err
	}
	return c.StartAPIServer("cp4")
}

// RemoveCP4 kills cp4's API server, if any, and deletes its namespace.
func (c *Cluster) RemoveCP4() error {
	cp, err := c.cp("cp4")
	if err != nil {
		return nil
	}
	if cp.api != nil {
		cp.api.Kill()
	}
	c.mu.Lock()
	delete(c.cps, "cp4")
	c.mu.Unlock()
	return c.Net.RemoveNode("cp4")
}

// Restore undoes every fault: links up, partitions healed, cp4 gone, the
// API servers of cp1-cp3 running and ready, the EndpointSlice listing the
// three. Scenarios start from here.
func (c *Cluster) Restore(ctx context.Context) error {
	var errs []error
	for _, name := range CPNames {
		errs = append(errs, c.BlackHole(name, false), c.Partition(ctx, name, false))
		cp, err := c.cp(name)
		if err != nil {
			return err
		}
		if exited, _ := cp.etcd.Exited(); exited {
			errs = append(errs, fmt.Errorf("etcd on %s has exited; the cluster cannot be restored\n%s", name, cp.etcd.Tail(2000)))
		}
		errs = append(errs, c.StartAPIServer(name))
	}
	if _, err := c.cp("cp4"); err == nil {
		errs = append(errs, c.RemoveCP4())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := c.WaitEtcdSettled(ctx); err != nil {
		return err
	}
	if err := c.WaitAPIServers(ctx, CPNames); err != nil {
		return err
	}
	// A killed API server's lease expires after 15 s and the others then
	// drop it from the slice; a restarted one re-adds itself at once.
	return c.WaitEndpointSlice(ctx, CPNames)
}

// Close stops every process and removes the namespaces.
func (c *Cluster) Close() {
	c.mu.Lock()
	var ps []*proc.Process
	for _, cp := range c.cps {
		if cp.api != nil {
			ps = append(ps, cp.api)
		}
		if cp.etcd != nil {
			ps = append(ps, cp.etcd)
		}
	}
	c.mu.Unlock()
	for _, p := range ps {
		p.Kill()
	}
	if c.Net != nil {
		if err := c.Net.Close(); err != nil {
			c.logf("removing namespaces: %v", err)
		}
	}
}

// ExecW1 runs a command inside w1 and returns its combined output.
func (c *Cluster) ExecW1(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", c.W1.NS}, argv...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
