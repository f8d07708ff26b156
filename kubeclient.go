package main

// The kubernetes provider's client: its credentials, from the pod's
// service account or, beyond the spec, from a kubeconfig (--kubeconfig: a
// node-level instance outside any pod uses the kubelet's), and a REST
// client for discovery/v1 alone. It always connects through the daemon's
// own listener.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// errNoKubeCredentials means there is neither a kubeconfig nor the in-cluster
// service-account files: the daemon runs outside a cluster, and the caller
// goes on with static endpoints only.
var errNoKubeCredentials = errors.New("no kubernetes credentials")

// defaultServiceAccountDir holds the token and CA that the kubelet mounts
// into every pod that has a service account.
const defaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// kubeProviderConfig says how the kubernetes provider reaches the API server.
type kubeProviderConfig struct {
	LocalAddr  string // the daemon's own listener, host:port; the client always connects here
	Kubeconfig string // optional; credentials come from it, its server address is replaced by LocalAddr
	ServerName string // TLS server name to verify, normally "kubernetes.default.svc"
}

// newKubernetesProvider builds the kubernetes provider. Its client connects
// to the daemon's own listener rather than the kubernetes.default.svc
// ClusterIP: the ClusterIP needs the CNI plugin, which may itself need this
// daemon to reach the API server, and the listener fails over across every
// known API server. Its only error wraps errNoKubeCredentials: there are no
// credentials to connect with. Credentials that are named but do not load
// (yet) are retried by the provider (kubeWatcher.awaitClient).
func newKubernetesProvider(cfg kubeProviderConfig, log *slog.Logger, m *metrics) (provider, error) {
	connect := func() (sliceClient, error) {
		restConfig, err := kubeRESTConfig(cfg, defaultServiceAccountDir)
		if err != nil {
			return nil, err
		}
		client, err := newRESTSliceClient(restConfig)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		return client, nil
	}
	client, err := connect()
	if errors.Is(err, errNoKubeCredentials) {
		return nil, err
	}
	w := newKubeWatcher(client, log, m, rand.Float64)
	w.connect = connect
	return w, nil
}

// restSliceClient is a REST client for the discovery.k8s.io/v1 group alone.
// client-go's generated clientset would work as well, but it links a typed
// client for every API group, which costs about 12 MB of binary and several
// MiB of memory in every node's copy of this daemon.
type restSliceClient struct{ rc *rest.RESTClient }

func newRESTSliceClient(cfg *rest.Config) (*restSliceClient, error) {
	scheme := runtime.NewScheme()
	// Registers EndpointSlice and EndpointSliceList, and with them the meta
	// types a response may carry: Status (errors, 410 Gone in a watch) and
	// the list options.
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register discovery/v1: %w", err)
	}
	c := *cfg
	c.GroupVersion = &discoveryv1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(&c)
	if err != nil {
		return nil, err
	}
	return &restSliceClient{rc: rc}, nil
}

// dropIdle closes the client's idle connections after a failed request, so
// that the next one dials the local listener afresh and the proxy picks an
// upstream for it again. Otherwise every retry would go down the same
// HTTP/2 connection to the same API server for as long as it answers
// errors (cut off from etcd, overloaded), however many others are fine.
func (c *restSliceClient) dropIdle() { utilnet.CloseIdleConnectionsFor(c.rc.Client.Transport) }

// errWatchNotOpened is a Watch call that failed before a stream opened:
// the connection closed or timed out during the request. client-go reports
// it as a watch that opened and closed at once, without the error.
var errWatchNotOpened = errors.New("watch request failed before a stream opened (connection closed or timed out)")

// get is a request for the EndpointSlices of namespace. It is made once:
// client-go would otherwise retry a failed request up to 10 times a second
// apart, hidden from the caller, and the watcher's backoff would not hold.
func (c *restSliceClient) get(namespace string, opts *metav1.ListOptions) *rest.Request {
	return c.rc.Get().MaxRetries(0).Namespace(namespace).Resource("endpointslices").VersionedParams(opts, metav1.ParameterCodec)
}

func (c *restSliceClient) List(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := c.get(namespace, &opts).Do(ctx).Into(list); err != nil {
		c.dropIdle()
		return nil, err
	}
	return list, nil
}

func (c *restSliceClient) Watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	w, err := c.get(namespace, &opts).Watch(ctx)
	if _, ok := w.(*watch.StreamWatcher); err == nil && !ok {
		w.Stop() // the empty watch client-go returns for a failed request
		err = errWatchNotOpened
	}
	if err != nil {
		c.dropIdle()
		return nil, err
	}
	return w, nil
}

// kubeRESTConfig returns the client configuration: credentials from
// cfg.Kubeconfig when it is set, otherwise from the service-account files in
// serviceAccountDir; the server is always https://LocalAddr. A kubeconfig
// that is set but cannot be loaded is an error, not errNoKubeCredentials:
// the operator asked for it, so the caller logs it as an error.
func kubeRESTConfig(cfg kubeProviderConfig, serviceAccountDir string) (*rest.Config, error) {
	if _, _, err := net.SplitHostPort(cfg.LocalAddr); err != nil {
		return nil, fmt.Errorf("kubernetes client address %q: %w", cfg.LocalAddr, err)
	}
	var restConfig *rest.Config
	if cfg.Kubeconfig != "" {
		var err error
		restConfig, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", cfg.Kubeconfig, err)
		}
	} else {
		token, ca := filepath.Join(serviceAccountDir, "token"), filepath.Join(serviceAccountDir, "ca.crt")
		for _, file := range []string{token, ca} {
			switch _, err := os.Stat(file); {
			case errors.Is(err, fs.ErrNotExist):
				return nil, fmt.Errorf("%w: no kubeconfig and %w", errNoKubeCredentials, err)
			case err != nil:
				return nil, fmt.Errorf("service account: %w", err)
			}
		}
		restConfig = &rest.Config{
			// A token file, not the token itself: client-go re-reads it,
			// so the kubelet's rotation of projected tokens is picked up.
			BearerTokenFile: token,
			TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		}
	}
	restConfig.Host = "https://" + cfg.LocalAddr
	// The API server certificate does not name the local listener; it names
	// kubernetes.default.svc. A server name set in the kubeconfig is the
	// operator's choice and is kept.
	restConfig.ServerName = cmp.Or(restConfig.ServerName, cfg.ServerName)
	// The client must reach the local listener directly: a nil proxy URL
	// means no proxy. Without this, HTTPS_PROXY would apply whenever the
	// listener is not on a loopback address.
	restConfig.Proxy = http.ProxyURL(nil)
	restConfig.UserAgent = "extractedprism"
	return restConfig, nil
}
