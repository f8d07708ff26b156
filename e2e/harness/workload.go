package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/pki"
)

// Workload limits. Every loop stops when its context ends; these bound
// what happens before that.
const (
	shortEvery       = 100 * time.Millisecond
	shortTimeout     = 10 * time.Second
	shortMaxInFlight = 100
	writeEvery       = 500 * time.Millisecond
	writeTimeout     = 5 * time.Second
	watchRetryDelay  = 500 * time.Millisecond
)

// Workload is the client side of a scenario, all inside w1 and all through
// extractedprism: short requests (each on a fresh TLS connection, every
// 100 ms a GET /version and a quorum read), long-lived HTTP/2 watchers on
// ConfigMaps, and a writer that creates a ConfigMap every 500 ms.
type Workload struct {
	c         *Cluster
	namespace string
	pid       int // the daemon's, to read w1's socket table

	mu     sync.Mutex // guards shorts, quorums, writes
	shorts []ShortResult
	// quorums are the quorum reads: a LIST of the row's ConfigMaps with
	// limit=1 and no resourceVersion, a consistent read that needs etcd
	// quorum, where GET /version needs no etcd at all.
	quorums  []ShortResult
	writes   []WriteResult
	watchers []*Watcher

	loops sync.WaitGroup
	stop  context.CancelFunc // stops short requests and the writer
}

// ShortResult is one short request.
type ShortResult struct {
	Start time.Time
	Dur   time.Duration
	Err   string
}

// WriteResult is one ConfigMap create.
type WriteResult struct {
	Name        string
	Start, Done time.Time
	Err         string
}

// Watcher is one long-lived watch client with its own HTTP/2 connection.
type Watcher struct {
	ID int
	// Upstream is the API server the watcher's connection went to when it
	// started ("" if that could not be told), read from w1's socket table.
	Upstream string

	client    kubernetes.Interface
	namespace string
	cancel    context.CancelFunc
	done      chan struct{}
	started   chan struct{} // closed once the first watch is open

	mu         sync.Mutex // guards the fields below
	seen       map[string]time.Time
	ends       []time.Time // when a watch stream ended
	reconnects int
	relists    int
	errors     int
}

// StartWorkload creates the namespace and starts the watchers (one at a
// time, noting each one's upstream), then the writer and the short
// requests. Stop it with Stop.
func (c *Cluster) StartWorkload(ctx context.Context, namespace string, daemonPid, watchers int) (*Workload, error) {
	w := &Workload{c: c, namespace: namespace, pid: daemonPid}
	cs, err := c.ProxyClient()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := createNamespace(cctx, cs, namespace); err != nil {
		return nil, err
	}
	for i := range watchers {
		wt, err := w.StartWatcher(ctx, i)
		if err != nil {
			w.Stop()
			return nil, err
		}
		w.watchers = append(w.watchers, wt)
	}
	lctx, stop := context.WithCancel(ctx)
	w.stop = stop
	tlsCfg, err := controlplane.ClientTLS(c.CA, c.Admin, pki.ServiceName)
	if err != nil {
		stop()
		return nil, err
	}
	shortClient := &http.Client{
		Transport: &http.Transport{
			DialContext:         c.W1.DialContext,
			TLSClientConfig:     tlsCfg,
			DisableKeepAlives:   true,
			TLSHandshakeTimeout: shortTimeout,
		},
		Timeout: shortTimeout,
	}
	version := "https://" + ProxyAddr + "/version"
	quorum := "https://" + ProxyAddr + "/api/v1/namespaces/" + namespace + "/configmaps?limit=1"
	w.loops.Go(func() { w.shortLoop(lctx, shortClient, version, &w.shorts) })
	w.loops.Go(func() { w.shortLoop(lctx, shortClient, quorum, &w.quorums) })
	w.loops.Go(func() { w.writeLoop(lctx) })
	return w, nil
}

func createNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	for {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create namespace %s: %w", name, err)
		case <-time.After(time.Second):
		}
	}
}

// ProxyClient returns an admin client that goes through extractedprism,
// with its own connection.
func (c *Cluster) ProxyClient() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(c.RESTConfig(ProxyAddr, pki.ServiceName))
}

// shortLoop starts a GET of url every shortEvery until ctx is done and
// records it in *into. A request that cannot start because
// shortMaxInFlight are already running counts as failed.
func (w *Workload) shortLoop(ctx context.Context, client *http.Client, url string, into *[]ShortResult) {
	var inflight sync.WaitGroup
	defer inflight.Wait()
	sem := make(chan struct{}, shortMaxInFlight)
	t := time.NewTicker(shortEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		select {
		case sem <- struct{}{}:
			inflight.Go(func() {
				defer func() { <-sem }()
				w.record(into, shortRequest(client, url))
			})
		default:
			w.record(into, ShortResult{Start: time.Now(), Err: "client saturated"})
		}
	}
}

func shortRequest(client *http.Client, url string) ShortResult {
	start := time.Now()
	r := ShortResult{Start: start}
	resp, err := client.Get(url)
	if err == nil {
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
	}
	r.Dur = time.Since(start)
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

func (w *Workload) record(into *[]ShortResult, r ShortResult) {
	w.mu.Lock()
	*into = append(*into, r)
	w.mu.Unlock()
}

// writeLoop creates a ConfigMap every writeEvery. After a failure it
// builds a new client, so a connection stuck on a dead upstream is left
// behind the way a client with a request timeout would leave it.
func (w *Workload) writeLoop(ctx context.Context) {
	cs, err := w.c.ProxyClient()
	t := time.NewTicker(writeEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		name := fmt.Sprintf("w-%05d", i)
		start := time.Now()
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, writeTimeout)
			_, err = cs.CoreV1().ConfigMaps(w.namespace).Create(cctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Data:       map[string]string{"i": fmt.Sprint(i)},
			}, metav1.CreateOptions{})
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		r := WriteResult{Name: name, Start: start, Done: time.Now()}
		if err != nil {
			r.Err = err.Error()
			cs, err = w.c.ProxyClient()
		}
		w.mu.Lock()
		w.writes = append(w.writes, r)
		w.mu.Unlock()
	}
}

// StartWatcher starts one watcher and waits for its first watch to open,
// then notes the upstream of its connection: the one established
// connection from w1 to an API server that appeared meanwhile and is still
// there a moment later (health probes come and go in between).
func (w *Workload) StartWatcher(ctx context.Context, id int) (*Watcher, error) {
	before, _ := upstreamConns(w.pid)
	cs, err := w.c.ProxyClient()
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	wt := &Watcher{ID: id, client: cs, namespace: w.namespace, cancel: cancel,
		done: make(chan struct{}), started: make(chan struct{}), seen: map[string]time.Time{}}
	go wt.run(wctx)
	select {
	case <-wt.started:
	case <-time.After(30 * time.Second):
		wt.Stop()
		return nil, fmt.Errorf("watcher %d: no watch opened within 30s", id)
	}
	wt.Upstream = newConn(w.pid, before)
	return wt, nil
}

// newConn returns the remote address of the one connection that is in
// newConnsSince(pid, before); "" unless there is exactly one.
func newConn(pid int, before map[int]string) string {
	conns := newConnsSince(pid, before)
	if len(conns) != 1 {
		return ""
	}
	for _, remote := range conns {
		return remote
	}
	return ""
}

// newConnsSince returns the established connections to an API server,
// keyed by local port, that are not in before and that are there now and
// still 200 ms later: health probes come and go in between.
func newConnsSince(pid int, before map[int]string) map[int]string {
	time.Sleep(100 * time.Millisecond)
	a, _ := upstreamConns(pid)
	time.Sleep(200 * time.Millisecond)
	b, _ := upstreamConns(pid)
	out := map[int]string{}
	for port, remote := range a {
		if _, old := before[port]; old || b[port] != remote {
			continue
		}
		out[port] = remote
	}
	return out
}

// run lists, then watches from the listed resource version, re-watching
// from the last seen version whenever a stream ends and re-listing after
// 410 Gone. Objects first seen in a list count as delivered at that time.
func (wt *Watcher) run(ctx context.Context) {
	defer close(wt.done)
	rv := ""
	first := true
	for ctx.Err() == nil {
		if rv == "" {
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			list, err := wt.client.CoreV1().ConfigMaps(wt.namespace).List(lctx, metav1.ListOptions{})
			cancel()
			if err != nil {
				wt.count(&wt.errors)
				sleepCtx(ctx, watchRetryDelay)
				continue
			}
			now := time.Now()
			wt.mu.Lock()
			for _, cm := range list.Items {
				if _, ok := wt.seen[cm.Name]; !ok {
					wt.seen[cm.Name] = now
				}
			}
			wt.relists++
			wt.mu.Unlock()
			rv = list.ResourceVersion
		}
		wi, err := wt.client.CoreV1().ConfigMaps(wt.namespace).Watch(ctx, metav1.ListOptions{
			ResourceVersion:     rv,
			AllowWatchBookmarks: true,
		})
		if err != nil {
			wt.count(&wt.errors)
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				rv = ""
			}
			sleepCtx(ctx, watchRetryDelay)
			continue
		}
		if first {
			close(wt.started)
			first = false
		}
		rv = wt.consume(wi, rv)
		wi.Stop()
		wt.mu.Lock()
		wt.ends = append(wt.ends, time.Now())
		wt.reconnects++
		wt.mu.Unlock()
	}
}

// consume reads one watch stream until it ends and returns the resource
// version to resume from ("" to re-list).
func (wt *Watcher) consume(wi watch.Interface, rv string) string {
	for ev := range wi.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified:
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			now := time.Now()
			wt.mu.Lock()
			if _, ok := wt.seen[cm.Name]; !ok {
				wt.seen[cm.Name] = now
			}
			wt.mu.Unlock()
			rv = cm.ResourceVersion
		case watch.Bookmark:
			if obj, ok := ev.Object.(*corev1.ConfigMap); ok && obj.ResourceVersion != "" {
				rv = obj.ResourceVersion
			}
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			wt.count(&wt.errors)
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				return ""
			}
			return rv
		}
	}
	return rv
}

func (wt *Watcher) count(n *int) {
	wt.mu.Lock()
	*n++
	wt.mu.Unlock()
}

// Stop ends the watcher and waits for it.
func (wt *Watcher) Stop() {
	wt.cancel()
	<-wt.done
}

// StreamEnds returns when the watcher's streams ended.
func (wt *Watcher) StreamEnds() []time.Time {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	return append([]time.Time(nil), wt.ends...)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Watchers returns the workload's watchers.
func (w *Workload) Watchers() []*Watcher { return w.watchers }

// Stop stops the short requests and the writer, gives the watchers two
// seconds to receive the last writes, then stops them.
func (w *Workload) Stop() {
	if w.stop != nil {
		w.stop()
	}
	w.loops.Wait()
	time.Sleep(2 * time.Second)
	for _, wt := range w.watchers {
		wt.Stop()
	}
}

// Snapshot copies what the workload recorded: the GET /version requests,
// the quorum reads (both by start) and the writes.
func (w *Workload) Snapshot() (shorts, quorums []ShortResult, writes []WriteResult) {
	w.mu.Lock()
	defer w.mu.Unlock()
	shorts = append([]ShortResult(nil), w.shorts...)
	quorums = append([]ShortResult(nil), w.quorums...)
	writes = append([]WriteResult(nil), w.writes...)
	for _, rs := range [][]ShortResult{shorts, quorums} {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
	}
	return shorts, quorums, writes
}
