package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/harness"
)

// The restore case (-fault restore): the third API server is killed
// (SIGKILL) while the watchers run, the fleet moves its watches to the two
// others, and it is started again. Every -observe-step after the restore,
// the fleet's long-lived connections on it are counted (each daemon's
// /upstreams), once for each --rebalance-period of -rebalance-periods: with
// 0 the watches stay where the failover put them; with the rebalancer they
// find their way back.

// restoreSeries is one fleet's share of long-lived connections on the
// restored API server after its restore.
type restoreSeries struct {
	label  string
	after  []time.Duration // since the restore
	share  []float64       // on the restored server, of the fleet's long-lived connections
	on     int             // long-lived connections on the restored server at the end: moved there
	closes int             // rebalancing closes over the fleet, at the end
	failed int             // watcher dials that failed after the restore
}

// runRestores measures the first -daemon once per rebalance period.
func runRestores(ctx context.Context, o options) error {
	if len(o.daemons) == 0 {
		return errNoDaemons
	}
	if o.observeStep <= 0 {
		return fmt.Errorf("-observe-step %s: want more than 0", o.observeStep)
	}
	name, path, ok := strings.Cut(o.daemons[0], "=")
	if !ok {
		return fmt.Errorf("-daemon %q: want name=path", o.daemons[0])
	}
	var all []restoreSeries
	for p := range strings.SplitSeq(o.periods, ",") {
		period, err := time.ParseDuration(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("-rebalance-periods: %w", err)
		}
		rs := restoreSeries{label: fmt.Sprintf("%s, --rebalance-period %s", name, period)}
		err = withFaultFleet(ctx, o, path, []string{"--rebalance-period", period.String()}, func(env faultEnv) error {
			return runRestore(ctx, o, env, &rs)
		})
		if err != nil {
			return fmt.Errorf("%s: %w", rs.label, err)
		}
		all = append(all, rs)
	}
	reportRestores(o, all)
	return nil
}

// runRestore kills the last API server under the watchers, restarts it
// once the fleet has moved away, and samples the share on it.
func runRestore(ctx context.Context, o options, env faultEnv, rs *restoreSeries) error {
	var d dials
	stop, err := startWatchers(ctx, o, env.l, &d)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(5 * time.Second)
	victim := env.servers[len(env.servers)-1]
	victim.p.Kill()
	time.Sleep(o.drain + 4*o.interval + 5*time.Second)
	tlsCfg, err := controlplane.ClientTLS(env.l.CA, env.l.Admin, "")
	if err != nil {
		return err
	}
	if err := victim.start(ctx, tlsCfg); err != nil {
		return err
	}
	restored := time.Now()
	d.mu.Lock()
	failedBefore := d.failed
	d.mu.Unlock()
	for k := time.Duration(0); k*o.observeStep <= o.observe && ctx.Err() == nil; k++ {
		time.Sleep(time.Until(restored.Add(k * o.observeStep)))
		on, all, err := fleetShare(o, victim.addr)
		if err != nil {
			return err
		}
		rs.after = append(rs.after, k*o.observeStep)
		rs.share = append(rs.share, float64(on)/float64(max(all, 1)))
		rs.on = on
	}
	rs.closes, err = fleetRebalanceCloses(o)
	d.mu.Lock()
	rs.failed = d.failed - failedBefore
	d.mu.Unlock()
	return err
}

var healthClient = &http.Client{Timeout: 2 * time.Second}

// healthGet reads a path of daemon i's health server.
func healthGet(i int, path string) (*http.Response, error) {
	resp, err := healthClient.Get("http://127.0.0.1:" + strconv.Itoa(20000+2*i+1) + path)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("daemon %d %s: status %d", i, path, resp.StatusCode)
	}
	return resp, nil
}

// fleetShare counts the fleet's long-lived connections: on addr, and all.
func fleetShare(o options, addr string) (on, all int, err error) {
	for i := range o.nodes {
		resp, err := healthGet(i, "/upstreams")
		if err != nil {
			return 0, 0, err
		}
		var doc struct {
			Upstreams []struct {
				Address   string `json:"address"`
				LongLived int    `json:"long_lived_connections"`
			} `json:"upstreams"`
		}
		err = json.NewDecoder(resp.Body).Decode(&doc)
		resp.Body.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("daemon %d /upstreams: %w", i, err)
		}
		for _, u := range doc.Upstreams {
			all += u.LongLived
			if u.Address == addr {
				on += u.LongLived
			}
		}
	}
	return on, all, nil
}

// fleetRebalanceCloses adds up the fleet's rebalancing closes from each
// daemon's connections_closed_total{reason="rebalance"}.
func fleetRebalanceCloses(o options) (int, error) {
	total := 0
	for i := range o.nodes {
		resp, err := healthGet(i, "/metrics")
		if err != nil {
			return total, err
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			resp.Body.Close()
			return total, fmt.Errorf("daemon %d /metrics: %w", i, err)
		}
		total += int(harness.ParseMetrics(string(b)).Sum("extractedprism_connections_closed_total", "reason", "rebalance"))
		resp.Body.Close()
	}
	return total, nil
}

func reportRestores(o options, all []restoreSeries) {
	fmt.Printf("fault: SIGKILL to one of 3 API servers, restarted %s later; %d daemons, %d watchers each (and its discovery watch), readyz every %s\n",
		o.drain+4*o.interval+5*time.Second, o.nodes, o.watchers, o.interval)
	fmt.Println("share of the fleet's long-lived connections on the restored API server (a third is even):")
	fmt.Println()
	header, rule := "| after the restore |", "|---|"
	for _, rs := range all {
		header += " " + rs.label + " |"
		rule += "---|"
	}
	fmt.Println(header)
	fmt.Println(rule)
	for i := range all[0].after {
		line := fmt.Sprintf("| %s |", all[0].after[i].Round(time.Second))
		for _, rs := range all {
			if i < len(rs.share) {
				line += fmt.Sprintf(" %.1f%% |", 100*rs.share[i])
			} else {
				line += " |"
			}
		}
		fmt.Println(line)
	}
	fmt.Println()
	for _, rs := range all {
		fmt.Printf("%s: %d rebalancing closes, %d connections moved to the restored API server (%.2f closes per move), within 3 points of a third from %s, %d failed watcher dials after the restore\n",
			rs.label, rs.closes, rs.on, float64(rs.closes)/float64(max(rs.on, 1)), rs.evenAt(), rs.failed)
	}
}

// evenAt is when the share on the restored server first came within 3
// points of a third, or "never".
func (rs restoreSeries) evenAt() string {
	for i, sh := range rs.share {
		if math.Abs(sh-1.0/3) <= 0.03 {
			return rs.after[i].Round(time.Second).String()
		}
	}
	return "never"
}
