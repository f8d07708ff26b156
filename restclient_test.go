package main

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// The bodies below are what kube-apiserver sends for these requests, in its
// JSON wire format. The end-to-end tests run the same client against a real
// API server; these pin the decoding of each kind of answer.
const (
	wireList = `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1",
"metadata":{"resourceVersion":"41"},
"items":[{"metadata":{"name":"kubernetes","namespace":"default","labels":{"kubernetes.io/service-name":"kubernetes"}},
"addressType":"IPv4","endpoints":[{"addresses":["192.0.2.11"],"conditions":{"ready":true}}],
"ports":[{"name":"https","port":6443,"protocol":"TCP"}]}]}`
	wireForbidden = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
"message":"endpointslices.discovery.k8s.io is forbidden","reason":"Forbidden","code":403}`
	wireWatch = `{"type":"ADDED","object":{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1",
"metadata":{"name":"extra","namespace":"default","resourceVersion":"42"},"addressType":"IPv6",
"endpoints":[{"addresses":["2001:db8::1"]}],"ports":[{"name":"https","port":443}]}}
{"type":"BOOKMARK","object":{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"50"}}}
{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
"message":"too old resource version: 41 (45)","reason":"Expired","code":410}}
`
)

// apiRequest is what the test server saw of one request.
type apiRequest struct {
	path  string
	query url.Values
}

func wireServer(t *testing.T, status int, body string) (*restSliceClient, <-chan apiRequest) {
	t.Helper()
	seen := make(chan apiRequest, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- apiRequest{path: r.URL.Path, query: r.URL.Query()}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	c, err := newRESTSliceClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, seen
}

func TestRESTSliceClientList(t *testing.T) {
	c, seen := wireServer(t, http.StatusOK, wireList)
	list, err := c.List(context.Background(), "default", metav1.ListOptions{LabelSelector: kubeServiceSelector})
	if err != nil {
		t.Fatal(err)
	}
	req := <-seen
	if want := "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"; req.path != want {
		t.Errorf("path %s; want %s", req.path, want)
	}
	if got := req.query.Get("labelSelector"); got != kubeServiceSelector {
		t.Errorf("labelSelector %q; want %q", got, kubeServiceSelector)
	}
	if list.ResourceVersion != "41" || len(list.Items) != 1 {
		t.Fatalf("list: resourceVersion %q, %d items; want 41, 1", list.ResourceVersion, len(list.Items))
	}
	if got := sliceEndpoints(&list.Items[0]); fmt.Sprint(got) != "[192.0.2.11:6443]" {
		t.Errorf("endpoints %v; want [192.0.2.11:6443]", got)
	}
	c, _ = wireServer(t, http.StatusForbidden, wireForbidden)
	if _, err := c.List(context.Background(), "default", metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("List answered 403: error %v; want a Forbidden status error", err)
	}
}

func TestRESTSliceClientWatch(t *testing.T) {
	c, seen := wireServer(t, http.StatusOK, wireWatch)
	timeout := int64(300)
	w, err := c.Watch(context.Background(), "default", metav1.ListOptions{
		LabelSelector: kubeServiceSelector, ResourceVersion: "41", AllowWatchBookmarks: true, TimeoutSeconds: &timeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	q := (<-seen).query
	for key, want := range map[string]string{
		"watch": "true", "resourceVersion": "41", "allowWatchBookmarks": "true",
		"timeoutSeconds": "300", "labelSelector": kubeServiceSelector,
	} {
		if got := q.Get(key); got != want {
			t.Errorf("query %s=%q; want %q", key, got, want)
		}
	}
	events := readEvents(t, w, 3)
	if es, ok := events[0].Object.(*discoveryv1.EndpointSlice); events[0].Type != watch.Added || !ok ||
		fmt.Sprint(sliceEndpoints(es)) != "[[2001:db8::1]:443]" {
		t.Errorf("first event %v %#v; want ADDED of [2001:db8::1]:443", events[0].Type, events[0].Object)
	}
	if es, ok := events[1].Object.(*discoveryv1.EndpointSlice); events[1].Type != watch.Bookmark || !ok || es.ResourceVersion != "50" {
		t.Errorf("second event %v %#v; want a BOOKMARK at 50", events[1].Type, events[1].Object)
	}
	if err := apierrors.FromObject(events[2].Object); events[2].Type != watch.Error || !apierrors.IsResourceExpired(err) {
		t.Errorf("third event %v, error %v; want an ERROR that is 410 Expired", events[2].Type, err)
	}
}

func readEvents(t *testing.T, w watch.Interface, n int) []watch.Event {
	t.Helper()
	var out []watch.Event
	timeout := time.After(5 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %d events; want %d", len(out), n)
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("%d events after 5 s; want %d", len(out), n)
		}
	}
	return out
}

// hangUpServer closes every connection as soon as a request arrives, as the
// proxy does with a client it cannot place while no API server answers. It
// counts the requests (watch ones apart) and answers List normally when
// listOK is set.
func hangUpServer(t *testing.T, listOK bool) (c *restSliceClient, lists, watches *atomic.Int32) {
	t.Helper()
	lists, watches = new(atomic.Int32), new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			lists.Add(1)
			if listOK {
				// Not kept alive: net/http sends a request again, once, when
				// a reused connection fails before any answer.
				w.Header().Set("Connection", "close")
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, wireList)
				return
			}
		} else {
			watches.Add(1)
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	c, err := newRESTSliceClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, lists, watches
}

// A failed request is one request and an error: client-go's own retries,
// ten of them a second apart, would hide it and defeat the backoff.
func TestRESTSliceClientFailsAtOnce(t *testing.T) {
	c, lists, watches := hangUpServer(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.List(ctx, "default", metav1.ListOptions{}); err == nil || ctx.Err() != nil {
		t.Errorf("List: error %v (context %v); want the hang-up at once", err, ctx.Err())
	}
	w, err := c.Watch(ctx, "default", metav1.ListOptions{})
	if !errors.Is(err, errWatchNotOpened) || ctx.Err() != nil {
		t.Errorf("Watch: %v, error %v (context %v); want errWatchNotOpened at once", w, err, ctx.Err())
	}
	if n, m := lists.Load(), watches.Load(); n != 1 || m != 1 {
		t.Errorf("%d list and %d watch requests; want 1 each", n, m)
	}
}

// Against an API server that hangs up on every watch, the watcher counts
// each failed Watch call and keeps the spec's backoff between them: with no
// jitter, requests at 0 s and 1 s, the next not before 3 s.
func TestKubeWatcherBacksOffFailedWatchCalls(t *testing.T) {
	c, lists, watches := hangUpServer(t, true)
	m := newMetrics(prometheus.NewRegistry())
	w := newKubeWatcher(c, testLogger(t), m, func() float64 { return 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	_ = w.run(ctx, func([]string) {})
	if n := lists.Load(); n != 1 {
		t.Errorf("%d list requests; want 1", n)
	}
	// Requests at 0 s and 1 s; a slow machine may delay the second, never
	// add a third.
	n := watches.Load()
	if n < 1 || n > 2 {
		t.Errorf("%d watch requests in 2.5 s; want 2 (at 0 s and 1 s), or 1 on a slow machine", n)
	}
	if got := testutil.ToFloat64(m.discoveryErrors.WithLabelValues(kubeProviderName)); got != float64(n) {
		t.Errorf("discovery errors %v; want %d, one per failed Watch call", got, n)
	}
}

// TestRESTSliceClientRedialsAfterFailure: a failed List or Watch drops the
// client's idle connections, so the next request opens a new one and the
// proxy picks an upstream for it again, instead of reusing the HTTP/2
// connection to an API server that answers errors.
func TestRESTSliceClientRedialsAfterFailure(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`)
	}))
	// Connections that carried a request: the transport may open one
	// more and drop it before its TLS handshake ends, which says nothing.
	var mu sync.Mutex
	active := map[net.Conn]bool{}
	srv.Config.ConnState = func(c net.Conn, state http.ConnState) {
		if state == http.StateActive {
			mu.Lock()
			active[c] = true
			mu.Unlock()
		}
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	// The daemon's own configuration: a token file, a CA file, its user
	// agent and no proxy, each a wrapper client-go puts around the
	// transport that dropIdle must see through. (No proxy also means a
	// transport of its own, not one client-go shares with other clients.)
	saDir := t.TempDir()
	writeFile(t, filepath.Join(saDir, "token"), "sa-token")
	writeFile(t, filepath.Join(saDir, "ca.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	cfg, err := kubeRESTConfig(kubeProviderConfig{
		LocalAddr:  srv.Listener.Addr().String(),
		ServerName: "example.com", // on httptest's certificate
	}, saDir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newRESTSliceClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const lists, watches = 3, 2
	for range lists {
		if _, err := c.List(t.Context(), "default", metav1.ListOptions{}); err == nil {
			t.Fatal("List: got no error from a server answering 503")
		}
	}
	for range watches {
		if w, err := c.Watch(t.Context(), "default", metav1.ListOptions{}); err == nil {
			w.Stop()
			t.Fatal("Watch: got no error from a server answering 503")
		}
	}
	mu.Lock()
	got := len(active)
	mu.Unlock()
	if got != lists+watches {
		t.Errorf("connections for %d failed requests: got %d; want one each", lists+watches, got)
	}
}

// TestKubeWatcherLostHTTP2ConnectionIsNoError runs the watch over HTTP/2
// through a relay that goes silent, as a black-holed path does. client-go's
// HTTP/2 health check, made quick here, gives the connection up and reports
// that as a watch error event ("http2: client connection lost"); it is a
// dropped connection, not counted, and the watch is opened again.
func TestKubeWatcherLostHTTP2ConnectionIsNoError(t *testing.T) {
	// client-go reads these when it builds the transport.
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "1")
	t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "1")
	watches := make(chan struct{}, 10)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			_, _ = io.WriteString(w, wireList)
			return
		}
		watches <- struct{}{}
		_, _ = io.WriteString(w, wireWatch[:strings.Index(wireWatch, "\n{")+1]) // the ADDED event only
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	relay := startSilencingRelay(t, srv.Listener.Addr().String())
	c, err := newRESTSliceClient(&rest.Config{
		Host: "https://" + relay.addr,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}),
			ServerName: "example.com", // on httptest's certificate
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(prometheus.NewRegistry())
	w := newKubeWatcher(c, testLogger(t), m, func() float64 { return 0 })
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan []string, 10)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.run(ctx, func(l []string) { out <- l }) }()
	defer func() { cancel(); <-done }()

	receive(t, out, "the listed endpoints")
	receive(t, out, "the endpoints after the watch event") // the client reads the stream
	relay.silence()
	select {
	case <-watches: // the first watch
	default:
		t.Fatal("no watch request before the event")
	}
	select {
	case <-watches:
	case <-time.After(10 * time.Second):
		t.Fatal("no new watch within 10 s of the connection going silent")
	}
	if got := testutil.ToFloat64(m.discoveryErrors.WithLabelValues(kubeProviderName)); got != 0 {
		t.Errorf("discovery_errors_total after a lost connection: got %v; want 0", got)
	}
}

// receive waits up to 10 s for a list on out.
func receive(t *testing.T, out <-chan []string, what string) {
	t.Helper()
	select {
	case <-out:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// silencingRelay forwards TCP connections on 127.0.0.1 to a target. After
// silence, the connections it has drop whatever they receive, as a
// black-holed path does; later ones forward normally.
type silencingRelay struct {
	addr    string
	silence func() // mutes the connections open now
}

func startSilencingRelay(t *testing.T, target string) *silencingRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var era atomic.Int64 // a connection accepted in an earlier era is muted
	r := &silencingRelay{addr: ln.Addr().String(), silence: func() { era.Add(1) }}
	var wg sync.WaitGroup
	var conns sync.Map // every socket, closed at the end
	t.Cleanup(func() {
		_ = ln.Close()
		conns.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			conns.Store(client, nil)
			conns.Store(upstream, nil)
			born := era.Load()
			muted := func() bool { return era.Load() != born }
			wg.Go(func() { relayUnlessMuted(upstream, client, muted) })
			wg.Go(func() { relayUnlessMuted(client, upstream, muted) })
		}
	})
	return r
}

// relayUnlessMuted copies src to dst, dropping the bytes once muted says
// so, until either side fails; then it closes both.
func relayUnlessMuted(dst, src net.Conn, muted func() bool) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !muted() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// sliceEndpoints returns the endpoints discovery takes from es alone.
func sliceEndpoints(es *discoveryv1.EndpointSlice) []string {
	eps, _ := endpointsOf(map[string]*discoveryv1.EndpointSlice{"s": es})
	return eps
}
