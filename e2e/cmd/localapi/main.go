// Command localapi starts one etcd and one kube-apiserver on 127.0.0.1
// (no root, no namespaces), prints the admin kubeconfig path and waits for
// Ctrl-C. For trying things against a real API server by hand; tests use
// controlplane.ForTest instead.
//
//	go run ./cmd/localapi
//	kubectl --kubeconfig <printed path> apply --server-side --dry-run=server -f deploy.yaml
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/extractedprism/extractedprism/e2e/controlplane"
)

func main() {
	dir := flag.String("dir", "", "directory for certificates, data and logs (default: a new temporary directory)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := controlplane.StartLocal(ctx, controlplane.LocalOptions{Dir: *dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "localapi:", err)
		os.Exit(1)
	}
	fmt.Printf("API server: https://%s\nkubeconfig: %s\nlogs:       %s\nCtrl-C stops it.\n", l.Addr, l.Kubeconfig, l.Dir)
	<-ctx.Done()
	l.Stop()
}
