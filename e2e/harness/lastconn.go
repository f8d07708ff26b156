package harness

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
)

// The quorum rows time the daemon against the API server itself: from the
// victim's first failed /readyz to the daemon's last new connection to it.
// Requests sent to it before its /readyz fails are lost whatever a
// balancer does; the window after it is the daemon's.
const (
	readyzPollEvery = 100 * time.Millisecond
	dialPollEvery   = 50 * time.Millisecond
	// lastConnSlack is what the daemon may take beyond one probe interval
	// from the victim's first failed /readyz to its last new connection
	// there: the 100 ms.
	lastConnSlack = 100 * time.Millisecond
	mDials        = "extractedprism_upstream_dial_duration_seconds_count"
)

// lastConn is what watchLastConn saw of the victim.
type lastConn struct {
	// firstFailed is when the first failed answer to a /readyz poll
	// arrived (zero if none did); firstErr is what it was.
	firstFailed time.Time
	firstErr    string
	// lastDial is the first metrics poll that saw the victim's count of
	// successful dials at its final value (zero if it never rose).
	lastDial time.Time
	dials    int // successful dials to the victim while watched
}

// watchLastConn polls, until ctx ends, the victim's /readyz directly
// (not through the daemon) every readyzPollEvery and the daemon's count
// of successful dials to it every dialPollEvery. The result is ready
// once ctx has ended.
func (rr *rowRun) watchLastConn(ctx context.Context, victim string) (func() lastConn, error) {
	tlsCfg, err := controlplane.ClientTLS(rr.r.C.CA, rr.r.C.Admin, "")
	if err != nil {
		return nil, err
	}
	client := &http.Client{
		Transport: &http.Transport{DialContext: rr.r.C.W1.DialContext, TLSClientConfig: tlsCfg},
		// What the daemon's probe gives it: a slower answer fails there.
		Timeout: rr.settings().HealthTimeout,
	}
	var lc lastConn
	var wg sync.WaitGroup
	wg.Go(func() { lc.firstFailed, lc.firstErr = firstFailedReadyz(ctx, client, victim) })
	wg.Go(func() { lc.lastDial, lc.dials = rr.lastDialTo(ctx, victim) })
	return func() lastConn {
		wg.Wait()
		client.CloseIdleConnections()
		return lc
	}, nil
}

// firstFailedReadyz starts a GET /readyz on addr every readyzPollEvery,
// without waiting for the one before (an API server whose etcd check
// hangs answers late), and returns when the first failed answer arrived.
func firstFailedReadyz(ctx context.Context, client *http.Client, addr string) (time.Time, string) {
	var mu sync.Mutex // guards first, firstErr
	var first time.Time
	var firstErr string
	var polls sync.WaitGroup
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	t := time.NewTicker(readyzPollEvery)
	defer t.Stop()
	for pctx.Err() == nil {
		polls.Go(func() {
			err := getReadyz(pctx, client, addr)
			if err == nil || pctx.Err() != nil {
				return
			}
			mu.Lock()
			if first.IsZero() {
				first, firstErr = time.Now(), err.Error()
				stop()
			}
			mu.Unlock()
		})
		select {
		case <-pctx.Done():
		case <-t.C:
		}
	}
	polls.Wait()
	return first, firstErr
}

func getReadyz(ctx context.Context, client *http.Client, addr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// lastDialTo scrapes the daemon's metrics every dialPollEvery until ctx
// ends and returns the first scrape that saw the count of successful
// dials to addr at its last value, and how much it rose.
func (rr *rowRun) lastDialTo(ctx context.Context, addr string) (time.Time, int) {
	var last time.Time
	start, prev := -1.0, -1.0
	t := time.NewTicker(dialPollEvery)
	defer t.Stop()
	for ctx.Err() == nil {
		if s, err := rr.d.Metrics(); err == nil {
			if v, ok := s.Get(mDials, "upstream", addr); ok {
				if start < 0 {
					start = v
				} else if v > prev {
					last = time.Now()
				}
				prev = v
			}
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return last, int(prev - start)
}

// reportLastConn notes the victim's first failed /readyz and the time
// from it to the daemon's last new connection there (X); with readyz it
// asserts X <= one probe interval plus lastConnSlack, plus dialPollEvery
// for the scrape that saw the dial. The daemon's jitter only shortens an
// interval, and a probe that hangs (the API server runs its etcd check
// for at most one /readyz a second, and the probe that draws it waits)
// turns new connections away after 50 ms (upstream.go's slowProbe).
func (rr *rowRun) reportLastConn(victim string, lc lastConn) {
	s := rr.settings()
	readyz := rr.row.Mode.HealthCheck == "readyz"
	bound := s.HealthInterval + lastConnSlack + dialPollEvery
	if readyz {
		rr.asserts(fmt.Sprintf("first failed /readyz of the victim -> the daemon's last new connection to it <= one probe interval (%s) + %s (+ %s, the metrics poll): %s",
			s.HealthInterval, lastConnSlack, dialPollEvery, bound))
	}
	if lc.firstFailed.IsZero() {
		if readyz {
			rr.fail("%s never failed /readyz while watched", victim)
		}
		rr.note("%s never failed /readyz while watched; %d new connections to it", victim, lc.dials)
		return
	}
	rr.note("%s's first failed /readyz (polled directly every %s) %s after the fault: %s",
		victim, readyzPollEvery, ms(lc.firstFailed.Sub(rr.fault)), firstLine(lc.firstErr))
	if lc.lastDial.IsZero() {
		rr.note("first failed /readyz -> last new connection: none to %s after the fault", victim)
		return
	}
	x := lc.lastDial.Sub(lc.firstFailed)
	rr.note("first failed /readyz -> last new connection: %s (%d new connections to %s after the fault, the last %s after it)",
		signedMs(x), lc.dials, victim, ms(lc.lastDial.Sub(rr.fault)))
	if readyz && x > bound {
		rr.fail("the daemon's last new connection to %s came %s after its first failed /readyz; want <= %s", victim, ms(x), bound)
	}
}

// signedMs is ms for a duration that may be negative.
func signedMs(d time.Duration) string {
	if d < 0 {
		return "-" + ms(-d)
	}
	return ms(d)
}
