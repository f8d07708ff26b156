package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"
)

// The upstream protocol. The first byte a client sends picks the mode:
//
//	'E' echo: everything received, that byte included, is sent back until
//	    the client half-closes; then the upstream closes.
//	'G' generate: an 8-byte big-endian count follows; the upstream sends
//	    that many bytes and closes (the bulk download of a LIST or WATCH).
//
// A connection that closes before sending anything (a health check) is
// simply closed.
const (
	modeEcho     = 'E'
	modeGenerate = 'G'
	bulkBufSize  = 1 << 20
)

// upstream is one in-process echo/generator server on 127.0.0.1. kill
// closes its listener and every open connection, as if the process died;
// restart listens again on the same address.
type upstream struct {
	addr   string
	sndBuf int // SO_SNDBUF of the generating connections; 0 leaves autotuning

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	killed bool
}

func startUpstream(addr string, sndBuf int) (*upstream, error) {
	u := &upstream{addr: addr, sndBuf: sndBuf, conns: map[net.Conn]struct{}{}}
	if err := u.listen(); err != nil {
		return nil, err
	}
	return u, nil
}

func (u *upstream) listen() error {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", u.addr)
	if err != nil {
		return fmt.Errorf("upstream listen %s: %w", u.addr, err)
	}
	u.mu.Lock()
	u.ln, u.addr, u.killed = ln, ln.Addr().String(), false
	u.mu.Unlock()
	u.wg.Go(func() { u.acceptLoop(ln) })
	return nil
}

func (u *upstream) acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // EMFILE and the like: wait and retry
			time.Sleep(5 * time.Millisecond)
			continue
		}
		u.mu.Lock()
		if u.killed {
			u.mu.Unlock()
			_ = c.Close()
			continue
		}
		u.conns[c] = struct{}{}
		u.mu.Unlock()
		u.wg.Go(func() { u.serveConn(c) })
	}
}

func (u *upstream) serveConn(c net.Conn) {
	defer func() {
		_ = c.Close()
		u.mu.Lock()
		delete(u.conns, c)
		u.mu.Unlock()
	}()
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return
	}
	switch first[0] {
	case modeEcho:
		if _, err := c.Write(first[:]); err != nil {
			return
		}
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	case modeGenerate:
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint64(hdr[:])
		if n > math.MaxInt64 {
			return // no client asks for that much; a garbled header
		}
		if tc, ok := c.(*net.TCPConn); ok && u.sndBuf > 0 {
			_ = tc.SetWriteBuffer(u.sndBuf) // best effort: the report names the flag
		}
		generate(c, int64(n))
	}
}

var bulkPayload = func() []byte {
	b := make([]byte, bulkBufSize)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}()

func generate(c net.Conn, n int64) {
	for n > 0 {
		chunk := bulkPayload[:min(int64(len(bulkPayload)), n)]
		w, err := c.Write(chunk)
		n -= int64(w)
		if err != nil {
			return
		}
	}
}

// kill closes the listener and every open connection.
func (u *upstream) kill() {
	u.mu.Lock()
	u.killed = true
	_ = u.ln.Close()
	for c := range u.conns {
		_ = c.Close()
	}
	u.mu.Unlock()
}

// restart listens again on the same address after kill.
func (u *upstream) restart() error {
	return u.listen()
}

// close kills u and waits for its goroutines.
func (u *upstream) close() {
	u.kill()
	u.wg.Wait()
}
