package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// --- EndpointSlice builders ---

func httpsPort(port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: new("https"), Port: new(port)}
}

func endpoint(ready *bool, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// kubeSlice is an IPv4 slice of the kubernetes Service with port https/6443
// and one endpoint per address whose readiness is unknown (nil).
func kubeSlice(name, resourceVersion string, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       "default",
			ResourceVersion: resourceVersion,
			Labels:          map[string]string{discoveryv1.LabelServiceName: "kubernetes"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{httpsPort(6443)},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, endpoint(nil, a))
	}
	return s
}

func sliceCache(list ...*discoveryv1.EndpointSlice) map[string]*discoveryv1.EndpointSlice {
	cache := make(map[string]*discoveryv1.EndpointSlice)
	for _, s := range list {
		cache[s.Name] = s
	}
	return cache
}

func withType(s *discoveryv1.EndpointSlice, t discoveryv1.AddressType) *discoveryv1.EndpointSlice {
	s.AddressType = t
	return s
}

func withPorts(s *discoveryv1.EndpointSlice, ports ...discoveryv1.EndpointPort) *discoveryv1.EndpointSlice {
	s.Ports = ports
	return s
}

// endpointsOf keeps only addresses that can be an API server: not the
// unspecified, link-local or multicast ones, which kube-apiserver itself
// mostly refuses in an EndpointSlice (an older or relaxed server, or the
// cache, could still hand them over), nor broadcast or zoned ones. What it
// leaves out, but for what is not an IP at all, is reported with the
// reason. Loopback passes: the daemon drops only its own listener.
func TestEndpointsOf(t *testing.T) {
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &p}
	}
	tests := []struct {
		name     string
		slices   []*discoveryv1.EndpointSlice
		want     []string
		rejected []string
	}{
		{"no slices", nil, []string{}, nil},
		{"nil ready is included, sorted", []*discoveryv1.EndpointSlice{kubeSlice("a", "1", "10.0.0.2", "10.0.0.1")},
			[]string{"10.0.0.1:6443", "10.0.0.2:6443"}, nil},
		{"ready false is excluded, ready true included", []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
			s := kubeSlice("a", "1")
			s.Endpoints = []discoveryv1.Endpoint{endpoint(new(false), "10.0.0.1"), endpoint(new(true), "10.0.0.2")}
			return s
		}()}, []string{"10.0.0.2:6443"}, nil},
		{"multiple slices merge, duplicates across slices removed",
			[]*discoveryv1.EndpointSlice{kubeSlice("a", "1", "10.0.0.1", "10.0.0.2"), kubeSlice("b", "1", "10.0.0.2", "10.0.0.3")},
			[]string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443"}, nil},
		{"IPv6 addresses are bracketed and canonical",
			[]*discoveryv1.EndpointSlice{withType(kubeSlice("v6", "1", "fd00:0:0::1", "fd00::2"), discoveryv1.AddressTypeIPv6)},
			[]string{"[fd00::1]:6443", "[fd00::2]:6443"}, nil},
		{"FQDN slices are left out",
			[]*discoveryv1.EndpointSlice{withType(kubeSlice("by-name", "1", "api.example.com"), discoveryv1.AddressTypeFQDN)},
			[]string{}, []string{`slice "by-name" (address type "FQDN")`}},
		{"each slice uses its own port",
			[]*discoveryv1.EndpointSlice{kubeSlice("a", "1", "10.0.0.1"), withPorts(kubeSlice("b", "1", "10.0.0.2"), httpsPort(8443))},
			[]string{"10.0.0.1:6443", "10.0.0.2:8443"}, nil},
		{"the port named https is chosen among several",
			[]*discoveryv1.EndpointSlice{withPorts(kubeSlice("a", "1", "10.0.0.1"), port("metrics", 9000), httpsPort(6443))},
			[]string{"10.0.0.1:6443"}, nil},
		{"a single unnamed port is used",
			[]*discoveryv1.EndpointSlice{withPorts(kubeSlice("a", "1", "10.0.0.1"), discoveryv1.EndpointPort{Port: new(int32(443))})},
			[]string{"10.0.0.1:443"}, nil},
		{"a slice without an https port is left out", []*discoveryv1.EndpointSlice{
			kubeSlice("a", "1", "10.0.0.1"),
			withPorts(kubeSlice("b", "1", "10.0.0.2"), port("api", 6443), port("metrics", 9000)),
			withPorts(kubeSlice("c", "1", "10.0.0.3")),
		}, []string{"10.0.0.1:6443"}, []string{
			`slice "b" (no usable port: none named https, nor a single one)`,
			`slice "c" (no usable port: none named https, nor a single one)`,
		}},
		{"addresses that are not IPs are skipped", []*discoveryv1.EndpointSlice{kubeSlice("a", "1", "10.0.0.1", "not-an-ip")},
			[]string{"10.0.0.1:6443"}, nil},
		{"unusable addresses are left out", []*discoveryv1.EndpointSlice{
			kubeSlice("v4", "1", "10.0.0.1", "127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.1",
				"239.1.1.1", "255.255.255.255", "::ffff:0.0.0.0"),
			withType(kubeSlice("v6", "1", "fd00::1", "::", "::1", "fe80::1%eth0", "ff02::1", "fd00::2%eth0"), discoveryv1.AddressTypeIPv6),
		}, []string{"10.0.0.1:6443", "127.0.0.1:6443", "[::1]:6443", "[fd00::1]:6443"}, []string{
			"0.0.0.0:6443 (unspecified address)",
			"169.254.169.254:6443 (link-local address)", "224.0.0.1:6443 (multicast address)",
			"239.1.1.1:6443 (multicast address)", "255.255.255.255:6443 (broadcast address)",
			"[::]:6443 (unspecified address)",
			"[fd00::2%eth0]:6443 (address with an IPv6 zone)", "[fe80::1%eth0]:6443 (link-local address)",
			"[ff02::1]:6443 (multicast address)",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, rejected := endpointsOf(sliceCache(tc.slices...))
			if got == nil || !slices.Equal(got, tc.want) || !slices.Equal(rejected, tc.rejected) {
				t.Errorf("got %#v, rejected %q; want %#v, %q", got, rejected, tc.want, tc.rejected)
			}
		})
	}
}

func TestNextReconnectStep(t *testing.T) {
	// Every combination, so that a new rule cannot silently change another.
	tests := []struct {
		end           watchEnd
		long, rewatch bool
		want          reconnectStep
	}{
		{endClosed, false, false, reconnectStep{wait: true}},
		{endClosed, false, true, reconnectStep{resetBackoff: true, wait: true}},
		{endClosed, true, false, reconnectStep{resetBackoff: true}},
		{endClosed, true, true, reconnectStep{resetBackoff: true}},
		{endError, false, false, reconnectStep{wait: true}},
		{endError, false, true, reconnectStep{resetBackoff: true, wait: true}},
		{endError, true, false, reconnectStep{resetBackoff: true, wait: true}},
		{endError, true, true, reconnectStep{resetBackoff: true, wait: true}},
		{endGone, false, false, reconnectStep{relist: true, wait: true}},
		{endGone, false, true, reconnectStep{relist: true, resetBackoff: true}},
		{endGone, true, false, reconnectStep{relist: true, resetBackoff: true}},
		{endGone, true, true, reconnectStep{relist: true, resetBackoff: true}},
	}
	for _, tc := range tests {
		if got := nextReconnectStep(tc.end, tc.long, tc.rewatch); got != tc.want {
			t.Errorf("nextReconnectStep(%d, long=%v, rewatch=%v): got %+v; want %+v", tc.end, tc.long, tc.rewatch, got, tc.want)
		}
	}
}

// --- kubernetes provider harness ---

// apiCall is a List (R listReply) or Watch (R watchReply) call the
// provider made. The reactor that received one blocks until the test
// replies, so the test knows exactly when, in the bubble's fake time, each
// call happened.
type apiCall[R any] struct {
	at        time.Time
	namespace string
	opts      metav1.ListOptions
	reply     chan R
}

type (
	listCall  = apiCall[listReply]
	watchCall = apiCall[watchReply]
)

type listReply struct {
	list *discoveryv1.EndpointSliceList
	err  error
}

type watchReply struct {
	watcher watch.Interface
	err     error
}

// forwardCall hands a call to the test on calls and returns its reply, or
// ok false once the test is over.
func forwardCall[R any](calls chan apiCall[R], over chan struct{}, namespace string, opts metav1.ListOptions) (r R, ok bool) {
	c := apiCall[R]{at: time.Now(), namespace: namespace, opts: opts, reply: make(chan R)}
	select {
	case calls <- c:
	case <-over:
		return r, false
	}
	select {
	case r = <-c.reply:
		return r, true
	case <-over:
		return r, false
	}
}

func nextCall[R any](t *testing.T, calls chan apiCall[R], what string) apiCall[R] {
	t.Helper()
	select {
	case c := <-calls:
		return c
	case <-time.After(time.Hour):
		t.Fatalf("no %s call within an hour", what)
		return apiCall[R]{}
	}
}

var errTestOver = errors.New("test over")

type kubeHarness struct {
	t       *testing.T
	reg     *prometheus.Registry
	m       *metrics
	out     chan []string
	lists   chan listCall
	watches chan watchCall
	logs    *syncBuffer
}

// startKube runs a kubernetes provider with a fake clientset and jitter
// source. It must be called inside a synctest bubble; the provider is
// stopped and awaited when the test ends, and must have returned nil.
func startKube(t *testing.T, jitter float64) *kubeHarness {
	t.Helper()
	return startKubeWith(t, jitter, nil)
}

// startKubeWith is startKube with setup applied to the provider before it
// runs; its log lines also go to h.logs.
func startKubeWith(t *testing.T, jitter float64, setup func(w *kubeWatcher)) *kubeHarness {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := &kubeHarness{
		t:       t,
		reg:     reg,
		m:       newMetrics(reg),
		out:     make(chan []string, 100),
		lists:   make(chan listCall),
		watches: make(chan watchCall),
		logs:    &syncBuffer{},
	}
	over := make(chan struct{})
	client := fake.NewClientset()
	client.PrependReactor("list", "endpointslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		r, ok := forwardCall(h.lists, over, action.GetNamespace(), action.(k8stesting.ListActionImpl).ListOptions)
		switch {
		case !ok:
			return true, nil, errTestOver
		case r.list == nil:
			return true, nil, r.err
		}
		return true, r.list, r.err
	})
	client.PrependWatchReactor("endpointslices", func(action k8stesting.Action) (bool, watch.Interface, error) {
		r, ok := forwardCall(h.watches, over, action.GetNamespace(), action.(k8stesting.WatchActionImpl).ListOptions)
		if !ok {
			return true, nil, errTestOver
		}
		return true, r.watcher, r.err
	})

	log := slog.New(slog.NewJSONHandler(io.MultiWriter(t.Output(), h.logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := newKubeWatcher(fakeSlices{client}, log, h.m, func() float64 { return jitter })
	if setup != nil {
		setup(w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.run(ctx, func(l []string) { h.out <- l }) }()
	t.Cleanup(func() {
		cancel()
		close(over)
		if err := <-done; err != nil {
			t.Errorf("run: got %v; want nil", err)
		}
	})
	return h
}

func (h *kubeHarness) nextList() listCall   { return nextCall(h.t, h.lists, "List") }
func (h *kubeHarness) nextWatch() watchCall { return nextCall(h.t, h.watches, "Watch") }

// answerList waits for a List call and answers it with the slices.
func (h *kubeHarness) answerList(resourceVersion string, items ...*discoveryv1.EndpointSlice) listCall {
	h.t.Helper()
	c := h.nextList()
	list := &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: resourceVersion}}
	for _, s := range items {
		list.Items = append(list.Items, *s)
	}
	c.reply <- listReply{list: list}
	return c
}

func (h *kubeHarness) failList(err error) listCall {
	h.t.Helper()
	c := h.nextList()
	c.reply <- listReply{err: err}
	return c
}

// openWatch waits for a Watch call and answers it with a fake watcher the
// test drives.
func (h *kubeHarness) openWatch() (*watch.RaceFreeFakeWatcher, watchCall) {
	h.t.Helper()
	c := h.nextWatch()
	fw := watch.NewRaceFreeFake()
	c.reply <- watchReply{watcher: fw}
	return fw, c
}

func (h *kubeHarness) failWatch(err error) watchCall {
	h.t.Helper()
	c := h.nextWatch()
	c.reply <- watchReply{err: err}
	return c
}

func (h *kubeHarness) expectOut(want ...string) {
	h.t.Helper()
	select {
	case got := <-h.out:
		if !slices.Equal(got, want) {
			h.t.Errorf("published %q; want %q", got, want)
		}
	case <-time.After(time.Hour):
		h.t.Fatalf("nothing published; want %q", want)
	}
}

func (h *kubeHarness) expectNoOut() {
	h.t.Helper()
	synctest.Wait()
	select {
	case got := <-h.out:
		h.t.Errorf("published %q; want nothing", got)
	default:
	}
}

func (h *kubeHarness) errorsTotal() float64 {
	return testutil.ToFloat64(h.m.discoveryErrors.WithLabelValues(kubeProviderName))
}

func (h *kubeHarness) running() float64 {
	return testutil.ToFloat64(h.m.discoveryRunning.WithLabelValues(kubeProviderName))
}

// start answers the initial List with one slice and consumes its list.
func (h *kubeHarness) start() {
	h.t.Helper()
	h.answerList("1", kubeSlice("a", "1", "10.0.0.1"))
	h.expectOut("10.0.0.1:6443")
}

var errUnavailable = apierrors.NewServiceUnavailable("etcd is unavailable")

func statusEvent(code int32, reason metav1.StatusReason) *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: string(reason)}
}

var (
	goneEvent  = statusEvent(http.StatusGone, metav1.StatusReasonExpired)
	errorEvent = statusEvent(http.StatusInternalServerError, metav1.StatusReasonInternalError)
	// brokenStreamEvent is the object of the error event client-go sends
	// when it loses the watch's HTTP/2 connection, built as client-go
	// builds it (rest.Request.newStreamWatcher).
	brokenStreamEvent = apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, clientWatchDecoding).
				AsObject(errors.New("unable to decode an event from the watch stream: http2: client connection lost"))
	// garbledStreamEvent is the same for a stream that does not decode.
	garbledStreamEvent = apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, clientWatchDecoding).
				AsObject(errors.New("unable to decode an event from the watch stream: json: cannot unmarshal number into Go value of type struct"))
	errGone = apierrors.NewGone("too old resource version") //nolint:staticcheck // servers still send reason Gone; the provider handles it and Expired
)

func TestKubeBackoffSteps(t *testing.T) {
	tests := []struct {
		name        string
		jitter      float64
		wantTimeout int64
		want        []time.Duration
	}{
		{
			name:        "no jitter",
			jitter:      0,
			wantTimeout: 300,
			want: []time.Duration{
				1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
				16 * time.Second, 30 * time.Second, 30 * time.Second,
			},
		},
		{
			// Up to 25 % on top: 0.999 of it.
			name:        "maximum jitter",
			jitter:      0.999,
			wantTimeout: 599,
			want: []time.Duration{
				1249750 * time.Microsecond, 2499500 * time.Microsecond, 4999 * time.Millisecond,
				9998 * time.Millisecond, 19996 * time.Millisecond, 37492500 * time.Microsecond,
				37492500 * time.Microsecond,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startKube(t, tc.jitter)
				h.start()
				last := h.failWatch(errUnavailable)
				if got := *last.opts.TimeoutSeconds; got != tc.wantTimeout {
					t.Errorf("watch TimeoutSeconds: got %v; want %v", got, tc.wantTimeout)
				}
				for i, want := range tc.want {
					c := h.failWatch(errUnavailable)
					if got := c.at.Sub(last.at); got != want {
						t.Errorf("delay %d: got %v; want %v", i+1, got, want)
					}
					last = c
				}
				synctest.Wait()
				if got, want := h.errorsTotal(), float64(len(tc.want)+1); got != want {
					t.Errorf("discovery_errors_total: got %v; want %v", got, want)
				}
			})
		})
	}
}

func TestKubeReconnectRules(t *testing.T) {
	type outcome int
	const (
		callError    outcome = iota // the Watch call fails
		callGone                    // the Watch call fails with 410
		closeAfter                  // the stream closes cleanly after hold
		errorAfter                  // an error event after hold
		goneAfter                   // a 410 event after hold
		brokeAfter                  // client-go reports the connection lost after hold
		garbledAfter                // client-go reports an event it cannot decode after hold
	)
	tests := []struct {
		name           string
		failures       int  // failed Watch calls first, each advancing the backoff
		afterLongClose bool // then a watch open 30 s that closes cleanly
		outcome        outcome
		hold           time.Duration
		wantRelist     bool          // a List right after the outcome
		wantDelay      time.Duration // outcome (or re-list) to the next Watch
		wantThen       time.Duration // the delay after that Watch fails too
		wantCounted    bool          // the outcome counts in discovery_errors_total
	}{
		{name: "clean close after 30s re-watches at once",
			failures: 2, outcome: closeAfter, hold: 30 * time.Second, wantThen: time.Second},
		{name: "clean close after 29s backs off",
			outcome: closeAfter, hold: 29 * time.Second, wantDelay: time.Second, wantThen: 2 * time.Second},
		{name: "clean close after 29s continues the backoff",
			failures: 2, outcome: closeAfter, hold: 29 * time.Second, wantDelay: 4 * time.Second, wantThen: 8 * time.Second},
		{name: "connection lost after 30s re-watches at once",
			failures: 2, outcome: brokeAfter, hold: 30 * time.Second, wantThen: time.Second},
		{name: "connection lost after 29s backs off",
			outcome: brokeAfter, hold: 29 * time.Second, wantDelay: time.Second, wantThen: 2 * time.Second},
		{name: "undecodable event after 29s continues the backoff",
			failures: 3, outcome: garbledAfter, hold: 29 * time.Second, wantDelay: 8 * time.Second, wantThen: 16 * time.Second, wantCounted: true},
		{name: "failed Watch call backs off",
			outcome: callError, wantDelay: time.Second, wantThen: 2 * time.Second, wantCounted: true},
		{name: "error event after 30s restarts the backoff at 1s",
			failures: 3, outcome: errorAfter, hold: 30 * time.Second, wantDelay: time.Second, wantThen: 2 * time.Second, wantCounted: true},
		{name: "error event after 29s continues the backoff",
			failures: 3, outcome: errorAfter, hold: 29 * time.Second, wantDelay: 8 * time.Second, wantThen: 16 * time.Second, wantCounted: true},
		{name: "failed re-watch after a long clean close starts at 1s",
			failures: 3, afterLongClose: true, outcome: callError, wantDelay: time.Second, wantThen: 2 * time.Second, wantCounted: true},
		{name: "410 ending a watch open 30s re-lists and re-watches at once",
			failures: 3, outcome: goneAfter, hold: 30 * time.Second, wantRelist: true, wantThen: time.Second},
		{name: "410 ending a watch open 29s re-lists then backs off",
			failures: 2, outcome: goneAfter, hold: 29 * time.Second, wantRelist: true, wantDelay: 4 * time.Second, wantThen: 8 * time.Second},
		{name: "410 from the re-watch call after a long clean close re-watches at once",
			failures: 2, afterLongClose: true, outcome: callGone, wantRelist: true, wantThen: time.Second},
		{name: "410 event on the re-watch after a long clean close re-watches at once",
			failures: 2, afterLongClose: true, outcome: goneAfter, hold: 5 * time.Second, wantRelist: true, wantThen: time.Second},
		{name: "410 from a Watch call otherwise re-lists then backs off",
			failures: 2, outcome: callGone, wantRelist: true, wantDelay: 4 * time.Second, wantThen: 8 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startKube(t, 0)
				h.start()
				for range tc.failures {
					h.failWatch(errUnavailable)
				}
				if tc.afterLongClose {
					fw, _ := h.openWatch()
					time.Sleep(longWatch)
					fw.Stop()
				}

				var ended time.Time
				switch tc.outcome {
				case callError:
					ended = h.failWatch(errUnavailable).at
				case callGone:
					ended = h.failWatch(errGone).at
				default:
					fw, c := h.openWatch()
					time.Sleep(tc.hold)
					events := map[outcome]runtime.Object{errorAfter: errorEvent, goneAfter: goneEvent,
						brokeAfter: brokenStreamEvent, garbledAfter: garbledStreamEvent}
					if ev, ok := events[tc.outcome]; ok {
						fw.Error(ev)
					} else {
						fw.Stop() // closeAfter
					}
					ended = c.at.Add(tc.hold)
				}

				if tc.wantRelist {
					c := h.answerList("50", kubeSlice("a", "50", "10.0.0.1"))
					if got := c.at.Sub(ended); got != 0 {
						t.Errorf("re-list delay: got %v; want 0", got)
					}
				}
				next := h.failWatch(errUnavailable)
				if got := next.at.Sub(ended); got != tc.wantDelay {
					t.Errorf("delay to the next Watch: got %v; want %v", got, tc.wantDelay)
				}
				if tc.wantRelist && next.opts.ResourceVersion != "50" {
					t.Errorf("Watch after re-list from resourceVersion: got %q; want %q", next.opts.ResourceVersion, "50")
				}
				then := h.nextWatch()
				if got := then.at.Sub(next.at); got != tc.wantThen {
					t.Errorf("delay after that: got %v; want %v", got, tc.wantThen)
				}
				then.reply <- watchReply{err: errUnavailable}
				synctest.Wait()
				// The failures before, the outcome if it counts, and the two
				// failed Watch calls after it.
				want := float64(tc.failures + 2)
				if tc.wantCounted {
					want++
				}
				if got := h.errorsTotal(); got != want {
					t.Errorf("discovery_errors_total: got %v; want %v", got, want)
				}
			})
		})
	}
}

func TestKubeInitialListRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startKube(t, 0)
		first := h.failList(errUnavailable)
		if first.namespace != "default" || first.opts.LabelSelector != "kubernetes.io/service-name=kubernetes" {
			t.Errorf("List in %q with selector %q; want %q with %q",
				first.namespace, first.opts.LabelSelector, "default", "kubernetes.io/service-name=kubernetes")
		}
		last := first
		for i, want := range []time.Duration{time.Second, 2 * time.Second} {
			c := h.failList(errUnavailable)
			if got := c.at.Sub(last.at); got != want {
				t.Errorf("list retry %d: got %v; want %v", i+1, got, want)
			}
			last = c
		}
		h.expectNoOut()
		ok := h.answerList("7", kubeSlice("a", "7", "10.0.0.1"))
		if got, want := ok.at.Sub(last.at), 4*time.Second; got != want {
			t.Errorf("list retry 3: got %v; want %v", got, want)
		}
		h.expectOut("10.0.0.1:6443")
		w := h.failWatch(errUnavailable)
		if got := w.at.Sub(ok.at); got != 0 {
			t.Errorf("delay from a successful List to the Watch: got %v; want 0", got)
		}
		synctest.Wait()
		if got, want := h.errorsTotal(), 4.0; got != want {
			t.Errorf("discovery_errors_total: got %v; want %v", got, want)
		}
	})
}

// TestKubeCredentialsRetried: credentials that do not load at start (a
// joining node's kubelet writes its kubeconfig after this daemon starts)
// are retried with the backoff, discovery_running 0 and each failure
// counted and logged as an error, until they load; then the provider lists
// as usual, from a fresh backoff.
func TestKubeCredentialsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex // guards attempts, appended by the provider's goroutine
		var attempts []time.Time
		h := startKubeWith(t, 0, func(w *kubeWatcher) {
			client := w.client
			w.client = nil
			w.connect = func() (sliceClient, error) {
				mu.Lock()
				defer mu.Unlock()
				attempts = append(attempts, time.Now())
				if len(attempts) < 4 {
					return nil, errors.New("open /etc/kubernetes/kubelet.conf: no such file or directory")
				}
				return client, nil
			}
		})
		time.Sleep(6 * time.Second) // attempts at 0, 1 s, 3 s
		synctest.Wait()
		mu.Lock()
		n, start := len(attempts), attempts[0]
		mu.Unlock()
		if n != 3 {
			t.Fatalf("attempts after 6 s: %d; want 3 (at 0, 1 s, 3 s)", n)
		}
		if got := h.running(); got != 0 {
			t.Errorf("discovery_running while the credentials do not load: %v; want 0", got)
		}
		if got := h.errorsTotal(); got != 3 {
			t.Errorf("discovery_errors_total: %v; want 3", got)
		}
		if want := `"level":"ERROR","msg":"kubernetes credentials do not load, retrying"`; !strings.Contains(h.logs.String(), want) {
			t.Errorf("log: %s; want %s", h.logs.String(), want)
		}
		first := h.failList(errUnavailable) // the fourth attempt, at 7 s, loaded
		if got, want := first.at.Sub(start), 7*time.Second; got != want {
			t.Errorf("first List at %v; want %v", got, want)
		}
		ok := h.answerList("1", kubeSlice("a", "1", "10.0.0.1"))
		if got, want := ok.at.Sub(first.at), time.Second; got != want {
			t.Errorf("List retry after the credentials loaded: %v; want %v (a fresh backoff)", got, want)
		}
		h.expectOut("10.0.0.1:6443")
		if got := h.running(); got != 1 {
			t.Errorf("discovery_running after a List: %v; want 1", got)
		}
	})
}

// TestKubeRefusedCredentials: a 403 or 401 will fail until someone changes
// the RBAC or the credentials, so it clears discovery_running and is
// logged as an error with a hint; other failures are warnings and leave it
// alone. The next call that succeeds sets it again.
func TestKubeRefusedCredentials(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "",
		errors.New(`User "system:node:w1" cannot list resource "endpointslices" in API group "discovery.k8s.io" in the namespace "default"`))
	tests := []struct {
		name, hint string
		err        error
	}{
		{"403", "deploy/node-discovery-rbac.yaml", forbidden},
		{"401", "does not accept these credentials", apierrors.NewUnauthorized("Unauthorized")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startKube(t, 0)
				h.failList(tc.err)
				synctest.Wait()
				if got := h.running(); got != 0 {
					t.Errorf("discovery_running after a refused List: %v; want 0", got)
				}
				if logs := h.logs.String(); !strings.Contains(logs, `"level":"ERROR","msg":"endpointslice list failed"`) || !strings.Contains(logs, tc.hint) {
					t.Errorf("log: %s; want an error naming %q", logs, tc.hint)
				}
				h.failList(errUnavailable)
				synctest.Wait()
				if got := h.running(); got != 0 {
					t.Errorf("discovery_running after a 503 following it: %v; want still 0", got)
				}
				h.answerList("1", kubeSlice("a", "1", "10.0.0.1"))
				h.expectOut("10.0.0.1:6443")
				if got := h.running(); got != 1 {
					t.Errorf("discovery_running after a List: %v; want 1", got)
				}
				h.failWatch(tc.err)
				synctest.Wait()
				if got := h.running(); got != 0 {
					t.Errorf("discovery_running after a refused Watch: %v; want 0", got)
				}
				h.openWatch()
				synctest.Wait()
				if got := h.running(); got != 1 {
					t.Errorf("discovery_running with a watch open: %v; want 1", got)
				}
			})
		})
	}
}

func TestKubeRelistFailureRetried(t *testing.T) {
	tests := []struct {
		name      string
		hold      time.Duration // how long the watch was open before the 410
		wantWatch time.Duration // from the successful re-list to the Watch
	}{
		{name: "410 after a short watch", hold: 0, wantWatch: 2 * time.Second},
		{name: "410 after a long watch", hold: 30 * time.Second, wantWatch: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startKube(t, 0)
				h.start()
				fw, _ := h.openWatch()
				time.Sleep(tc.hold)
				fw.Error(goneEvent)
				failed := h.failList(errUnavailable)
				ok := h.answerList("9", kubeSlice("a", "9", "10.0.0.1"), kubeSlice("b", "9", "10.0.0.2"))
				if got, want := ok.at.Sub(failed.at), time.Second; got != want {
					t.Errorf("re-list retry: got %v; want %v", got, want)
				}
				h.expectOut("10.0.0.1:6443", "10.0.0.2:6443")
				w := h.failWatch(errUnavailable)
				if got := w.at.Sub(ok.at); got != tc.wantWatch {
					t.Errorf("delay from re-list to Watch: got %v; want %v", got, tc.wantWatch)
				}
				synctest.Wait()
				// The failed re-list and the failed Watch; the 410 is not counted.
				if got, want := h.errorsTotal(), 2.0; got != want {
					t.Errorf("discovery_errors_total: got %v; want %v", got, want)
				}
			})
		})
	}
}

func TestKubeWatchOptionsAndBookmarks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startKube(t, 0)
		h.answerList("10", kubeSlice("a", "10", "10.0.0.1"))
		h.expectOut("10.0.0.1:6443")

		fw, c := h.openWatch()
		const selector = "kubernetes.io/service-name=kubernetes"
		if c.namespace != "default" || c.opts.LabelSelector != selector || !c.opts.AllowWatchBookmarks || c.opts.ResourceVersion != "10" {
			t.Errorf("first Watch: namespace %q, options %+v; want default, %s, bookmarks, resourceVersion 10", c.namespace, c.opts, selector)
		}

		fw.Action(watch.Bookmark, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "20"}})
		h.expectNoOut()
		fw.Stop()
		fw, c = h.openWatch()
		if got, want := c.opts.ResourceVersion, "20"; got != want {
			t.Errorf("Watch after bookmark resourceVersion: got %q; want %q", got, want)
		}

		fw.Modify(kubeSlice("a", "30", "10.0.0.5"))
		h.expectOut("10.0.0.5:6443")
		fw.Stop()
		_, c = h.openWatch()
		if got, want := c.opts.ResourceVersion, "30"; got != want {
			t.Errorf("Watch after modify resourceVersion: got %q; want %q", got, want)
		}
		synctest.Wait()
		if got := h.errorsTotal(); got != 0 {
			t.Errorf("discovery_errors_total after clean closes: got %v; want 0", got)
		}
	})
}

func TestKubeWatchEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startKube(t, 0)
		h.answerList("1", kubeSlice("a", "1", "10.0.0.1", "10.0.0.2"))
		h.expectOut("10.0.0.1:6443", "10.0.0.2:6443")
		fw, _ := h.openWatch()

		fw.Add(kubeSlice("b", "2", "10.0.0.3", "10.0.0.2"))
		h.expectOut("10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443")

		b := kubeSlice("b", "3")
		b.Endpoints = []discoveryv1.Endpoint{endpoint(new(false), "10.0.0.3"), endpoint(nil, "10.0.0.4")}
		fw.Modify(b)
		h.expectOut("10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.4:6443")

		// A change that leaves the endpoints as they are sends nothing.
		fw.Modify(kubeSlice("a", "4", "10.0.0.2", "10.0.0.1"))
		h.expectNoOut()

		fw.Delete(kubeSlice("a", "5"))
		h.expectOut("10.0.0.4:6443")

		fw.Error(errorEvent)
		synctest.Wait()
		if got := h.errorsTotal(); got != 1 {
			t.Errorf("discovery_errors_total after an error event: got %v; want 1", got)
		}
		h.openWatch()
	})
}

// --- client configuration ---

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// testKubeconfig is a kubeconfig whose server is an address the client must
// never use.
func testKubeconfig(t *testing.T, tlsServerName string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	content := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://192.0.2.10:6443
` + tlsServerName + `
users:
- name: u
  user:
    token: secret-token
contexts:
- name: ctx
  context:
    cluster: c
    user: u
current-context: ctx
`
	writeFile(t, path, content)
	return path
}

func TestKubeRESTConfig(t *testing.T) {
	saDir, tokenOnly := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(saDir, "token"), "sa-token")
	writeFile(t, filepath.Join(saDir, "ca.crt"), "not read here")
	writeFile(t, filepath.Join(tokenOnly, "token"), "sa-token")
	token, ca := filepath.Join(saDir, "token"), filepath.Join(saDir, "ca.crt")
	const local, svc = "127.0.0.1:7445", "kubernetes.default.svc"
	other := errors.New("another error")
	tests := []struct {
		name  string
		cfg   kubeProviderConfig
		saDir string
		want  []string // Host, ServerName, BearerToken, BearerTokenFile, CAFile
		err   error    // errNoKubeCredentials, other or nil
	}{
		{"kubeconfig server is replaced", kubeProviderConfig{LocalAddr: local, ServerName: svc, Kubeconfig: testKubeconfig(t, "")},
			t.TempDir(), []string{"https://" + local, svc, "secret-token", "", ""}, nil},
		{"kubeconfig server name is kept", kubeProviderConfig{LocalAddr: local, ServerName: svc,
			Kubeconfig: testKubeconfig(t, "    tls-server-name: api.example.com")},
			t.TempDir(), []string{"https://" + local, "api.example.com", "secret-token", "", ""}, nil},
		{"in-cluster files, token read from its file", kubeProviderConfig{LocalAddr: local, ServerName: svc},
			saDir, []string{"https://" + local, svc, "", token, ca}, nil},
		{"IPv6 listener", kubeProviderConfig{LocalAddr: "[::1]:7445", ServerName: svc},
			saDir, []string{"https://[::1]:7445", svc, "", token, ca}, nil},
		{"no kubeconfig, no service account", kubeProviderConfig{LocalAddr: local}, t.TempDir(), nil, errNoKubeCredentials},
		{"no kubeconfig, token without CA", kubeProviderConfig{LocalAddr: local}, tokenOnly, nil, errNoKubeCredentials},
		{"kubeconfig set but missing", kubeProviderConfig{LocalAddr: local,
			Kubeconfig: filepath.Join(t.TempDir(), "absent")}, t.TempDir(), nil, other},
		{"listener address without port", kubeProviderConfig{LocalAddr: "127.0.0.1",
			Kubeconfig: testKubeconfig(t, "")}, t.TempDir(), nil, other},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := kubeRESTConfig(tc.cfg, tc.saDir)
			if (err != nil) != (tc.err != nil) || errors.Is(err, errNoKubeCredentials) != (tc.err == errNoKubeCredentials) {
				t.Fatalf("got %v; want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if got := []string{rc.Host, rc.ServerName, rc.BearerToken, rc.BearerTokenFile, rc.CAFile}; !slices.Equal(got, tc.want) {
				t.Errorf("Host, ServerName, BearerToken, BearerTokenFile, CAFile: got %q; want %q", got, tc.want)
			}
			req, _ := http.NewRequest(http.MethodGet, rc.Host, nil)
			if u, err := rc.Proxy(req); u != nil || err != nil {
				t.Errorf("Proxy: got %v, %v; want nil, nil", u, err)
			}
		})
	}
}

// fakeSlices is the sliceClient over client-go's fake clientset.
type fakeSlices struct{ c *fake.Clientset }

func (f fakeSlices) List(ctx context.Context, ns string, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	return f.c.DiscoveryV1().EndpointSlices(ns).List(ctx, opts)
}

func (f fakeSlices) Watch(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	return f.c.DiscoveryV1().EndpointSlices(ns).Watch(ctx, opts)
}

func TestEndpointsOfKeepsAtMostTheLimit(t *testing.T) {
	var addrs []string
	for i := range maxDiscoveredEndpoints + 10 {
		addrs = append(addrs, fmt.Sprintf("10.0.%d.%d", i/200, i%200+1))
	}
	got, rejected := endpointsOf(sliceCache(kubeSlice("big", "1", addrs...)))
	if len(got) != maxDiscoveredEndpoints || len(rejected) != 10 {
		t.Fatalf("got %d endpoints and %d rejected; want %d and 10", len(got), len(rejected), maxDiscoveredEndpoints)
	}
	if !strings.HasSuffix(rejected[0], fmt.Sprintf(" (over the limit of %d)", maxDiscoveredEndpoints)) {
		t.Errorf("rejected[0] = %q; want the limit named", rejected[0])
	}
}

// publishingWatcher is a kube watcher without a client whose publish
// sends to out, logging to logs.
func publishingWatcher() (w *kubeWatcher, logs *syncBuffer, out chan []string) {
	logs, out = &syncBuffer{}, make(chan []string, 4)
	w = newKubeWatcher(nil, slog.New(slog.NewTextHandler(logs, nil)), newMetrics(prometheus.NewRegistry()), func() float64 { return 0 })
	w.publishFn = func(l []string) { out <- l }
	return w, logs, out
}

// The watcher warns of left-out addresses once per change of them, not on
// every event. It keeps the last list when the slices hold no endpoint any
// more, and warns once: sent on, an empty list would drop every discovered
// and cached endpoint for the static ones.
func TestWatcherWarnsOnce(t *testing.T) {
	w, logs, out := publishingWatcher()
	w.cache = sliceCache(kubeSlice("kubernetes", "1", "10.0.0.1", "169.254.169.254"))
	w.publish()
	w.publish()
	if got := strings.Count(logs.String(), "ignoring discovered slices or addresses"); got != 1 {
		t.Errorf("warnings of rejected addresses: got %d; want 1 in %q", got, logs.String())
	}
	if !strings.Contains(logs.String(), "169.254.169.254:6443 (link-local address)") {
		t.Errorf("log %q lacks the rejected address and its reason", logs.String())
	}
	if eps := <-out; !slices.Equal(eps, []string{"10.0.0.1:6443"}) {
		t.Fatalf("published %q; want [10.0.0.1:6443]", eps)
	}
	w.cache = sliceCache(kubeSlice("kubernetes", "2")) // every endpoint gone
	w.publish()
	w.publish()
	const warning = "kubernetes endpoints empty: keeping the last endpoint list"
	if len(out) != 0 {
		t.Errorf("published %q for empty slices; want nothing", <-out)
	}
	if got := strings.Count(logs.String(), warning); got != 1 {
		t.Errorf("warnings of empty slices: got %d; want 1 in %q", got, logs.String())
	}
	w.cache = sliceCache(kubeSlice("kubernetes", "3", "10.0.0.2"))
	w.publish()
	if eps := <-out; !slices.Equal(eps, []string{"10.0.0.2:6443"}) {
		t.Errorf("published %q once endpoints were back; want [10.0.0.2:6443]", eps)
	}
	w.cache = sliceCache()
	w.publish()
	if got := strings.Count(logs.String(), warning); got != 2 {
		t.Errorf("warnings after a second time empty: got %d; want 2", got)
	}
}

// --- merged provider ---

// scriptedProvider publishes the lists the test puts on lists; closing
// lists makes run return err.
type scriptedProvider struct {
	pname  string
	lists  chan []string
	err    error
	exited chan struct{}
}

func newScripted(name string, err error) *scriptedProvider {
	return &scriptedProvider{pname: name, lists: make(chan []string), err: err, exited: make(chan struct{})}
}

func (p *scriptedProvider) name() string { return p.pname }

func (p *scriptedProvider) run(ctx context.Context, publish func([]string)) error {
	defer close(p.exited)
	for {
		select {
		case l, ok := <-p.lists:
			if !ok {
				return p.err
			}
			publish(l)
		case <-ctx.Done():
			return nil
		}
	}
}

// stubbornProvider returns only once ctx is done and release is closed, as
// a provider still finishing a request at shutdown does.
type stubbornProvider struct{ release chan struct{} }

func (stubbornProvider) name() string { return "stubborn" }

func (p stubbornProvider) run(ctx context.Context, _ func([]string)) error {
	<-ctx.Done()
	<-p.release
	return nil
}

type mergedHarness struct {
	reg    *prometheus.Registry // m's
	m      *metrics
	mp     *mergedProvider
	d      *daemon  // its apply, called as the run loop calls it
	last   []string // the list apply last applied
	cancel context.CancelFunc
	done   chan struct{} // closed once mp.run has returned
}

// startMerged runs a merged provider over static, cached and providers
// inside the bubble, with a daemon to apply its union; the test stops it.
func startMerged(t *testing.T, static, cached []string, providers ...provider) *mergedHarness {
	reg := prometheus.NewRegistry()
	h := &mergedHarness{reg: reg, m: newMetrics(reg), done: make(chan struct{})}
	h.mp = newMergedProvider(testLogger(t), h.m, static, cached, providers...)
	// apply's pool is closed, so its update does nothing: no probe timer
	// keeps the bubble from reporting a deadlock. What apply applies is
	// what it returns.
	pl := newPool(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), poolConfig{}, nil, randomSelector{})
	pl.close()
	h.d = &daemon{log: testLogger(t), pool: pl, discovery: h.mp}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.mp.run(ctx); close(h.done) }()
	t.Cleanup(cancel)
	return h
}

// sent returns what the run loop applies once everything has settled: if
// the notify channel holds a wake-up, it takes it and calls the daemon's
// apply, as the loop does, and returns the list apply applied when that
// differs from the last one; nil otherwise.
func (h *mergedHarness) sent() []string {
	synctest.Wait()
	select {
	case <-h.mp.notify:
	default:
		return nil
	}
	applied := h.d.apply(h.last, nil)
	if slices.Equal(applied, h.last) {
		return nil
	}
	h.last = applied
	return applied
}

// wantApplied checks that the run loop, woken now, applies want.
func (h *mergedHarness) wantApplied(t *testing.T, when string, want ...string) {
	t.Helper()
	if got := h.sent(); got == nil || !slices.Equal(got, want) {
		t.Errorf("%s: applied %q; want %q", when, got, want)
	}
}

// wantNothingApplied checks that the run loop, woken now or not, applies
// nothing.
func (h *mergedHarness) wantNothingApplied(t *testing.T, when string) {
	t.Helper()
	if got := h.sent(); got != nil {
		t.Errorf("%s: applied %q; want nothing", when, got)
	}
}

func (h *mergedHarness) stop(t *testing.T) {
	t.Helper()
	h.cancel()
	<-h.done
}

func (h *mergedHarness) wantSources(t *testing.T, when string, want map[string][]string) {
	t.Helper()
	if got := h.mp.sources(); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("sources %s: got %q; want %q", when, got, want)
	}
}

func (h *mergedHarness) updates(name string) float64 {
	return testutil.ToFloat64(h.m.discoveryUpdates.WithLabelValues(name))
}
func (h *mergedHarness) errorsOf(name string) float64 {
	return testutil.ToFloat64(h.m.discoveryErrors.WithLabelValues(name))
}
func (h *mergedHarness) running(name string) float64 {
	return testutil.ToFloat64(h.m.discoveryRunning.WithLabelValues(name))
}

// The union holds each endpoint once, however many sources list it and
// however often; a list that leaves the union as it was applies nothing;
// sources names each source of an endpoint once, in the order /upstreams
// shows them; every list a provider publishes counts as an update.
func TestMergedDeduplicatesAcrossSources(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newScripted("a", nil), newScripted("b", nil)
		h := startMerged(t, []string{"10.0.0.2:6443", "10.0.0.1:6443"}, nil, a, b)
		h.wantApplied(t, "at start", "10.0.0.1:6443", "10.0.0.2:6443")
		a.lists <- []string{"10.0.0.3:6443", "10.0.0.1:6443", "10.0.0.3:6443"}
		b.lists <- []string{"10.0.0.1:6443"}
		h.wantApplied(t, "after a and b published", "10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443")
		h.wantSources(t, "after a and b published", map[string][]string{
			"10.0.0.1:6443": {staticProviderName, "a", "b"},
			"10.0.0.2:6443": {staticProviderName},
			"10.0.0.3:6443": {"a"},
		})
		a.lists <- []string{"10.0.0.3:6443", "10.0.0.2:6443"}
		h.wantNothingApplied(t, "after a list that leaves the union as it was")
		a.lists <- []string{"10.0.0.2:6443"}
		b.lists <- []string{}
		h.wantApplied(t, "after a and b shrank", "10.0.0.1:6443", "10.0.0.2:6443")
		for name, want := range map[string]float64{staticProviderName: 1, "a": 3, "b": 2} {
			if got := h.updates(name); got != want {
				t.Errorf("discovery_updates_total{%s}: got %v; want %v", name, got, want)
			}
		}
		h.stop(t)
	})
}

// The cached list stands in for discovery until the kubernetes provider
// publishes: another provider's list joins it, the first kubernetes list
// replaces it, in the union and in sources, for good.
func TestMergedCacheCountsUntilKubernetesPublishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		other, kube := newScripted("other", nil), newScripted(kubeProviderName, nil)
		h := startMerged(t, []string{"10.0.0.1:6443"}, []string{"10.0.0.9:6443", "10.0.0.1:6443"}, other, kube)
		h.wantApplied(t, "before discovery answers", "10.0.0.1:6443", "10.0.0.9:6443")
		h.wantSources(t, "before discovery answers", map[string][]string{
			"10.0.0.1:6443": {staticProviderName, cacheProviderName},
			"10.0.0.9:6443": {cacheProviderName},
		})
		other.lists <- []string{"10.0.0.3:6443"}
		h.wantApplied(t, "after another provider published", "10.0.0.1:6443", "10.0.0.3:6443", "10.0.0.9:6443")
		kube.lists <- []string{"10.0.0.2:6443"}
		h.wantApplied(t, "after kubernetes published", "10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443")
		h.wantSources(t, "after kubernetes published", map[string][]string{
			"10.0.0.1:6443": {staticProviderName},
			"10.0.0.2:6443": {kubeProviderName},
			"10.0.0.3:6443": {"other"},
		})
		kube.lists <- []string{"10.0.0.9:6443"}
		h.wantApplied(t, "after kubernetes listed the cached endpoint", "10.0.0.1:6443", "10.0.0.3:6443", "10.0.0.9:6443")
		h.wantSources(t, "after kubernetes listed the cached endpoint", map[string][]string{
			"10.0.0.1:6443": {staticProviderName},
			"10.0.0.3:6443": {"other"},
			"10.0.0.9:6443": {kubeProviderName},
		})
		h.stop(t)
	})
}

// discovery_updates_total counts the static list once, at construction,
// and the cached one once if there is one, without a series otherwise; the
// series of every provider exist at 0 before it publishes.
func TestMergedCountsUpdatesPerSource(t *testing.T) {
	tests := []struct {
		name   string
		cached []string
		want   map[string]float64 // every series of discovery_updates_total
	}{
		{"no cache", nil, map[string]float64{staticProviderName: 1, kubeProviderName: 0}},
		{"empty cache", []string{}, map[string]float64{staticProviderName: 1, kubeProviderName: 0}},
		{"cache", []string{"10.0.0.9:6443"}, map[string]float64{staticProviderName: 1, cacheProviderName: 1, kubeProviderName: 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetrics(prometheus.NewRegistry())
			newMergedProvider(testLogger(t), m, []string{"10.0.0.1:6443"}, tc.cached, newScripted(kubeProviderName, nil))
			if got := testutil.CollectAndCount(m.discoveryUpdates); got != len(tc.want) {
				t.Errorf("discovery_updates_total series: got %d; want %d (%v)", got, len(tc.want), tc.want)
			}
			for name, want := range tc.want {
				if got := testutil.ToFloat64(m.discoveryUpdates.WithLabelValues(name)); got != want {
					t.Errorf("discovery_updates_total{%s}: got %v; want %v", name, got, want)
				}
			}
		})
	}
}

// discovery_running is 1 for the static and cached lists and for every
// provider that runs, and 0 once a provider ends before shutdown, with an
// error or without; an error is counted once; shutdown leaves it as it
// was. The error series exist from the start, so increase works at once.
func TestMergedReportsRunningProviders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		failing := newScripted(kubeProviderName, errors.New("kubernetes broke"))
		quiet := newScripted("quiet", nil) // returns nil early, against the contract
		live := newScripted("live", nil)
		h := startMerged(t, []string{"10.0.0.1:6443"}, []string{"10.0.0.9:6443"}, failing, quiet, live)
		synctest.Wait()
		if got, want := testutil.CollectAndCount(h.m.discoveryErrors), 5; got != want {
			t.Errorf("discovery_errors_total series before any error: got %v; want %v", got, want)
		}
		for _, name := range []string{staticProviderName, cacheProviderName, kubeProviderName, "quiet", "live"} {
			if got := h.running(name); got != 1 {
				t.Errorf("at start, discovery_running{%s}: got %v; want 1", name, got)
			}
		}
		close(failing.lists)
		close(quiet.lists)
		synctest.Wait()
		for name, want := range map[string]float64{staticProviderName: 1, cacheProviderName: 1, kubeProviderName: 0, "quiet": 0, "live": 1} {
			if got := h.running(name); got != want {
				t.Errorf("after kubernetes failed and quiet returned, discovery_running{%s}: got %v; want %v", name, got, want)
			}
		}
		for name, want := range map[string]float64{kubeProviderName: 1, "quiet": 0, "live": 0} {
			if got := h.errorsOf(name); got != want {
				t.Errorf("discovery_errors_total{%s}: got %v; want %v", name, got, want)
			}
		}
		h.stop(t)
		for name, want := range map[string]float64{staticProviderName: 1, cacheProviderName: 1, kubeProviderName: 0, "live": 1} {
			if got := h.running(name); got != want {
				t.Errorf("after shutdown, discovery_running{%s}: got %v; want %v", name, got, want)
			}
		}
	})
}

// A provider that fails keeps its last list in the union while the others
// go on. run returns once every provider has ended, and the lists stay.
func TestMergedKeepsFailedProvidersList(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kube := newScripted(kubeProviderName, errors.New("kubernetes broke"))
		other := newScripted("other", errors.New("other broke"))
		h := startMerged(t, []string{"10.0.0.1:6443"}, nil, kube, other)
		kube.lists <- []string{"10.0.0.9:6443"}
		h.wantApplied(t, "after kubernetes published", "10.0.0.1:6443", "10.0.0.9:6443")
		close(kube.lists)
		h.wantNothingApplied(t, "after kubernetes failed")
		other.lists <- []string{"10.0.0.3:6443"}
		h.wantApplied(t, "after another provider published", "10.0.0.1:6443", "10.0.0.3:6443", "10.0.0.9:6443")
		select {
		case <-h.done:
			t.Fatal("run returned while a provider was running")
		default:
		}
		close(other.lists)
		<-h.done
		if got, want := h.mp.endpoints(), []string{"10.0.0.1:6443", "10.0.0.3:6443", "10.0.0.9:6443"}; !slices.Equal(got, want) {
			t.Errorf("union after every provider failed: got %q; want %q", got, want)
		}
	})
}

// run returns only once every provider has returned, however long one
// takes after shutdown.
func TestMergedRunWaitsForProviders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stubborn := stubbornProvider{release: make(chan struct{})}
		quick := newScripted("quick", nil)
		h := startMerged(t, []string{"10.0.0.1:6443"}, nil, quick, stubborn)
		synctest.Wait()
		h.cancel()
		<-quick.exited
		synctest.Wait()
		select {
		case <-h.done:
			t.Error("run returned while a provider was still running")
		default:
		}
		close(stubborn.release)
		<-h.done
	})
}

// The notify channel holds one wake-up at most, so that a provider never
// waits for a busy run loop: a burst of lists is one wake-up, and the loop
// then reads the latest union, missing none of it.
func TestMergedCoalescesWakeUps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newScripted("a", nil)
		h := startMerged(t, []string{"10.0.0.1:6443"}, nil, a)
		h.wantApplied(t, "at start", "10.0.0.1:6443")
		// Nobody reads notify meanwhile: a publish that waited for the
		// loop would deadlock the bubble here.
		for i := range 5 {
			a.lists <- []string{fmt.Sprintf("10.0.1.%d:6443", i+1)}
		}
		synctest.Wait()
		if got := len(h.mp.notify); got != 1 {
			t.Errorf("wake-ups pending after 5 lists: got %d; want 1", got)
		}
		h.wantApplied(t, "after the burst", "10.0.0.1:6443", "10.0.1.5:6443")
		if got := len(h.mp.notify); got != 0 {
			t.Errorf("wake-ups pending after the loop woke: got %d; want 0", got)
		}
		if got, want := h.updates("a"), 5.0; got != want {
			t.Errorf("discovery_updates_total{a}: got %v; want %v", got, want)
		}
		h.stop(t)
	})
}

// An empty union is never applied: the pool keeps its last upstreams
// rather than route to none (apply returns the list it applied).
func TestMergedNeverAppliesEmptyUnion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newScripted("a", nil)
		h := startMerged(t, nil, nil, a)
		h.wantNothingApplied(t, "without static endpoints")
		a.lists <- []string{}
		h.wantNothingApplied(t, "after an empty list")
		a.lists <- []string{"10.0.0.1:6443"}
		h.wantApplied(t, "after a list", "10.0.0.1:6443")
		a.lists <- nil
		h.wantNothingApplied(t, "after the only endpoint went away")
		h.stop(t)
	})
}
