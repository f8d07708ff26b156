package harness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// firstFailedReadyz keeps polling past passing answers and reports when
// the first failed one arrived, even while earlier polls still hang.
func TestFirstFailedReadyz(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n := calls.Add(1); {
		case n <= 3:
		case n == 4: // an answer slower than the polls: the next one fails first
			select {
			case <-r.Context().Done():
			case <-time.After(time.Second):
			}
		default:
			http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	first, errText := firstFailedReadyz(ctx, srv.Client(), strings.TrimPrefix(srv.URL, "https://"))
	if first.IsZero() || errText != "status 500" {
		t.Fatalf("first failure at %v (%q); want one with status 500", first, errText)
	}
	if took := first.Sub(start); took < 4*readyzPollEvery-readyzPollEvery/2 || took > time.Second {
		t.Errorf("first failure %s after the start; want about 4 polls (%s), before the slow answer", took, 4*readyzPollEvery)
	}
	if ctx.Err() != nil {
		t.Errorf("firstFailedReadyz returned at the context's end, not at the first failure")
	}
}
