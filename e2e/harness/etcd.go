package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// etcd's gRPC gateway (JSON over HTTP on the client port) is enough to read
// the revision and compact; it keeps the etcd client library and its gRPC
// stack out of this module.

// etcdPost sends one gateway request from w1 and decodes the answer.
func (c *Cluster) etcdPost(ctx context.Context, node, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, etcdURL(node)+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Transport: &http.Transport{DialContext: c.W1.DialContext, DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s%s: %w", node, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s%s: status %d: %s", node, path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// EtcdRevision returns the current revision of the keyspace.
func (c *Cluster) EtcdRevision(ctx context.Context, node string) (int64, error) {
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// A range over one key that does not exist still returns the header.
	if err := c.etcdPost(ctx, node, "/v3/kv/range", map[string]any{"key": "AA=="}, &out); err != nil {
		return 0, err
	}
	return strconv.ParseInt(out.Header.Revision, 10, 64)
}

// EtcdCompact compacts the keyspace up to rev and waits until the
// compaction is physically applied.
func (c *Cluster) EtcdCompact(ctx context.Context, node string, rev int64) error {
	return c.etcdPost(ctx, node, "/v3/kv/compaction", map[string]any{
		"revision": strconv.FormatInt(rev, 10),
		"physical": true,
	}, nil)
}

// EtcdStatus is what a member reports about itself.
type EtcdStatus struct {
	Member       string
	Leader       string // "" or "0" while the member knows no leader
	AppliedIndex int64
}

// EtcdMemberStatus asks one member for its status.
func (c *Cluster) EtcdMemberStatus(ctx context.Context, node string) (EtcdStatus, error) {
	var out struct {
		Header struct {
			MemberID string `json:"member_id"`
		} `json:"header"`
		Leader           string `json:"leader"`
		RaftAppliedIndex string `json:"raftAppliedIndex"`
	}
	if err := c.etcdPost(ctx, node, "/v3/maintenance/status", map[string]any{}, &out); err != nil {
		return EtcdStatus{}, err
	}
	applied, _ := strconv.ParseInt(out.RaftAppliedIndex, 10, 64)
	return EtcdStatus{Member: out.Header.MemberID, Leader: out.Leader, AppliedIndex: applied}, nil
}

// WaitEtcdSettled waits until every member of cp1-cp3 answers, all agree
// on one leader, and their applied indexes are within 50 of each other: a
// member that just rejoined has caught up. A fault injected before that can
// take the majority down with it (an election between a member still
// catching up and one that is not), which is not what a scenario is about.
func (c *Cluster) WaitEtcdSettled(ctx context.Context) error {
	var last string
	for {
		settled := true
		leader := ""
		var lo, hi int64 = -1, -1
		for _, n := range CPNames {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			st, err := c.EtcdMemberStatus(sctx, n)
			cancel()
			if err != nil || st.Leader == "" || st.Leader == "0" {
				settled, last = false, fmt.Sprintf("%s: leader %q, %v", n, st.Leader, err)
				break
			}
			if leader != "" && st.Leader != leader {
				settled, last = false, fmt.Sprintf("%s sees leader %s, another member %s", n, st.Leader, leader)
				break
			}
			leader = st.Leader
			if lo < 0 || st.AppliedIndex < lo {
				lo = st.AppliedIndex
			}
			hi = max(hi, st.AppliedIndex)
		}
		if settled && hi-lo <= 50 {
			return nil
		}
		if settled {
			last = fmt.Sprintf("applied indexes %d..%d", lo, hi)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for etcd to settle: %w (last: %s)", ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
