package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"time"
)

// gocopyArg, as the first argument, makes the bench binary the reference
// proxy of the system sysGoCopy: `bench -gocopy-serve ADDR UP1,UP2,UP3`.
const gocopyArg = "-gocopy-serve"

// serveGoCopy is the smallest Go TCP proxy: accept, dial the next upstream
// in turn, io.Copy each way (TCPConn.ReadFrom splices TCP to TCP on Linux),
// pass each end on as a half-close. No health checks, retries or limits.
// It measures what Go's net package and the runtime cost on this machine,
// which any Go proxy pays, extractedprism included; that is its only use.
func serveGoCopy(addr string, upstreams []string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			time.Sleep(10 * time.Millisecond) // descriptors out: wait, like a real proxy
			continue
		}
		go goCopyConn(c, upstreams[i%len(upstreams)])
	}
}

// goCopyConn proxies client to addr. Both ends are TCP connections, so
// io.Copy still finds TCPConn's ReadFrom and WriteTo and splices.
func goCopyConn(client net.Conn, addr string) {
	defer client.Close()
	d := net.Dialer{Timeout: time.Second}
	up, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, client)
		closeWrite(up)
	}()
	_, _ = io.Copy(client, up)
	closeWrite(client)
	<-done
}

// closeWrite passes the end of one direction on as a half-close.
func closeWrite(c net.Conn) {
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
}

// gocopyMain runs the reference proxy when args ask for it, and reports
// whether they did.
func gocopyMain(args []string) bool {
	if len(args) == 0 || args[0] != gocopyArg {
		return false
	}
	if len(args) != 3 {
		fmt.Fprintf(os.Stderr, "bench: usage: %s ADDR UPSTREAM,...\n", gocopyArg)
		os.Exit(2)
	}
	log.Fatal(serveGoCopy(args[1], strings.Split(args[2], ",")))
	return true
}
