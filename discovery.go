package main

// Endpoint discovery: where the load balancer's upstream list comes from.
//
// The static --endpoints list is known at start and needs no cluster
// access, so the proxy works before the CNI plugin does. The kubernetes
// provider watches the EndpointSlices of the default/kubernetes Service
// through the daemon's own listener and follows control plane membership
// changes. The merged provider keeps each source's latest list and tells
// the run loop, on one notify channel, that their union may have changed.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// provider is a source of endpoint lists that runs until ctx is done,
// handing each new list to publish. An endpoint is "host:port", an IP host
// spelled as netip prints it, so that two sources naming one address give
// one string. A list given to publish is never modified afterwards.
type provider interface {
	name() string // labels the provider's metrics and log lines
	// run returns nil once ctx is done; an error means it failed for good.
	run(ctx context.Context, publish func([]string)) error
}

// The sources of endpoint lists, as metrics and /upstreams name them.
const (
	staticProviderName = "static"
	cacheProviderName  = "cache"
	kubeProviderName   = "kubernetes"
)

// mergedProvider keeps the latest list of every source: the static
// endpoints, the endpoint cache until the kubernetes provider has published
// (the cache stands in for discovery until discovery answers), and the
// lists of the providers it runs. It counts discovery_updates_total for
// every list, and sets discovery_running as the providers it runs start and
// end (the kubernetes provider also clears it while its credentials fail:
// kubeWatcher.running).
type mergedProvider struct {
	log       *slog.Logger
	m         *metrics
	providers []provider
	order     []string // every source's name, in the order /upstreams lists them

	// notify holds a token while the union may have changed since the run
	// loop last read it.
	notify chan struct{}

	mu    sync.Mutex // guards lists
	lists map[string][]string
}

// newMergedProvider returns a merged provider over the static list, the
// cached one (nil without a cache) and providers. It creates every metric
// series at once: the daemon builds it before anything serves.
func newMergedProvider(log *slog.Logger, m *metrics, static, cached []string, providers ...provider) *mergedProvider {
	mp := &mergedProvider{log: log, m: m, providers: providers, order: []string{staticProviderName}, notify: make(chan struct{}, 1), lists: map[string][]string{}}
	mp.publish(staticProviderName, static)
	if len(cached) > 0 {
		mp.order = append(mp.order, cacheProviderName)
		mp.publish(cacheProviderName, cached)
	}
	for _, name := range mp.order {
		m.discoverySeries(name)
		m.discoveryRunning.WithLabelValues(name).Set(1)
	}
	for _, p := range providers {
		mp.order = append(mp.order, p.name())
		m.discoverySeries(p.name())
	}
	return mp
}

// publish records list as the latest of source name and wakes the run loop.
func (mp *mergedProvider) publish(name string, list []string) {
	mp.m.discoveryUpdates.WithLabelValues(name).Inc()
	mp.mu.Lock()
	mp.lists[name] = list
	mp.mu.Unlock()
	select {
	case mp.notify <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// endpoints returns the sorted union of the lists that count (see
// sources).
func (mp *mergedProvider) endpoints() []string {
	return slices.Sorted(maps.Keys(mp.sources()))
}

// discovered is the kubernetes provider's latest list, sorted; nil if it
// has not published.
func (mp *mergedProvider) discovered() []string {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	return mp.lists[kubeProviderName]
}

// sources maps each endpoint of the union to the sources that list it, for
// /upstreams. The cache's list counts only until the kubernetes provider
// has published.
func (mp *mergedProvider) sources() map[string][]string {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	_, discovered := mp.lists[kubeProviderName]
	out := map[string][]string{}
	for _, name := range mp.order {
		if name == cacheProviderName && discovered {
			continue
		}
		for _, addr := range mp.lists[name] {
			if !slices.Contains(out[addr], name) {
				out[addr] = append(out[addr], name)
			}
		}
	}
	return out
}

// run runs every provider until ctx is done and waits for them. A provider
// that ends early is counted and logged, and its last list stays in the
// union, while the others and the static endpoints go on.
func (mp *mergedProvider) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range mp.providers {
		wg.Go(func() { mp.runProvider(ctx, p) })
	}
	wg.Wait()
}

// runProvider runs p, with discovery_running 1 until it ends before ctx is
// done.
func (mp *mergedProvider) runProvider(ctx context.Context, p provider) {
	name := p.name()
	mp.m.discoveryRunning.WithLabelValues(name).Set(1)
	err := p.run(ctx, func(list []string) { mp.publish(name, list) })
	if ctx.Err() != nil {
		return // shutdown, not a failure
	}
	mp.m.discoveryRunning.WithLabelValues(name).Set(0)
	if err == nil {
		mp.log.Warn("discovery provider stopped", "provider", name)
		return
	}
	mp.m.discoveryErrors.WithLabelValues(name).Inc()
	mp.log.Warn("discovery provider failed", "provider", name, "err", err)
}

// sliceClient lists and watches discovery/v1 EndpointSlices: all the
// kubernetes provider asks of the API.
type sliceClient interface {
	List(ctx context.Context, namespace string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error)
	Watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
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

// kubeWatcher is the kubernetes provider. It lists the EndpointSlices of the
// default/kubernetes Service, watches them from the list's resource version,
// and publishes the ready API server addresses they name when they change.
// It retries failed calls forever and never fails for good.
//
// It counts discovery_errors_total{provider="kubernetes"} for failed List and
// Watch calls and for watch error events, but not for 410 Gone, which is
// routine expiry, nor for a stream ending. It does not count updates; the
// merged provider does (see mergedProvider).
type kubeWatcher struct {
	client sliceClient // nil until connect succeeds
	// connect builds the client; run retries it while client is nil,
	// when the credentials did not load at start (awaitClient).
	connect func() (sliceClient, error)
	log     *slog.Logger
	errors  prometheus.Counter
	// running is discovery_running{provider="kubernetes"}. The merged
	// provider sets it when run starts and ends; run clears it while the
	// credentials do not load or the API server refuses them, and sets it
	// again on the next call that succeeds.
	running prometheus.Gauge
	rand    func() float64 // jitter source in [0, 1)

	// The fields below belong to the goroutine calling run; run must not
	// be called concurrently.
	cache           map[string]*discoveryv1.EndpointSlice // by slice name
	resourceVersion string                                // where the next Watch starts
	publishFn       func([]string)                        // run's publish
	sent            []string                              // last list published; nil before the first
	rejected        []string                              // what endpointsOf last left out, as warned of
	emptyWarned     bool                                  // the slices hold no endpoint, as warned of
	backoff         backoff                               // see delay
}

// newKubeWatcher returns the kubernetes provider on client. log is used as
// given; the caller names the component. jitter returns a value in [0, 1);
// it spreads the backoff delays and watch timeouts.
func newKubeWatcher(client sliceClient, log *slog.Logger, m *metrics, jitter func() float64) *kubeWatcher {
	return &kubeWatcher{client: client, log: log, errors: m.discoveryErrors.WithLabelValues(kubeProviderName),
		running: m.discoveryRunning.WithLabelValues(kubeProviderName), rand: jitter}
}

func (w *kubeWatcher) name() string { return kubeProviderName }

// run lists, then watches until ctx is done, following nextReconnectStep
// after every watch attempt. It returns nil once ctx is done and never
// returns an error: failures are retried, counted and logged.
func (w *kubeWatcher) run(ctx context.Context, publish func([]string)) error {
	w.publishFn = publish
	w.backoff = backoff{first: backoffInitial, limit: backoffMax}
	defer w.closeIdle()
	if !w.awaitClient(ctx) || !w.listUntilDone(ctx) {
		return nil
	}
	// rewatch marks the attempt that re-opens a long watch which closed
	// cleanly; nextReconnectStep treats what ends it like an end of the
	// long watch itself.
	rewatch := false
	for {
		open, err := w.watchOnce(ctx, rewatch)
		if ctx.Err() != nil {
			return nil // cancellation is shutdown, not a provider failure
		}
		end := endClosed
		switch {
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			end = endGone
			w.log.Info("endpointslice resource version expired, re-listing", "err", err, "open", open)
		case err != nil:
			end = endError
			w.errors.Inc()
			w.logFailure("endpointslice watch failed", err, "open", open)
		default:
			w.log.Debug("endpointslice watch closed", "open", open)
		}
		long := open >= longWatch
		next := nextReconnectStep(end, long, rewatch)
		rewatch = end == endClosed && long
		if next.resetBackoff {
			w.backoff.reset()
		}
		if next.relist && !w.listUntilDone(ctx) {
			return nil
		}
		if next.wait {
			d := w.delay()
			w.log.Info("backing off before the next endpointslice watch", "delay", d)
			if !await(ctx.Done(), d) {
				return nil
			}
		}
	}
}

// delay returns the next reconnect delay: 1 s doubling up to 30 s, each
// delay plus up to 25 % random jitter on top.
func (w *kubeWatcher) delay() time.Duration {
	d := w.backoff.next()
	return d + time.Duration(float64(d)*backoffJitter*w.rand())
}

// closeIdle closes the client's idle connections once the provider stops:
// made through the daemon's own listener, each is a proxied connection,
// which a graceful stop (listeners.go) would wait for.
func (w *kubeWatcher) closeIdle() {
	if c, ok := w.client.(interface{ dropIdle() }); ok {
		c.dropIdle()
	}
}

// awaitClient builds the client if the credentials did not load at start,
// retrying with the backoff until they do. On a node that is joining the
// cluster, the kubelet writes its kubeconfig and client certificate only
// after its static pods, this daemon among them, have started. It returns
// false once ctx is done.
func (w *kubeWatcher) awaitClient(ctx context.Context) bool {
	for w.client == nil {
		client, err := w.connect()
		if err == nil {
			w.client = client
			w.backoff.reset()
			w.log.Info("kubernetes credentials loaded")
			break
		}
		w.errors.Inc()
		w.running.Set(0)
		d := w.delay()
		w.log.Error("kubernetes credentials do not load, retrying", "err", err, "retry_in", d)
		if !await(ctx.Done(), d) {
			return false
		}
	}
	return true
}

// logFailure logs a failed List or Watch. One the API server refused (401,
// 403) will fail until someone changes the credentials or the RBAC, so it
// is an error and clears discovery_running, which the
// ExtractedprismDiscoveryNotRunning alert watches; the daemon goes on with
// the static and cached endpoints meanwhile.
func (w *kubeWatcher) logFailure(msg string, err error, attrs ...any) {
	attrs = append(attrs, "err", err)
	switch {
	case apierrors.IsForbidden(err):
		w.running.Set(0)
		w.log.Error(msg, append(attrs, "hint", "these credentials may not list and watch endpointslices in default (deploy/node-discovery-rbac.yaml grants it to nodes)")...)
	case apierrors.IsUnauthorized(err):
		w.running.Set(0)
		w.log.Error(msg, append(attrs, "hint", "the API server does not accept these credentials (expired, or not signed by its client CA)")...)
	default:
		w.log.Warn(msg, attrs...)
	}
}

// listUntilDone lists the slices, retrying with the backoff until a List
// succeeds, then publishes the endpoints if they changed. It returns false
// once ctx is done.
func (w *kubeWatcher) listUntilDone(ctx context.Context) bool {
	for err := w.list(ctx); err != nil; err = w.list(ctx) {
		if ctx.Err() != nil {
			return false
		}
		w.errors.Inc()
		d := w.delay()
		w.logFailure("endpointslice list failed", err, "retry_in", d)
		if !await(ctx.Done(), d) {
			return false
		}
	}
	w.running.Set(1)
	w.publish()
	return true
}

// list replaces the cache and the resource version with a fresh List.
func (w *kubeWatcher) list(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	list, err := w.client.List(ctx, kubeServiceNamespace, metav1.ListOptions{LabelSelector: kubeServiceSelector})
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
// its events until it ends. It returns how long the stream was open (zero
// if the Watch call failed) and, unless the stream just closed, why it
// ended. routine marks the re-open after a normal close, which is logged at
// Debug only.
func (w *kubeWatcher) watchOnce(ctx context.Context, routine bool) (time.Duration, error) {
	timeout := watchTimeoutMin + time.Duration(float64(watchTimeoutMin)*w.rand())
	timeoutSeconds := int64(timeout / time.Second)
	ctx, cancel := context.WithTimeout(ctx, timeout+watchDeadlineGrace)
	defer cancel()
	watcher, err := w.client.Watch(ctx, kubeServiceNamespace, metav1.ListOptions{
		LabelSelector: kubeServiceSelector, ResourceVersion: w.resourceVersion, AllowWatchBookmarks: true, TimeoutSeconds: &timeoutSeconds,
	})
	if err != nil {
		return 0, err
	}
	defer watcher.Stop()
	w.running.Set(1)
	opened := time.Now()
	level := slog.LevelInfo
	if routine {
		level = slog.LevelDebug
	}
	w.log.Log(ctx, level, "watching endpointslices", "resourceVersion", w.resourceVersion)
	for {
		select {
		case <-ctx.Done(): // cancellation, or the client deadline on a silent stream
			return time.Since(opened), nil
		case ev, ok := <-watcher.ResultChan():
			switch {
			// An error event once ctx is done is the stream reporting its
			// own cancellation.
			case !ok || (ev.Type == watch.Error && ctx.Err() != nil):
				return time.Since(opened), nil
			case ev.Type != watch.Error:
				if w.apply(ev) {
					w.publish()
				}
			case streamBroke(apierrors.FromObject(ev.Object)):
				w.log.Debug("watch stream broke", "err", apierrors.FromObject(ev.Object))
				return time.Since(opened), nil
			default:
				return time.Since(opened), apierrors.FromObject(ev.Object)
			}
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

// streamBroke reports whether err, from a watch error event, is client-go's
// report that the stream's connection was lost, rather than an error the
// API server sent. client-go ends most dropped connections quietly but
// reports these as an error event; the spec counts a dropped connection as
// a stream ending, not as an error. Other read errors, such as an event
// that does not decode, stay errors: they would recur on the next watch
// from the same resource version.
func streamBroke(err error) bool {
	cause, ok := apierrors.StatusCause(err, clientWatchDecoding)
	return ok && strings.Contains(cause.Message, lostConnection)
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
	w.resourceVersion = cmp.Or(slice.ResourceVersion, w.resourceVersion)
	switch ev.Type {
	case watch.Added, watch.Modified:
		w.cache[slice.Name] = slice
	case watch.Deleted:
		delete(w.cache, slice.Name)
	default:
		return false
	}
	return true
}

// publish recomputes the endpoints from every cached slice, so a change to
// one slice never loses the endpoints of another, and publishes them if
// they differ from the last list published.
func (w *kubeWatcher) publish() {
	endpoints, rejected := endpointsOf(w.cache)
	if len(rejected) > 0 && !slices.Equal(rejected, w.rejected) {
		w.log.Warn("ignoring discovered slices or addresses that cannot be API servers", "count", len(rejected), "ignored", rejected[:min(len(rejected), 8)])
	}
	w.rejected = rejected
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
		return
	}
	w.emptyWarned = false
	if slices.Equal(endpoints, w.sent) { // never equal to nil: endpoints is not empty
		return
	}
	w.publishFn(endpoints)
	w.sent = endpoints
	w.log.Info("kubernetes endpoints changed", "endpoints", endpoints)
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
	for _, p := range ports {
		named := p.Name != nil && *p.Name == kubeServicePortName
		if (named || len(ports) == 1) && p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
			return strconv.Itoa(int(*p.Port)), true
		}
	}
	return "", false
}
