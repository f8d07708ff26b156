package main

// Endpoint discovery: where the load balancer's upstream list comes from.
//
// Two providers feed one merged provider. The static provider sends the
// --endpoints list once; it needs no cluster access, so the proxy works before
// the CNI plugin does. The kubernetes provider watches the EndpointSlices of
// the default/kubernetes Service through the daemon's own listener and follows
// control plane membership changes. The merged provider sends the union of the
// latest lists to the load balancer, never an empty one.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// provider produces endpoint lists on out until ctx is done. An endpoint is
// "host:port"; an IP host is spelled as net.JoinHostPort(ip.String(), port) so
// that two providers naming the same address produce the same string. A list
// sent on out belongs to the receiver, and the sender never modifies it
// afterwards.
type provider interface {
	// name labels the provider's metrics and log lines.
	name() string
	// run returns nil once ctx is cancelled; an error means the provider
	// failed for good.
	run(ctx context.Context, out chan<- []string) error
}

const (
	staticProviderName = "static"
	kubeProviderName   = "kubernetes"
)

// staticProvider sends the --endpoints list. It is the bootstrap level of
// discovery: it needs no cluster access and never fails.
type staticProvider struct {
	endpoints []string // canonical; never modified
}

// newStaticProvider returns a provider that sends endpoints once, then blocks
// until its context is done.
func newStaticProvider(endpoints []string) provider {
	canonical := make([]string, 0, len(endpoints))
	for _, e := range endpoints {
		canonical = append(canonical, canonicalEndpoint(e))
	}
	return &staticProvider{endpoints: canonical}
}

func (p *staticProvider) name() string { return staticProviderName }

func (p *staticProvider) initial() []string { return p.endpoints }

func (p *staticProvider) run(ctx context.Context, out chan<- []string) error {
	select {
	case out <- slices.Clone(p.endpoints):
	case <-ctx.Done():
		return nil
	}
	<-ctx.Done()
	return nil
}

// canonicalEndpoint spells an IP endpoint the way the kubernetes provider
// does, so that "[::0:1]:6443" from --endpoints and "[::1]:6443" from an
// EndpointSlice deduplicate to one upstream. Hostnames are kept as given.
func canonicalEndpoint(hostport string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return hostport
	}
	return net.JoinHostPort(ip.Unmap().String(), port)
}

// mergedProvider runs every sub-provider concurrently and sends the
// deduplicated union of their latest lists.
//
// It counts discovery_updates_total{provider} for each list a sub-provider
// sends. This is the only place that counter is incremented, so each update
// is counted once whichever provider sent it; the sub-providers count only
// their own errors. It also owns discovery_running{provider} for the
// providers it runs.
type mergedProvider struct {
	log       *slog.Logger
	m         *metrics
	providers []provider

	// mu guards byName, each provider's latest list, for sources.
	mu     sync.Mutex
	byName map[string][]string
}

// initialLister is a provider whose list is known before it runs. The
// merged provider starts from these lists, so its first union is complete:
// otherwise the static list, sent first, would briefly drop the cached
// endpoints the daemon was seeded with.
type initialLister interface {
	initial() []string
}

// fallbackProvider is a provider whose list counts only until the provider
// it names has sent one: the endpoint cache stands in for discovery until
// discovery answers.
type fallbackProvider interface {
	provider
	supersededBy() string
}

// newMergedProvider returns a provider over providers; it starts nothing until
// run, but creates their update and error series at once: the daemon builds
// it before anything serves.
func newMergedProvider(log *slog.Logger, m *metrics, providers ...provider) *mergedProvider {
	for _, p := range providers {
		m.discoverySeries(p.name())
	}
	return &mergedProvider{log: log, m: m, providers: providers, byName: map[string][]string{}}
}

// preload records the lists of the providers that know theirs up front.
func (mp *mergedProvider) preload() {
	for _, p := range mp.providers {
		if il, ok := p.(initialLister); ok && len(il.initial()) > 0 {
			mp.record(p.name(), il.initial())
		}
	}
}

// sources maps each endpoint of the current union to the providers that
// list it, for /upstreams.
func (mp *mergedProvider) sources() map[string][]string {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	out := map[string][]string{}
	for _, p := range mp.providers {
		if mp.supersededLocked(p) {
			continue
		}
		for _, addr := range mp.byName[p.name()] {
			if !slices.Contains(out[addr], p.name()) {
				out[addr] = append(out[addr], p.name())
			}
		}
	}
	return out
}

// supersededLocked reports whether p is a fallback whose superseding
// provider has sent a list.
func (mp *mergedProvider) supersededLocked(p provider) bool {
	fp, ok := p.(fallbackProvider)
	if !ok {
		return false
	}
	_, sent := mp.byName[fp.supersededBy()]
	return sent
}

// record stores name's latest list and returns the union of the lists that
// count.
func (mp *mergedProvider) record(name string, endpoints []string) []string {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	mp.byName[name] = endpoints
	var lists [][]string
	for _, p := range mp.providers {
		if !mp.supersededLocked(p) {
			lists = append(lists, mp.byName[p.name()])
		}
	}
	return unionEndpoints(lists)
}

// providerEvent is what superviseProvider reports to the merge loop: either a
// list, or (done) the end of the provider's run with the error it returned.
type providerEvent struct {
	index     int // into mergedProvider.providers
	endpoints []string
	done      bool
	err       error
}

// run starts every provider, waits for all of them before it returns, and
// sends the union of their latest lists on out whenever it changes. It never
// sends an empty list: the load balancer keeps its last upstreams rather than
// route to none. A provider that fails is counted in discovery_errors_total
// and its last list stays in the union, while the others go on; run returns
// an error only when every provider has failed, and nil when ctx is done.
// discovery_running{provider} is 1 from the start of each provider's run
// until it ends before ctx is done, with an error or without.
func (mp *mergedProvider) run(ctx context.Context, out chan<- []string) error {
	if len(mp.providers) == 0 {
		return errors.New("no discovery providers")
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Deferred calls run last-in first-out: cancel first, so the providers
	// stop, then wait for them.
	defer wg.Wait()
	defer cancel()

	mp.preload()
	events := make(chan providerEvent)
	for i, p := range mp.providers {
		mp.m.discoveryRunning.WithLabelValues(p.name()).Set(1)
		wg.Go(func() { superviseProvider(ctx, i, p, events) })
	}

	var sent []string // last list sent on out
	var failures []error
	for running := len(mp.providers); running > 0; {
		var ev providerEvent
		select {
		case <-ctx.Done():
			return nil
		case ev = <-events:
		}
		name := mp.providers[ev.index].name()
		if ev.done {
			running--
			// An end caused by cancellation is shutdown, not a failure.
			if ctx.Err() != nil {
				continue
			}
			mp.m.discoveryRunning.WithLabelValues(name).Set(0)
			if ev.err == nil {
				mp.log.Warn("discovery provider stopped", "provider", name)
				continue
			}
			mp.m.discoveryErrors.WithLabelValues(name).Inc()
			mp.log.Warn("discovery provider failed", "provider", name, "err", ev.err)
			failures = append(failures, fmt.Errorf("%s provider: %w", name, ev.err))
			continue
		}
		mp.m.discoveryUpdates.WithLabelValues(name).Inc()
		merged := mp.record(name, ev.endpoints)
		if len(merged) == 0 || slices.Equal(merged, sent) {
			continue
		}
		select {
		case out <- slices.Clone(merged):
		case <-ctx.Done():
			return nil
		}
		sent = merged
		mp.log.Debug("sent merged endpoints", "endpoints", merged)
	}
	if len(failures) == len(mp.providers) {
		return fmt.Errorf("all discovery providers failed: %w", errors.Join(failures...))
	}
	// A provider returned nil before cancellation, which breaks the provider
	// contract but is no failure. The list already sent stays valid, so hold
	// it the way the static provider does.
	<-ctx.Done()
	return nil
}

// superviseProvider runs p, relays its lists tagged with index to the merge
// loop, and reports how its run ended. It owns the relay goroutine and waits
// for it, so every list p sent is relayed before the end is reported.
func superviseProvider(ctx context.Context, index int, p provider, events chan<- providerEvent) {
	lists := make(chan []string)
	var wg sync.WaitGroup
	wg.Go(func() { relayLists(ctx, index, lists, events) })
	err := p.run(ctx, lists)
	close(lists) // run has returned, so nothing sends on lists any more
	wg.Wait()
	select {
	case events <- providerEvent{index: index, done: true, err: err}:
	case <-ctx.Done():
	}
}

// relayLists forwards lists to the merge loop until the provider's run
// returns. Once ctx is done it drops them instead, so a provider that sends
// during shutdown never blocks.
func relayLists(ctx context.Context, index int, lists <-chan []string, events chan<- providerEvent) {
	for endpoints := range lists {
		select {
		case events <- providerEvent{index: index, endpoints: endpoints}:
		case <-ctx.Done():
		}
	}
}

// unionEndpoints returns the sorted, deduplicated union of lists.
func unionEndpoints(lists [][]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}

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
// known API server. It returns an error wrapping errNoKubeCredentials when
// there are no credentials to connect with.
func newKubernetesProvider(cfg kubeProviderConfig, log *slog.Logger, m *metrics) (provider, error) {
	restConfig, err := kubeRESTConfig(cfg, defaultServiceAccountDir)
	if err != nil {
		return nil, err
	}
	client, err := newRESTSliceClient(restConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return newKubeWatcher(client, log, m, rand.Float64), nil
}

// sliceClient lists and watches discovery/v1 EndpointSlices: all the
// kubernetes provider asks of the API.
type sliceClient interface {
	List(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error)
	Watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// restSliceClient is a REST client for the discovery.k8s.io/v1 group alone.
// client-go's generated clientset would work as well, but it links a typed
// client for every API group, which costs about 12 MB of binary and several
// MiB of memory in every node's copy of this daemon.
type restSliceClient struct {
	rc     *rest.RESTClient
	hc     *http.Client // rc's; see dropIdle
	params runtime.ParameterCodec
}

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
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, err
	}
	rc, err := rest.RESTClientForConfigAndClient(&c, hc)
	if err != nil {
		return nil, err
	}
	return &restSliceClient{rc: rc, hc: hc, params: runtime.NewParameterCodec(scheme)}, nil
}

// dropIdle closes the client's idle connections after a failed request, so
// that the next one dials the local listener afresh and the proxy picks an
// upstream for it again. Otherwise every retry would go down the same
// HTTP/2 connection to the same API server for as long as it answers
// errors (cut off from etcd, overloaded), however many others are fine.
func (c *restSliceClient) dropIdle() {
	rt := c.hc.Transport
	for rt != nil {
		if ci, ok := rt.(interface{ CloseIdleConnections() }); ok {
			ci.CloseIdleConnections()
			return
		}
		w, ok := rt.(interface{ WrappedRoundTripper() http.RoundTripper })
		if !ok {
			return
		}
		rt = w.WrappedRoundTripper()
	}
}

// errWatchNotOpened is a Watch call that failed before a stream opened:
// the connection closed or timed out during the request. client-go reports
// it as a watch that opened and closed at once, without the error.
var errWatchNotOpened = errors.New("watch request failed before a stream opened (connection closed or timed out)")

// List and Watch make one request each: client-go would otherwise retry a
// failed request up to 10 times a second apart, hidden from the caller,
// and the backoff the watcher keeps between its requests would not hold.
func (c *restSliceClient) List(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	list := &discoveryv1.EndpointSliceList{}
	err := c.rc.Get().MaxRetries(0).Namespace(namespace).Resource("endpointslices").
		VersionedParams(&opts, c.params).Do(ctx).Into(list)
	if err != nil {
		c.dropIdle()
		return nil, err
	}
	return list, nil
}

func (c *restSliceClient) Watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	w, err := c.rc.Get().MaxRetries(0).Namespace(namespace).Resource("endpointslices").
		VersionedParams(&opts, c.params).Watch(ctx)
	if err != nil {
		c.dropIdle()
		return nil, err
	}
	if _, ok := w.(*watch.StreamWatcher); !ok {
		w.Stop() // the empty watch client-go returns for a failed request
		c.dropIdle()
		return nil, errWatchNotOpened
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
		token := filepath.Join(serviceAccountDir, "token")
		ca := filepath.Join(serviceAccountDir, "ca.crt")
		for _, file := range []string{token, ca} {
			_, err := os.Stat(file)
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w: no kubeconfig and %w", errNoKubeCredentials, err)
			}
			if err != nil {
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
	if restConfig.ServerName == "" {
		restConfig.ServerName = cfg.ServerName
	}
	// The client must reach the local listener directly: a nil proxy URL
	// means no proxy. Without this, HTTPS_PROXY would apply whenever the
	// listener is not on a loopback address.
	restConfig.Proxy = http.ProxyURL(nil)
	restConfig.UserAgent = "extractedprism"
	return restConfig, nil
}

const (
	// The default/kubernetes Service names the API servers; its
	// EndpointSlices carry this label.
	kubeServiceNamespace = "default"
	kubeServiceSelector  = discoveryv1.LabelServiceName + "=kubernetes"
	kubeServicePortName  = "https"

	backoffInitial = time.Second
	backoffMax     = 30 * time.Second
	backoffJitter  = 0.25 // each delay gets up to this fraction on top

	// longWatch is how long a watch must stay open to count as healthy
	// for the reconnect rules in nextReconnectStep.
	longWatch = 30 * time.Second

	// The server ends each watch after 5 to 10 minutes, so watches are
	// refreshed and the watches of many nodes do not restart together.
	watchTimeoutMin = 5 * time.Minute
	// watchDeadlineGrace bounds a stream that goes silent without the
	// server ending it: the client gives up this long after the server
	// should have closed it.
	watchDeadlineGrace = 30 * time.Second
	listTimeout        = 30 * time.Second
)

// watchBackoff is the reconnect delay of the kubernetes provider: 1 s
// doubling up to 30 s, each delay plus up to 25 % random jitter on top. The
// zero value with rand set is ready to use.
type watchBackoff struct {
	rand func() float64 // in [0, 1)
	next time.Duration  // base of the next delay; zero means backoffInitial
}

// reset makes the next delay start from backoffInitial again.
func (b *watchBackoff) reset() { b.next = 0 }

// delay returns the next delay and doubles the one after it.
func (b *watchBackoff) delay() time.Duration {
	d := max(b.next, backoffInitial)
	b.next = min(2*d, backoffMax)
	return d + time.Duration(float64(d)*backoffJitter*b.rand())
}

// watchEnd is how one watch attempt ended.
type watchEnd int

const (
	// endClosed: the result channel closed without an error event from the
	// API server, as on a server-side timeout or a dropped connection (see
	// streamBroke). Not an error.
	endClosed watchEnd = iota
	// endError: the Watch call failed or an error event arrived, other
	// than 410 Gone.
	endError
	// endGone: 410 Gone, from the Watch call or an error event. The
	// resource version was compacted away and the cache may have missed
	// events.
	endGone
)

// reconnectStep is what the kubernetes provider does after a watch attempt.
type reconnectStep struct {
	relist       bool // rebuild the cache with a full List first
	resetBackoff bool // the next delay is 1 s again
	wait         bool // sleep the backoff before the next Watch
}

// nextReconnectStep encodes the reconnect rules of the spec ("Two-level
// endpoint discovery", "Endpoint discovery"). long means the watch was open
// for at least longWatch. rewatch means this attempt was the immediate re-watch
// after a long watch closed without an error; it covers the Watch call and
// the stream that call opened. A long watch shows the path to the API
// server was healthy, so every rule that follows one restarts the backoff.
func nextReconnectStep(end watchEnd, long, rewatch bool) reconnectStep {
	switch {
	case end == endGone && (long || rewatch):
		// "After a successful re-list, the next watch starts at once if
		// the 410 ended a watch that was open for at least 30s, or hit the
		// re-watch right after such a watch closed without an error."
		return reconnectStep{relist: true, resetBackoff: true}
	case end == endGone:
		// "On 410 Gone (etcd compaction), performs a full re-list to
		// rebuild the endpoint cache. [...] Otherwise it waits for the
		// backoff."
		return reconnectStep{relist: true, wait: true}
	case end == endClosed && long:
		// "A watch that stayed open for at least 30s and then closed
		// without an error is re-opened immediately."
		return reconnectStep{resetBackoff: true}
	case long || rewatch:
		// "Any other error after such a watch, except 410 Gone, starts the
		// backoff from 1s again."
		return reconnectStep{resetBackoff: true, wait: true}
	default:
		// "Reconnects with exponential backoff on Watch errors." A watch
		// that closed cleanly within 30 s backs off too, so an API server
		// that keeps ending streams at once is not hammered.
		return reconnectStep{wait: true}
	}
}

// watchResult describes one watch attempt.
type watchResult struct {
	end  watchEnd
	open time.Duration // how long the stream was open; zero if the Watch call failed
	err  error         // why, for endError and endGone
}

// kubeWatcher is the kubernetes provider. It lists the EndpointSlices of the
// default/kubernetes Service, watches them from the list's resource version,
// and sends the ready API server addresses they name whenever they change.
// It retries failed calls forever and never fails for good.
//
// It counts discovery_errors_total{provider="kubernetes"} for failed List and
// Watch calls and for watch error events, but not for 410 Gone, which is
// routine expiry, nor for a stream ending. It does not count updates; the
// merged provider does (see mergedProvider).
type kubeWatcher struct {
	client sliceClient
	log    *slog.Logger
	errors prometheus.Counter
	rand   func() float64 // jitter source in [0, 1)

	// The fields below belong to the goroutine calling run; run must not
	// be called concurrently.
	cache           map[string]*discoveryv1.EndpointSlice // by slice name
	resourceVersion string                                // where the next Watch starts
	sent            []string                              // last list sent on out, never empty
	hasSent         bool                                  // sent is valid
	rejected        []string                              // what endpointsOf last left out, as warned of
	emptyWarned     bool                                  // the slices hold no endpoint, as warned of
	backoff         watchBackoff
}

// newKubeWatcher returns the kubernetes provider on client. log is used as
// given; the caller names the component. jitter returns a value in [0, 1);
// it spreads the backoff delays and watch timeouts.
func newKubeWatcher(client sliceClient, log *slog.Logger, m *metrics, jitter func() float64) *kubeWatcher {
	return &kubeWatcher{
		client: client,
		log:    log,
		errors: m.discoveryErrors.WithLabelValues(kubeProviderName),
		rand:   jitter,
	}
}

func (w *kubeWatcher) name() string { return kubeProviderName }

// run lists, then watches until ctx is done, following nextReconnectStep
// after every watch attempt. It returns nil once ctx is done and never
// returns an error: failures are retried, counted and logged.
func (w *kubeWatcher) run(ctx context.Context, out chan<- []string) error {
	w.cache = nil
	w.resourceVersion = ""
	w.sent, w.hasSent = nil, false
	w.backoff = watchBackoff{rand: w.rand}

	if !w.listUntilDone(ctx, out) {
		return nil
	}
	// rewatch marks the attempt that re-opens a long watch which closed
	// cleanly; nextReconnectStep treats what ends it like an end of the long
	// watch itself.
	rewatch := false
	for {
		res := w.watchOnce(ctx, out, rewatch)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // cancellation is shutdown, not a provider failure
		}
		switch res.end {
		case endError:
			w.errors.Inc()
			w.log.Warn("endpointslice watch failed", "err", res.err, "open", res.open)
		case endGone:
			w.log.Info("endpointslice resource version expired, re-listing", "err", res.err, "open", res.open)
		case endClosed:
			w.log.Debug("endpointslice watch closed", "open", res.open)
		}
		long := res.open >= longWatch
		next := nextReconnectStep(res.end, long, rewatch)
		rewatch = res.end == endClosed && long
		if next.resetBackoff {
			w.backoff.reset()
		}
		if next.relist && !w.listUntilDone(ctx, out) {
			return nil
		}
		if next.wait {
			d := w.backoff.delay()
			w.log.Info("backing off before the next endpointslice watch", "delay", d)
			if !sleepCtx(ctx, d) {
				return nil
			}
		}
	}
}

// listUntilDone lists the slices, retrying with the backoff until a List
// succeeds, then sends the endpoints if they changed. It returns false once
// ctx is done.
func (w *kubeWatcher) listUntilDone(ctx context.Context, out chan<- []string) bool {
	for {
		err := w.list(ctx)
		if err == nil {
			return w.publish(ctx, out)
		}
		if ctx.Err() != nil {
			return false
		}
		w.errors.Inc()
		d := w.backoff.delay()
		w.log.Warn("endpointslice list failed", "err", err, "retry_in", d)
		if !sleepCtx(ctx, d) {
			return false
		}
	}
}

// list replaces the cache and the resource version with a fresh List.
func (w *kubeWatcher) list(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	list, err := w.client.List(ctx, kubeServiceNamespace, metav1.ListOptions{
		LabelSelector: kubeServiceSelector,
	})
	if err != nil {
		return fmt.Errorf("list endpointslices: %w", err)
	}
	w.cache = make(map[string]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		w.cache[list.Items[i].Name] = &list.Items[i]
	}
	w.resourceVersion = list.ResourceVersion
	w.log.Debug("listed endpointslices", "slices", len(list.Items), "resourceVersion", w.resourceVersion)
	return nil
}

// watchOnce opens one watch from the current resource version and applies
// its events until it ends. routine marks the re-open after a normal close,
// which is logged at Debug only.
func (w *kubeWatcher) watchOnce(ctx context.Context, out chan<- []string, routine bool) watchResult {
	timeout := watchTimeoutMin + time.Duration(float64(watchTimeoutMin)*w.rand())
	timeoutSeconds := int64(timeout / time.Second)
	ctx, cancel := context.WithTimeout(ctx, timeout+watchDeadlineGrace)
	defer cancel()
	watcher, err := w.client.Watch(ctx, kubeServiceNamespace, metav1.ListOptions{
		LabelSelector:       kubeServiceSelector,
		ResourceVersion:     w.resourceVersion,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      &timeoutSeconds,
	})
	if err != nil {
		return failedWatch(err, 0)
	}
	defer watcher.Stop()
	opened := time.Now()
	level := slog.LevelInfo
	if routine {
		level = slog.LevelDebug
	}
	w.log.Log(ctx, level, "watching endpointslices", "resourceVersion", w.resourceVersion)

	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			// Cancellation, or the client deadline on a silent stream.
			return watchResult{end: endClosed, open: time.Since(opened)}
		case ev, ok = <-watcher.ResultChan():
		}
		if !ok {
			return watchResult{end: endClosed, open: time.Since(opened)}
		}
		if ev.Type == watch.Error {
			if ctx.Err() != nil {
				// The stream reports its own cancellation as an error.
				return watchResult{end: endClosed, open: time.Since(opened)}
			}
			if streamBroke(ev.Object) {
				w.log.Debug("watch stream broke", "err", apierrors.FromObject(ev.Object))
				return watchResult{end: endClosed, open: time.Since(opened)}
			}
			return failedWatch(apierrors.FromObject(ev.Object), time.Since(opened))
		}
		if w.apply(ev) && !w.publish(ctx, out) {
			return watchResult{end: endClosed, open: time.Since(opened)}
		}
	}
}

// clientWatchDecoding is the cause type client-go gives the error event it
// sends when it cannot read the watch stream (rest.Request.newStreamWatcher).
const clientWatchDecoding = "ClientWatchDecoding"

// lostConnection is in the message of such an event when the HTTP/2
// connection went away under the stream: golang.org/x/net/http2's "http2:
// client connection lost", which client-go's HTTP/2 health check causes
// when a connection goes silent, and "http2: client connection force
// closed".
const lostConnection = "http2: client connection "

// streamBroke reports whether obj, the object of a watch error event, is
// client-go's report that the stream's connection was lost, rather than an
// error the API server sent. client-go ends most dropped connections
// quietly but reports these as an error event; the spec counts a dropped
// connection as a stream ending, not as an error. Other read errors, such as
// an event that does not decode, stay errors: they would recur on the next
// watch from the same resource version.
func streamBroke(obj runtime.Object) bool {
	st, ok := obj.(*metav1.Status)
	if !ok || st.Details == nil {
		return false
	}
	return slices.ContainsFunc(st.Details.Causes, func(c metav1.StatusCause) bool {
		return c.Type == clientWatchDecoding && strings.Contains(c.Message, lostConnection)
	})
}

// failedWatch classifies a failed Watch call or a watch error event.
func failedWatch(err error, open time.Duration) watchResult {
	end := endError
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		end = endGone
	}
	return watchResult{end: end, open: open, err: err}
}

// apply updates the cache and resource version from a watch event and
// reports whether the cache changed. A bookmark carries only a newer
// resource version, which keeps the next watch from starting so far back
// that it fails with 410 Gone.
func (w *kubeWatcher) apply(ev watch.Event) bool {
	slice, ok := ev.Object.(*discoveryv1.EndpointSlice)
	if !ok {
		w.log.Debug("ignoring watch event", "type", ev.Type, "object", fmt.Sprintf("%T", ev.Object))
		return false
	}
	if slice.ResourceVersion != "" {
		w.resourceVersion = slice.ResourceVersion
	}
	switch ev.Type {
	case watch.Added, watch.Modified:
		w.cache[slice.Name] = slice
		return true
	case watch.Deleted:
		delete(w.cache, slice.Name)
		return true
	default:
		return false
	}
}

// publish recomputes the endpoints from every cached slice, so a change to
// one slice never loses the endpoints of another, and sends them if they
// differ from the last list sent. It returns false once ctx is done.
func (w *kubeWatcher) publish(ctx context.Context, out chan<- []string) bool {
	endpoints, rejected := endpointsOf(w.cache)
	if !slices.Equal(rejected, w.rejected) {
		w.rejected = rejected
		if len(rejected) > 0 {
			w.log.Warn("ignoring discovered slices or addresses that cannot be API servers", "count", len(rejected), "ignored", rejected[:min(len(rejected), 8)])
		}
	}
	if len(endpoints) == 0 {
		// An empty list still came from a live API server, the one
		// that answered: most likely every API server restarted at
		// once, each taking itself out of the slice on the way down.
		// Sent on, it would leave only the static endpoints, the
		// discovered and cached ones dropped; the last list stays, and
		// health checks judge its upstreams.
		if !w.emptyWarned {
			w.emptyWarned = true
			w.log.Warn("kubernetes endpoints empty: keeping the last endpoint list until they are back", "slices", len(w.cache))
		}
		return true
	}
	w.emptyWarned = false
	if w.hasSent && slices.Equal(endpoints, w.sent) {
		return true
	}
	select {
	case out <- endpoints:
	case <-ctx.Done():
		return false
	}
	w.sent, w.hasSent = endpoints, true
	w.log.Info("kubernetes endpoints changed", "endpoints", endpoints)
	return true
}

// endpointsOf returns the sorted, deduplicated addresses of the ready
// endpoints in the slices, each with its own slice's port, and what it left
// out, each with the reason: whole slices (not IP addresses, or no port to
// use), addresses that are unusable (see unusableAddr) or over
// maxDiscoveredEndpoints. The endpoints are never nil.
func endpointsOf(cache map[string]*discoveryv1.EndpointSlice) (endpoints, rejected []string) {
	endpoints = []string{}
	for name, slice := range cache {
		// FQDN slices do not name API server addresses.
		if slice.AddressType != discoveryv1.AddressTypeIPv4 && slice.AddressType != discoveryv1.AddressTypeIPv6 {
			rejected = append(rejected, "slice "+quoteShort(name)+" (address type "+quoteShort(string(slice.AddressType))+")")
			continue
		}
		port, ok := slicePort(slice.Ports)
		if !ok {
			rejected = append(rejected, "slice "+quoteShort(name)+" (no usable port: none named https, nor a single one)")
			continue
		}
		for _, ep := range slice.Endpoints {
			// Nil means unknown, which the EndpointSlice API says to
			// treat as ready.
			if ready := ep.Conditions.Ready; ready == nil || *ready {
				endpoints, rejected = addEndpoints(endpoints, rejected, ep.Addresses, port)
			}
		}
	}
	slices.Sort(endpoints)
	endpoints = slices.Compact(endpoints)
	if len(endpoints) > maxDiscoveredEndpoints {
		for _, e := range endpoints[maxDiscoveredEndpoints:] {
			rejected = append(rejected, e+" (over the limit of "+strconv.Itoa(maxDiscoveredEndpoints)+")")
		}
		endpoints = endpoints[:maxDiscoveredEndpoints]
	}
	slices.Sort(rejected)
	return endpoints, slices.Compact(rejected)
}

// addEndpoints appends the usable addresses among addrs, with port, to
// endpoints, and the unusable ones to rejected with the reason; it skips
// what is not an IP address.
func addEndpoints(endpoints, rejected, addrs []string, port string) ([]string, []string) {
	for _, addr := range addrs {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			continue
		}
		// Unmap ::ffff:a.b.c.d, so a server matches its static
		// --endpoints spelling and is not listed twice.
		ip = ip.Unmap()
		if why := unusableAddr(ip); why != "" {
			rejected = append(rejected, fmt.Sprintf("%s (%s)", net.JoinHostPort(ip.String(), port), why))
			continue
		}
		endpoints = append(endpoints, net.JoinHostPort(ip.String(), port))
	}
	return endpoints, rejected
}

// maxDiscoveredEndpoints bounds the upstreams taken from discovery or the
// endpoint cache. A control plane has a handful of API servers; each
// upstream costs a probe goroutine, its metric series and a health check
// every --health-interval, so a slice listing thousands of addresses must
// not make thousands of them.
const maxDiscoveredEndpoints = 64

// unusableAddr says why ip cannot be an API server address learnt from
// discovery or the endpoint cache, or returns "" if it can be: the
// unspecified, link-local and multicast addresses, the IPv4 broadcast
// address, and addresses with an IPv6 zone, which only name a link of this
// node. (kube-apiserver refuses unspecified, loopback, link-local and
// link-local multicast addresses in an EndpointSlice; one that does not
// validate them, or the cache, could still hand them over.) Static
// --endpoints are the operator's own and are not checked. Loopback
// addresses pass: a validated slice cannot hold them, and the one that
// would harm, this proxy's own listener, the daemon drops from every
// source (see withoutOwnListener).
func unusableAddr(ip netip.Addr) string {
	switch {
	case ip.IsUnspecified():
		return "unspecified address"
	case ip.IsLinkLocalUnicast():
		return "link-local address"
	case ip.IsMulticast():
		return "multicast address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast address"
	case ip.Zone() != "":
		return "address with an IPv6 zone"
	}
	return ""
}

// slicePort returns the slice's API server port: the port named "https", or
// the only port when there is exactly one. A port is never borrowed from
// elsewhere: a wrong port would send traffic to something that is not an API
// server.
func slicePort(ports []discoveryv1.EndpointPort) (string, bool) {
	valid := func(p discoveryv1.EndpointPort) bool {
		return p.Port != nil && *p.Port > 0 && *p.Port <= 65535
	}
	for _, p := range ports {
		if p.Name != nil && *p.Name == kubeServicePortName && valid(p) {
			return strconv.Itoa(int(*p.Port)), true
		}
	}
	if len(ports) == 1 && valid(ports[0]) {
		return strconv.Itoa(int(*ports[0].Port)), true
	}
	return "", false
}

// cacheProviderName labels the endpoint cache in metrics and /upstreams.
const cacheProviderName = "cache"

// endpointCache is the file the last discovered endpoint list is kept in
// (--endpoint-cache-file), so a node restarted while its static endpoints
// are gone can still reach the API servers discovery last saw.
type endpointCache struct {
	path string
	log  *slog.Logger
}

// cacheFile is the on-disk format.
type cacheFile struct {
	Version   int       `json:"version"`
	Written   time.Time `json:"written"`
	Endpoints []string  `json:"endpoints"`
}

const cacheVersion = 1

// load reads and validates the cache. A missing file is not an error.
func (c *endpointCache) load() ([]string, error) {
	b, err := readAtMost(c.path, maxCacheBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read endpoint cache: %w", err)
	}
	var f cacheFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("parse endpoint cache %s: %w", c.path, err)
	}
	if f.Version != cacheVersion {
		return nil, fmt.Errorf("endpoint cache %s: version %d, want %d", c.path, f.Version, cacheVersion)
	}
	if len(f.Endpoints) > maxDiscoveredEndpoints {
		return nil, fmt.Errorf("endpoint cache %s: %d endpoints, more than discovery ever keeps (%d)", c.path, len(f.Endpoints), maxDiscoveredEndpoints)
	}
	eps := make([]string, 0, len(f.Endpoints))
	for _, e := range f.Endpoints {
		n, err := cachedEndpoint(e)
		if err != nil {
			return nil, fmt.Errorf("endpoint cache %s: %w", c.path, err)
		}
		eps = append(eps, n)
	}
	return eps, nil
}

// maxCacheBytes bounds the endpoint cache file: maxDiscoveredEndpoints
// entries take a few KiB.
const maxCacheBytes = 64 << 10

// readAtMost reads the file at path, failing if it is larger than limit.
func readAtMost(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path) //nolint:gosec // the operator names this file
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

// cachedEndpoint checks one endpoint read from the cache and returns it
// normalized. The cache holds only what discovery found, so anything
// discovery would not have kept is refused: a hostname, or an address
// unusableAddr refuses.
func cachedEndpoint(e string) (string, error) {
	n, err := normalizeEndpoint(e)
	if err != nil {
		return "", err
	}
	host, _, _ := net.SplitHostPort(n)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("endpoint %s: a hostname, which discovery never yields", quoteShort(e))
	}
	if why := unusableAddr(ip); why != "" {
		return "", fmt.Errorf("endpoint %s: %s, which discovery never yields", quoteShort(e), why)
	}
	return n, nil
}

// store writes endpoints atomically: a temporary file in the same directory,
// fsynced, renamed over the cache, and the directory fsynced, so a crash at
// any point leaves either the old cache or the new one, never a torn file.
func (c *endpointCache) store(endpoints []string) error {
	b, err := json.Marshal(cacheFile{Version: cacheVersion, Written: time.Now().UTC(), Endpoints: endpoints})
	if err != nil {
		return fmt.Errorf("encode endpoint cache: %w", err)
	}
	dir := filepath.Dir(c.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(c.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write endpoint cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write endpoint cache: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("sync endpoint cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write endpoint cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.path); err != nil { //nolint:gosec // the operator names this file
		return fmt.Errorf("replace endpoint cache: %w", err)
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir) //nolint:gosec // the directory of the operator-named cache file
	if err != nil {
		return fmt.Errorf("sync endpoint cache directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync endpoint cache directory: %w", err)
	}
	return nil
}

// cacheProvider offers the cached list as the lowest-priority source: the
// merged provider drops it once the kubernetes provider has answered.
type cacheProvider struct {
	endpoints []string
}

// newCacheProvider loads the cache. A corrupt or unreadable cache is logged
// and ignored, never fatal: the daemon then starts on static endpoints.
func newCacheProvider(c *endpointCache) provider {
	eps, err := c.load()
	if err != nil {
		c.log.Warn("endpoint cache ignored", "path", c.path, "err", err)
	} else if len(eps) > 0 {
		c.log.Info("endpoint cache loaded", "path", c.path, "endpoints", eps)
	}
	return &cacheProvider{endpoints: eps}
}

func (p *cacheProvider) name() string         { return cacheProviderName }
func (p *cacheProvider) initial() []string    { return p.endpoints }
func (p *cacheProvider) supersededBy() string { return kubeProviderName }

func (p *cacheProvider) run(ctx context.Context, out chan<- []string) error {
	if len(p.endpoints) > 0 {
		select {
		case out <- p.endpoints:
		case <-ctx.Done():
			return nil
		}
	}
	<-ctx.Done()
	return nil
}
