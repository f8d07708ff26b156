package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/extractedprism/extractedprism/e2e/pki"
	"github.com/extractedprism/extractedprism/e2e/proc"
)

// Local is one etcd and one kube-apiserver on 127.0.0.1.
type Local struct {
	Dir        string // certificates, data and logs
	Addr       string // API server host:port
	Kubeconfig string // admin kubeconfig (system:masters client certificate)
	CA         *pki.CA
	Admin      pki.Pair
	EtcdURL    string // etcd's client URL
	SA         pki.Pair

	etcd      *proc.Process
	apiserver *proc.Process
}

// LocalOptions configure StartLocal. The zero value works when the
// binaries are in the default cache.
type LocalOptions struct {
	Dir                string   // defaults to a new temporary directory
	Binaries           Binaries // defaults to DefaultBinaries()
	ExtraAPIServerArgs []string
	StartTimeout       time.Duration // defaults to 90 s
	Keys               pki.Keys      // of every certificate; defaults to ECDSA
}

// StartLocal starts etcd and kube-apiserver on free loopback ports and
// waits until the API server is ready. It needs no root. Call Stop.
func StartLocal(ctx context.Context, o LocalOptions) (*Local, error) {
	if o.Binaries == (Binaries{}) {
		b, err := DefaultBinaries()
		if err != nil {
			return nil, err
		}
		o.Binaries = b
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "ep-local-apiserver-")
		if err != nil {
			return nil, err
		}
		o.Dir = d
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()

	l := &Local{Dir: o.Dir}
	ok := false
	defer func() {
		if !ok {
			l.Stop()
		}
	}()
	ca, err := pki.NewCAKeys(filepath.Join(o.Dir, "pki"), o.Keys)
	if err != nil {
		return nil, err
	}
	l.CA = ca
	serving, err := ca.APIServer("apiserver")
	if err != nil {
		return nil, err
	}
	sa, err := pki.ServiceAccountKeys(ca.Dir)
	if err != nil {
		return nil, err
	}
	if l.Admin, err = ca.Client("admin", "admin", "system:masters"); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	l.EtcdURL, l.SA = clientURL, sa
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	l.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2]))

	var d net.Dialer
	l.etcd, err = proc.Start("etcd", filepath.Join(o.Dir, "etcd.log"), EtcdArgs(o.Binaries.Etcd, EtcdConfig{
		Name:            "local",
		DataDir:         filepath.Join(o.Dir, "etcd"),
		ListenClient:    []string{clientURL},
		AdvertiseClient: clientURL,
		ListenPeer:      peerURL,
		AdvertisePeer:   peerURL,
		InitialCluster:  "local=" + peerURL,
		ClusterToken:    "local",
	}), nil)
	if err != nil {
		return nil, err
	}
	if err := WaitEtcdHealthy(ctx, d.DialContext, clientURL); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, l.etcd.Tail(2000))
	}
	l.apiserver, err = proc.Start("kube-apiserver", filepath.Join(o.Dir, "kube-apiserver.log"), APIServerArgs(o.Binaries.APIServer, APIServerConfig{
		Address:     "127.0.0.1",
		Port:        ports[2],
		EtcdServers: []string{clientURL},
		Certs:       Certs{CA: ca.CertFile(), Serving: serving, SA: sa},
		CertDir:     filepath.Join(o.Dir, "apiserver-certs"),
		// The kubernetes Service gets no endpoints: nothing here needs
		// them, and the lease reconciler rejects 127.0.0.1.
		EndpointReconciler: "none",
		ExtraArgs:          o.ExtraAPIServerArgs,
	}), nil)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := ClientTLS(ca, l.Admin, "")
	if err != nil {
		return nil, err
	}
	if err := WaitReady(ctx, d.DialContext, tlsCfg, l.Addr, l.apiserver.Done()); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, l.apiserver.Tail(3000))
	}
	l.Kubeconfig = filepath.Join(o.Dir, "admin.kubeconfig")
	if err := WriteKubeconfig(l.Kubeconfig, "https://"+l.Addr, "", ca.CertFile(), l.Admin); err != nil {
		return nil, err
	}
	ok = true
	return l, nil
}

// RESTConfig returns an admin client configuration.
func (l *Local) RESTConfig() *rest.Config {
	return &rest.Config{
		Host: "https://" + l.Addr,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   l.CA.CertFile(),
			CertFile: l.Admin.Cert,
			KeyFile:  l.Admin.Key,
		},
	}
}

// Stop stops the API server, then etcd. The directory is left in place.
func (l *Local) Stop() {
	if l.apiserver != nil {
		_ = l.apiserver.Stop(10 * time.Second)
	}
	if l.etcd != nil {
		_ = l.etcd.Stop(10 * time.Second)
	}
}

// ForTest starts a local control plane for t, in t.TempDir, stopped when the
// test ends. It skips the test when the binaries have not been built, so a
// plain `go test ./...` without them passes with a message saying why.
func ForTest(t testing.TB) *Local {
	t.Helper()
	b, err := DefaultBinaries()
	if err != nil {
		t.Skip(err)
	}
	l, err := StartLocal(context.Background(), LocalOptions{Dir: t.TempDir(), Binaries: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return l
}

// WriteKubeconfig writes an admin kubeconfig for server, verifying
// serverName (the host in server if empty) against caFile.
func WriteKubeconfig(path, server, serverName, caFile string, client pki.Pair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile, TLSServerName: serverName}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: client.Cert, ClientKey: client.Key}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "admin"}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

// freePorts returns n distinct ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		addr, ok := ln.Addr().(*net.TCPAddr)
		if !ok {
			return nil, errors.New("not a TCP listener")
		}
		ports = append(ports, addr.Port)
	}
	return ports, nil
}

// APIServerPid is the kube-apiserver's process id, for reading its CPU time.
func (l *Local) APIServerPid() int { return l.apiserver.Pid() }
