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
