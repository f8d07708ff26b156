// Command demo brings up the local control plane (three etcd members and
// three API servers in network namespaces) with extractedprism in front of
// it in the worker namespace, prints the commands to try through
// 127.0.0.1:7445 and the commands that inject each fault, and tears
// everything down on Ctrl-C. It needs root and the binaries from
// e2e/build-binaries.sh.
//
//	go run ./cmd/demo                               # tcp/random
//	go run ./cmd/demo -health-check readyz          # once the daemon has it
//
// While it runs, it also reads commands on standard input: kill cpN,
// start cpN, blackhole cpN, partition cpN, heal cpN, compact,
// restart-daemon, status, help.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
	"github.com/extractedprism/extractedprism/e2e/harness"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type demo struct {
	c      *harness.Cluster
	dcfg   harness.DaemonConfig
	d      *harness.Daemon
	dir    string
	stdout io.Writer
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	healthCheck := fs.String("health-check", "tcp", "tcp or readyz")
	selection := fs.String("upstream-selection", "random", "random or latency")
	binary := fs.String("extractedprism", "", "prebuilt daemon binary (default: build the module above the working directory)")
	dirFlag := fs.String("dir", "", "directory for logs and certificates (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := harness.Preflight(); err != nil {
		return err
	}
	dir := *dirFlag
	if dir == "" {
		d, err := os.MkdirTemp("", "ep-e2e-demo-")
		if err != nil {
			return err
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logf := func(format string, a ...any) { fmt.Printf("demo: "+format+"\n", a...) }
	bin := *binary
	if bin == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		src, err := harness.FindSource(wd)
		if err != nil {
			return err
		}
		logf("building extractedprism from %s", src)
		if bin, err = harness.BuildDaemon(ctx, src, dir); err != nil {
			return err
		}
	}
	bins, err := controlplane.DefaultBinaries()
	if err != nil {
		return err
	}
	logf("starting the control plane (about a minute on two cores); logs in %s", dir)
	c, err := harness.StartCluster(ctx, harness.ClusterOptions{Dir: dir, Binaries: bins, Logf: logf})
	if err != nil {
		return err
	}
	defer c.Close()
	var static []string
	for _, n := range harness.CPNames {
		static = append(static, harness.APIAddr(n))
	}
	dm := &demo{c: c, dir: dir, stdout: os.Stdout, dcfg: harness.DaemonConfig{
		Binary:    bin,
		Mode:      harness.Mode{HealthCheck: *healthCheck, Selection: *selection},
		Settings:  harness.DefaultSettings,
		Endpoints: static,
		LogPath:   filepath.Join(dir, "extractedprism.log"),
	}}
	if dm.d, err = c.StartDaemon(ctx, dm.dcfg); err != nil {
		return err
	}
	defer func() { _ = dm.d.Stop() }()
	kubeconfig := filepath.Join(dir, "w1.kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, "https://"+harness.ProxyAddr, "", c.CA.CertFile(), c.Admin); err != nil {
		return err
	}
	dm.printHelp(kubeconfig)

	lines := make(chan string)
	go readLines(os.Stdin, lines)
	for {
		fmt.Print("demo> ")
		select {
		case <-ctx.Done():
			fmt.Println("\ndemo: tearing down")
			return nil
		case line, ok := <-lines:
			if !ok {
				// No terminal: wait for the signal.
				lines = nil
				continue
			}
			dm.command(ctx, strings.Fields(line))
		}
	}
}

// readLines forwards standard input; it ends with the process, as nothing
// can interrupt a blocked read of a terminal.
func readLines(r io.Reader, out chan<- string) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		out <- s.Text()
	}
	close(out)
}

func (dm *demo) printHelp(kubeconfig string) {
	c := dm.c
	w1 := c.W1.NS
	ca := c.CA.CertFile()
	fmt.Fprintf(dm.stdout, `
extractedprism runs in namespace %[1]s on 127.0.0.1:7445 (health 127.0.0.1:7446),
in front of cp1-cp3 = 192.0.2.11-13:6443. Logs: %[2]s

Try it (from another shell, as root):
  ip netns exec %[1]s curl --cacert %[3]s https://127.0.0.1:7445/version
  ip netns exec %[1]s curl --cacert %[3]s --cert %[4]s --key %[5]s https://127.0.0.1:7445/api/v1/namespaces
  ip netns exec %[1]s kubectl --kubeconfig %[6]s get endpointslices -n default
  ip netns exec %[1]s curl -s http://127.0.0.1:7446/metrics | grep '^extractedprism_'
  tail -f %[7]s

Faults (shell commands; or type the words in brackets here):
  [kill cp1]       kill -KILL <pid of kube-apiserver in %[8]s-cp1>   (ip netns pids %[8]s-cp1)
  [start cp1]      restarts it (only from here)
  [blackhole cp1]  ip -n %[8]s-hub link set h-cp1 down      (and "up" to undo)
  [partition cp1]  ip netns exec %[8]s-cp1 nft -f - <<< 'table inet epe2e { chain i { type filter hook input priority 0; tcp dport 2380 drop; tcp sport 2380 drop; } chain o { type filter hook output priority 0; tcp dport 2380 drop; tcp sport 2380 drop; } }'
  [heal cp1]       link up and: ip netns exec %[8]s-cp1 nft delete table inet epe2e
  [compact]        ip netns exec %[1]s curl -s -X POST http://192.0.2.11:2379/v3/kv/range -d '{"key":"AA=="}'   (header.revision = N)
                   ip netns exec %[1]s curl -s -X POST http://192.0.2.11:2379/v3/kv/compaction -d '{"revision":"N","physical":true}'
  [restart-daemon] stops and starts extractedprism with the same flags
  [status]         the daemon's upstream metrics
Ctrl-C tears everything down.
`, w1, dm.dir, ca, c.Admin.Cert, c.Admin.Key, kubeconfig, dm.dcfg.LogPath, c.Net.Prefix())
}

func (dm *demo) command(ctx context.Context, f []string) {
	if len(f) == 0 {
		return
	}
	node := ""
	if len(f) > 1 {
		node = f[1]
	}
	var err error
	switch f[0] {
	case "kill":
		err = dm.c.KillAPIServer(node)
	case "start":
		err = dm.c.StartAPIServer(node)
	case "blackhole":
		err = dm.c.BlackHole(node, true)
	case "partition":
		err = dm.c.Partition(ctx, node, true)
	case "heal":
		if err = dm.c.BlackHole(node, false); err == nil {
			err = dm.c.Partition(ctx, node, false)
		}
	case "compact":
		var rev int64
		if rev, err = dm.c.EtcdRevision(ctx, "cp1"); err == nil {
			err = dm.c.EtcdCompact(ctx, "cp1", rev)
			fmt.Fprintf(dm.stdout, "compacted at revision %d\n", rev)
		}
	case "restart-daemon":
		_ = dm.d.Stop()
		start := time.Now()
		dm.d, err = dm.c.StartDaemon(ctx, dm.dcfg)
		fmt.Fprintf(dm.stdout, "restarted in %s\n", time.Since(start).Round(time.Millisecond))
	case "status":
		var s harness.Samples
		if s, err = dm.d.Metrics(); err == nil {
			for _, smp := range s {
				if strings.HasPrefix(smp.Name, "extractedprism_upstream") || strings.HasPrefix(smp.Name, "extractedprism_health") ||
					strings.HasPrefix(smp.Name, "extractedprism_discovery") {
					fmt.Fprintf(dm.stdout, "%s %v %v\n", smp.Name, smp.Labels, smp.Value)
				}
			}
		}
	case "help":
		dm.printHelp(filepath.Join(dm.dir, "w1.kubeconfig"))
	default:
		err = fmt.Errorf("unknown command %q; try help", f[0])
	}
	if err != nil {
		fmt.Fprintln(dm.stdout, "error:", err)
	}
}
