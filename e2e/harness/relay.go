package harness

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// relay is a TCP forwarder inside w1: an extra address that answers like
// an API server because it forwards to one. The compaction scenario
// publishes it in an EndpointSlice to watch discovery add and remove an
// upstream without starting another API server.
type relay struct {
	ln       net.Listener
	target   string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex // guards conns and closed
	conns    map[net.Conn]struct{}
	closed   bool
}

func startRelay(c *Cluster, listen, target string) (*relay, error) {
	ln, err := c.W1.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target, dial: c.W1.DialContext, conns: map[net.Conn]struct{}{}}
	r.wg.Go(r.acceptLoop)
	return r, nil
}

func (r *relay) acceptLoop() {
	for {
		conn, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.accepted.Add(1)
		r.wg.Go(func() { r.forward(conn) })
	}
}

// track registers a connection for Close; after Close it closes it instead
// and returns false.
func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

func (r *relay) forward(client net.Conn) {
	defer client.Close()
	if !r.track(client) {
		return
	}
	defer r.untrack(client)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	up, err := r.dial(ctx, "tcp", r.target)
	cancel()
	if err != nil {
		return
	}
	defer up.Close()
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	done := make(chan struct{}, 2)
	go copyHalf(up, client, done)
	go copyHalf(client, up, done)
	<-done
	<-done
}

func copyHalf(dst, src net.Conn, done chan<- struct{}) {
	_, _ = io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	done <- struct{}{}
}

// Close stops accepting, closes every relayed connection and waits.
func (r *relay) Close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
