package harness

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/netns"
	"github.com/extractedprism/extractedprism/e2e/proc"
)

func TestScratchEtcd(t *testing.T) {
	bins := controlplane.Binaries{Etcd: "/root/.cache/extractedprism-e2e/v1.37.2/etcd"}
	dir := t.TempDir()
	n, err := netns.New("", Subnet)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c := &Cluster{Dir: dir, Net: n, bins: bins, cps: map[string]*cpNode{}, logf: t.Logf}
	c.W1, _ = n.AddNode("w1", nodeAddr["w1"])
	var initial []string
	for _, name := range CPNames {
		initial = append(initial, name+"=http://"+nodeAddr[name].String()+":2380")
	}
	var ps []*proc.Process
	for _, name := range CPNames {
		node, err := n.AddNode(name, nodeAddr[name])
		if err != nil {
			t.Fatal(err)
		}
		args := controlplane.EtcdArgs(bins.Etcd, controlplane.EtcdConfig{
			Name: name, DataDir: filepath.Join(dir, name),
			ListenClient: []string{etcdURL(name), "http://127.0.0.1:2379"}, AdvertiseClient: etcdURL(name),
			ListenPeer: "http://" + nodeAddr[name].String() + ":2380", AdvertisePeer: "http://" + nodeAddr[name].String() + ":2380",
			InitialCluster: strings.Join(initial, ","), ClusterToken: "x",
		})
		p, err := proc.Start(name, filepath.Join(dir, name+".log"), append(node.Command(), args...), nil)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		c.cps[name] = &cpNode{name: name, node: node, etcd: p}
	}
	defer func() {
		for _, p := range ps {
			p.Kill()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	for _, name := range CPNames {
		if err := controlplane.WaitEtcdHealthy(ctx, c.W1.DialContext, etcdURL(name)); err != nil {
			t.Fatal(err, ps[0].Tail(2000))
		}
	}
	t.Logf("healthy after %s", time.Since(t0))
	rev, err := c.EtcdRevision(ctx, "cp1")
	t.Logf("rev %d %v", rev, err)
	if err := c.EtcdCompact(ctx, "cp1", rev); err != nil {
		t.Error(err)
	}
	if err := c.Partition(ctx, "cp1", true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := c.Partition(ctx, "cp1", false); err != nil {
		t.Fatal(err)
	}
	if err := c.Partition(ctx, "cp1", false); err != nil {
		t.Fatal(err)
	}
}
