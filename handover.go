package main

// Hand-over of the listening sockets, beyond the spec: a new instance
// started while the old one runs (a DaemonSet rolling with maxSurge: 1, a
// static pod written under a new name) takes the old one's listening
// sockets instead of binding its own, which would fail, as they are on the
// same port. It asks over a unix socket (--handover-socket), gets
// duplicates of the proxy's and the health server's sockets by
// SCM_RIGHTS, and serves them; both processes accept from the same
// sockets until the old one gets SIGTERM. The old one's close then drops
// a reference, not the socket: a connection waiting in the accept queue
// stays there for the new one. SO_REUSEPORT, the other way to overlap,
// gives each process a queue of its own, and the kernel resets what waits
// in a closing one unless net.ipv4.tcp_migrate_req is set on the node.
//
// Whoever reaches the unix socket gets the node's listening sockets, so it
// lives in a directory only the daemon's user can enter, and each side
// checks that the other runs as the same user (or root).

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// handoverTimeout bounds each side's part of one hand-over.
	handoverTimeout = 2 * time.Second
	// handoverSpread is the window over which a daemon that has handed
	// its sockets over closes its connections after SIGTERM, each once
	// its client has been answered; the rest are force-closed a second
	// later. The successor already serves, so the clients reconnect to it
	// spread over the window, not all in the same instant, and the whole
	// stop fits well within a pod's default terminationGracePeriodSeconds
	// (30 s).
	handoverSpread = 10 * time.Second

	// handoverHello is the message that carries the sockets; handoverAck
	// the successor's answer once it serves them.
	handoverHello = "extractedprism listeners 1\n"
	handoverAck   = "ok\n"
)

// samePeer checks that the process at the other end of c runs as this
// process's user or as root, and returns its process ID, 0 when it lives in
// another PID namespace.
func samePeer(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	uid, pid, err := peerCred(rc)
	if err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	if uid != os.Geteuid() && uid != 0 {
		return 0, fmt.Errorf("peer runs as uid %d; want uid %d or root", uid, os.Geteuid())
	}
	return pid, nil
}

// takeOverOrListen takes the listeners over from the instance serving
// --handover-socket, or opens its own when none answers there, the hand-over
// fails, or the sockets handed over are not on the addresses the flags name
// (an upgrade that moves a port).
func takeOverOrListen(ctx context.Context, cfg *config, log *slog.Logger) (lb, health net.Listener, err error) {
	if err := ownDir(filepath.Dir(cfg.HandoverSocket)); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", flagRef("handover-socket"), err)
	}
	lns, c, pid, err := takeOver(cfg.HandoverSocket)
	if err != nil {
		log.Warn("no hand-over from the running instance; opening the listening sockets", "socket", cfg.HandoverSocket, "err", err)
	}
	if c == nil {
		lb, health, _, err = listen(ctx, cfg, nil)
		return lb, health, err
	}
	defer c.Close()
	lns = onPorts(lns, log, cfg.BindPort, cfg.HealthPort)
	if lb, health, _, err = listen(ctx, cfg, lns); err != nil {
		log.Warn("the running instance's listening sockets are not where the flags say; opening them", "err", err)
		lb, health, _, err = listen(ctx, cfg, nil)
		return lb, health, err
	}
	if _, err := io.WriteString(c, handoverAck); err != nil {
		// It stopped waiting; the sockets are shared all the same.
		log.Warn("the running instance did not wait for the hand-over's answer", "err", err)
	}
	log.Info("took over the listening sockets from the running instance", "pid", pid,
		"listen", lb.Addr().String(), "health", health.Addr().String())
	return lb, health, nil
}

// onPorts keeps the listeners on ports and closes the others: after an
// upgrade that moves a port, the old port's socket stays the old
// instance's, and the new one opens its own.
func onPorts(lns []*net.TCPListener, log *slog.Logger, ports ...int) []*net.TCPListener {
	var kept []*net.TCPListener
	for _, ln := range lns {
		if tcp, ok := ln.Addr().(*net.TCPAddr); ok && slices.Contains(ports, tcp.Port) {
			kept = append(kept, ln)
			continue
		}
		log.Info("not taking the running instance's socket: the flags name another port", "address", ln.Addr().String())
		_ = ln.Close()
	}
	return kept
}

// takeOver asks the instance serving path for its listening sockets. It
// returns them with the connection to acknowledge them on, and the
// instance's process ID (0 in another PID namespace); no connection when
// nothing listens there.
func takeOver(path string) (lns []*net.TCPListener, c *net.UnixConn, pid int, err error) {
	conn, err := (&net.Dialer{Timeout: handoverTimeout}).Dial("unix", path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil, 0, nil // no instance runs; a path left behind refuses
	}
	if err != nil {
		return nil, nil, 0, err
	}
	c, ok := conn.(*net.UnixConn)
	if !ok {
		_ = conn.Close()
		return nil, nil, 0, fmt.Errorf("%s is not a unix socket", path)
	}
	if pid, err = samePeer(c); err == nil {
		_ = c.SetDeadline(time.Now().Add(handoverTimeout))
		lns, err = readListeners(c)
	}
	if err != nil {
		_ = c.Close()
		return nil, nil, 0, err
	}
	return lns, c, pid, nil
}

// readListeners reads the hand-over message and the two listening sockets
// that come with it.
func readListeners(c *net.UnixConn) ([]*net.TCPListener, error) {
	buf := make([]byte, len(handoverHello)+1)
	oob := make([]byte, unix.CmsgSpace(3*4)) // room for one more than sent, to see extras
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	for _, m := range msgs {
		got, perr := unix.ParseUnixRights(&m)
		err = errors.Join(err, perr)
		fds = append(fds, got...)
	}
	var lns []*net.TCPListener
	for i, fd := range fds {
		ln, lerr := tcpListenerFrom(uintptr(fd), "socket "+strconv.Itoa(i+1)+" of the running instance")
		err = errors.Join(err, lerr)
		if ln != nil {
			lns = append(lns, ln)
		}
	}
	if err == nil && (string(buf[:n]) != handoverHello || len(lns) != 2 || flags&unix.MSG_CTRUNC != 0) {
		err = fmt.Errorf("unexpected hand-over message %q with %d sockets", buf[:n], len(fds))
	}
	if err != nil {
		closeAll(lns)
		return nil, err
	}
	return lns, nil
}

// handover serves hand-overs of the daemon's listening sockets on its unix
// socket. daemon.run owns it and runs serve.
type handover struct {
	ln    *net.UnixListener
	log   *slog.Logger
	socks []net.Listener // the proxy's and the health server's
	// given is set by serve once a successor serves the sockets; run reads
	// it at the stop.
	given atomic.Bool
}

// listenHandover serves hand-overs of socks on path, replacing whatever is
// there: the newest instance is the one to ask.
func listenHandover(path string, log *slog.Logger, socks ...net.Listener) (*handover, error) {
	tmp := path + "." + rand.Text()[:8]
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagRef("handover-socket"), err)
	}
	// Once a successor renames its socket over path, the path is its own;
	// a stopping daemon must not remove it. One left behind refuses
	// connections, which a starting daemon takes for no instance running.
	ln.SetUnlinkOnClose(false)
	if err := os.Rename(tmp, path); err != nil {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("%s: %w", flagRef("handover-socket"), err)
	}
	return &handover{ln: ln, log: log, socks: socks}, nil
}

// serve hands the sockets to each instance that asks, one at a time, until
// ctx is done.
func (h *handover) serve(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { _ = h.ln.Close() })
	defer stop()
	for {
		c, err := h.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			h.log.Warn("hand-over socket accept failed", "err", err)
			await(ctx.Done(), acceptBackoffMax)
			continue
		}
		if err := h.give(c); err != nil {
			h.log.Warn("hand-over of the listening sockets failed; this instance keeps serving them", "err", err)
		}
		_ = c.Close()
	}
}

// give sends the sockets over c and waits for the successor's answer that
// it serves them.
func (h *handover) give(c *net.UnixConn) error {
	pid, err := samePeer(c)
	if err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(handoverTimeout))
	var fds []int
	for _, s := range h.socks {
		fl, ok := s.(interface{ File() (*os.File, error) })
		if !ok {
			return fmt.Errorf("the listener on %s has no descriptor to pass", s.Addr())
		}
		f, err := fl.File()
		if err != nil {
			return err
		}
		defer f.Close()
		fds = append(fds, int(f.Fd()))
	}
	if _, _, err := c.WriteMsgUnix([]byte(handoverHello), unix.UnixRights(fds...), nil); err != nil {
		return err
	}
	ack := make([]byte, len(handoverAck))
	if _, err := io.ReadFull(c, ack); err != nil {
		return fmt.Errorf("the new instance did not take the sockets: %w", err)
	}
	if string(ack) != handoverAck {
		return fmt.Errorf("the new instance did not take the sockets: it answered %q", ack)
	}
	h.given.Store(true)
	h.log.Info("handed the listening sockets to a new instance, which serves them too; SIGTERM now stops this one without refusing a connection",
		"pid", pid)
	return nil
}
