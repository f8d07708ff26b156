// Package controlplane runs real etcd and kube-apiserver processes for
// tests: the binaries that e2e/build-binaries.sh builds from source into a
// cache outside the work tree.
//
// Two ways to use it:
//
//   - StartLocal (or ForTest in a test) brings up one etcd and one API
//     server on 127.0.0.1 with free ports, no root and no namespaces, in a
//     few seconds. Use it wherever a test needs a real API server, for
//     example for server-side dry-run apply.
//   - EtcdArgs and APIServerArgs give the command lines, which the
//     multi-node harness runs inside network namespaces.
package controlplane

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/extractedprism/extractedprism/e2e/pki"
)

// KubernetesVersion is the version e2e/build-binaries.sh builds; the cache
// directory is keyed by it.
const KubernetesVersion = "v1.37.2"

// Binaries locates kube-apiserver and etcd.
type Binaries struct {
	APIServer string
	Etcd      string
}

// DefaultBinaries returns the binaries in $EP_E2E_BIN_DIR, or else in
// ${EP_E2E_CACHE:-/root/.cache/extractedprism-e2e}/<KubernetesVersion>, and
// an error naming the build script when they are not there.
func DefaultBinaries() (Binaries, error) {
	dir := os.Getenv("EP_E2E_BIN_DIR")
	if dir == "" {
		root := os.Getenv("EP_E2E_CACHE")
		if root == "" {
			root = "/root/.cache/extractedprism-e2e"
		}
		dir = filepath.Join(root, KubernetesVersion)
	}
	b := Binaries{APIServer: filepath.Join(dir, "kube-apiserver"), Etcd: filepath.Join(dir, "etcd")}
	for _, f := range []string{b.APIServer, b.Etcd} {
		if _, err := os.Stat(f); err != nil {
			return b, fmt.Errorf("%s is missing; run e2e/build-binaries.sh first: %w", f, err)
		}
	}
	return b, nil
}

// EtcdConfig is one etcd member. URLs are full, such as http://192.0.2.11:2379.
type EtcdConfig struct {
	Name            string
	DataDir         string
	ListenClient    []string
	AdvertiseClient string
	ListenPeer      string
	AdvertisePeer   string
	InitialCluster  string // name=peerURL,...
	ClusterState    string // "new" or "existing"
	ClusterToken    string
}

// EtcdArgs returns the etcd command line. Plain HTTP: the members only talk
// over loopback or inside the test's own namespaces. fsync is off because
// durability across a power cut is not what these tests are about, and a
// slow disk under a two-core CI would otherwise cost leader elections.
func EtcdArgs(bin string, c EtcdConfig) []string {
	state := c.ClusterState
	if state == "" {
		state = "new"
	}
	return []string{
		bin,
		"--name", c.Name,
		"--data-dir", c.DataDir,
		"--listen-client-urls", strings.Join(c.ListenClient, ","),
		"--advertise-client-urls", c.AdvertiseClient,
		"--listen-peer-urls", c.ListenPeer,
		"--initial-advertise-peer-urls", c.AdvertisePeer,
		"--initial-cluster", c.InitialCluster,
		"--initial-cluster-state", state,
		"--initial-cluster-token", c.ClusterToken,
		"--unsafe-no-fsync",
		"--log-level", "info",
	}
}

// Certs are the files an API server is started with.
type Certs struct {
	CA      string   // client CA and the CA of the serving certificate
	Serving pki.Pair // serving certificate and key
	SA      pki.Pair // service-account public (Cert) and private (Key) key
}

// APIServerConfig is one kube-apiserver.
type APIServerConfig struct {
	Address       string // bind and advertise address
	Port          int
	EtcdServers   []string
	Certs         Certs
	CertDir       string // scratch directory the API server may write to
	ShutdownDelay time.Duration
	// NoEndpointSliceWatchCache serves EndpointSlice watches straight from
	// etcd, so a watch that resumes from a compacted revision gets 410 Gone
	// as it would after a long disconnection in a big cluster. With the
	// watch cache the API server would answer it from memory.
	NoEndpointSliceWatchCache bool
	// EndpointReconciler is "lease" (the default) or "none". The lease
	// reconciler refuses a loopback advertise address.
	EndpointReconciler string
	ExtraArgs          []string
}

// ServiceIPRange is the service range; its first address is pki.ServiceIP.
const ServiceIPRange = "10.96.0.0/16"

// APIServerArgs returns the kube-apiserver command line: the Node
// authorizer and RBAC, as kubeadm runs them (nodes get nothing beyond
// what RBAC grants their group for EndpointSlices), anonymous
// authentication on (so GET /readyz works without credentials, through
// system:public-info-viewer), client certificates, service-account tokens
// and the lease endpoint reconciler, which keeps the default/kubernetes
// EndpointSlice listing every live API server without a controller manager.
func APIServerArgs(bin string, c APIServerConfig) []string {
	reconciler := c.EndpointReconciler
	if reconciler == "" {
		reconciler = "lease"
	}
	args := []string{
		bin,
		"--advertise-address", c.Address,
		"--bind-address", c.Address,
		"--secure-port", strconv.Itoa(c.Port),
		"--etcd-servers", strings.Join(c.EtcdServers, ","),
		"--service-cluster-ip-range", ServiceIPRange,
		"--authorization-mode", "Node,RBAC",
		"--anonymous-auth=true",
		"--client-ca-file", c.Certs.CA,
		"--tls-cert-file", c.Certs.Serving.Cert,
		"--tls-private-key-file", c.Certs.Serving.Key,
		"--service-account-issuer", "https://" + pki.ServiceName + ".cluster.local",
		"--service-account-key-file", c.Certs.SA.Cert,
		"--service-account-signing-key-file", c.Certs.SA.Key,
		"--endpoint-reconciler-type", reconciler,
		"--cert-dir", c.CertDir,
		"--profiling=false",
		"--shutdown-delay-duration", c.ShutdownDelay.String(),
		"--v", "1",
	}
	if c.NoEndpointSliceWatchCache {
		args = append(args, "--watch-cache-sizes", "endpointslices.discovery.k8s.io#0")
	}
	return append(args, c.ExtraArgs...)
}

// DialFunc dials like net.Dialer.DialContext; the netns package provides
// one per namespace.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// WaitEtcdHealthy polls GET /health on clientURL until etcd reports healthy
// (which needs a quorum) or ctx is done.
func WaitEtcdHealthy(ctx context.Context, dial DialFunc, clientURL string) error {
	c := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 3 * time.Second}
	return poll(ctx, "etcd at "+clientURL+" healthy", func() error {
		resp, err := c.Get(clientURL + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var h struct {
			Health string `json:"health"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			return err
		}
		if h.Health != "true" {
			return fmt.Errorf("health %q", h.Health)
		}
		return nil
	})
}

// WaitReady polls GET /readyz on an API server until it answers 200 or ctx
// is done. exited, when not nil, stops the wait early with the process's
// exit.
func WaitReady(ctx context.Context, dial DialFunc, tlsConfig *tls.Config, addr string, exited <-chan struct{}) error {
	c := &http.Client{
		Transport: &http.Transport{DialContext: dial, TLSClientConfig: tlsConfig, DisableKeepAlives: true},
		Timeout:   3 * time.Second,
	}
	return poll(ctx, "API server "+addr+" ready", func() error {
		select {
		case <-exited:
			return errStop
		default:
		}
		resp, err := c.Get("https://" + addr + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d: %s", resp.StatusCode, lastLines(string(body), 5))
		}
		return nil
	})
}

var errStop = errors.New("process exited")

// poll runs check every 250 ms until it returns nil, returns errStop, or
// ctx is done; the error names what was awaited and the last failure.
func poll(ctx context.Context, what string, check func() error) error {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		if errors.Is(err, errStop) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// ClientTLS returns a TLS client configuration trusting ca, presenting the
// given client certificate (none if pair is zero), verifying serverName
// (the dialled address if empty).
func ClientTLS(ca *pki.CA, pair pki.Pair, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: serverName, MinVersion: tls.VersionTLS12}
	if pair.Cert != "" {
		cert, err := tls.LoadX509KeyPair(pair.Cert, pair.Key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
