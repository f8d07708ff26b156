package main

// Hand-over of the listening sockets, beyond the spec: a new instance
// started while the old one runs (a DaemonSet rolling with maxSurge: 1, a
// static pod written under a new name) takes the old one's listening
// sockets instead of binding its own, which would fail, as they are on the
// same port. It asks over a unix socket (--handover-socket), gets
// duplicates of the proxy's and the health server's sockets by
// SCM_RIGHTS, and serves them; both processes accept from the same
// sockets until the old one gets SIGTERM, except that the old one stops
// taking health probes, so /readyz is the new one's, and the new one takes
// proxied connections only once its own check passed an upstream
// (steadylistener.go). The old one's close then drops
// a reference, not the socket: a connection waiting in the accept queue
// stays there for the new one. SO_REUSEPORT, the other way to overlap,
// gives each process a queue of its own, and the kernel resets what waits
// in a closing one unless net.ipv4.tcp_migrate_req is set on the node.
//
// The two keep the hand-over connection open while both run. When the new
// one stops first (a rollback), the old one serves alone again and takes
// the hand-over path back, which names the stopped one's socket; when the
// old one stops, the new one serves alone.
//
// Whoever reaches the unix socket gets the node's listening sockets, so it
// lives in a directory only the daemon's user can enter, and each side
// checks that the other runs as the same user and group (or root).

import (
	"bufio"
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
	"strings"
	"sync"
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

	// handoverHello is the message that carries the sockets. The
	// successor answers once it serves them: handoverAck, then a line of
	// handoverPorts and the ports of those it adopted, which an older
	// instance, reading only the first line, ignores.
	handoverHello = "extractedprism listeners 1\n"
	handoverAck   = "ok\n"
	handoverPorts = "ports"
)

// samePeer checks that the process at the other end of c is this daemon's:
// it runs as this process's user and group, or as root. The group counts
// too: a node's other workloads often share a user (65534, nobody), and
// any of them took the node's listening sockets. It returns the peer's
// process ID, 0 when it lives in another PID namespace.
func samePeer(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	uid, gid, pid, err := peerCred(rc)
	if err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	if uid != 0 && (uid != os.Geteuid() || gid != os.Getegid()) {
		return 0, fmt.Errorf("peer runs as %d:%d; want %d:%d, this daemon's user and group, or root",
			uid, gid, os.Geteuid(), os.Getegid())
	}
	return pid, nil
}

// takeOverOrListen takes the listeners over from the instance serving
// --handover-socket, or opens its own when none answers there, the hand-over
// fails, or the flags name other ports (an upgrade that moves a port).
func takeOverOrListen(ctx context.Context, cfg *config, log *slog.Logger) (sockets, error) {
	if err := ownDir(filepath.Dir(cfg.HandoverSocket)); err != nil {
		return sockets{}, fmt.Errorf("%s: %w", flagRef("handover-socket"), err)
	}
	lns, c, pid, err := takeOver(cfg.HandoverSocket)
	refused := errors.Is(err, syscall.ECONNREFUSED)
	if err != nil {
		log.Warn("no hand-over from the running instance; opening the listening sockets", "socket", cfg.HandoverSocket, "err", err)
	}
	if c != nil {
		if o, ok := adopt(ctx, cfg, log, c, pid, lns); ok {
			return o, nil
		}
		_ = c.Close()
	}
	o, err := listen(ctx, cfg, nil, log)
	if refused && errors.Is(err, syscall.EADDRINUSE) {
		err = fmt.Errorf("%w: the hand-over socket %s refused connections, so what holds the port cannot be asked for it: "+
			"an instance started without this --handover-socket, or of a version that does not take the path back when its successor stops; stop it",
			err, cfg.HandoverSocket)
	}
	return o, err
}

// adopt makes those of lns, the sockets of the running instance (process
// pid), that are on the flags' ports its listeners, and acknowledges them on
// c, naming their ports: an acknowledgement means they are adopted. The
// others it closes: after an upgrade that moves a port, the old port's
// socket stays the old instance's, and the new one opens its own. A shared
// proxy socket's gate stays shut (openSockets). ok false, with lns closed,
// when none is on the flags' ports or they cannot be adopted; c then gets
// no answer.
func adopt(ctx context.Context, cfg *config, log *slog.Logger, c *net.UnixConn, pid int, lns []*net.TCPListener) (o sockets, ok bool) {
	var kept []*net.TCPListener
	var ports []string
	for _, ln := range lns {
		if port := listenPort(ln); port == cfg.BindPort || port == cfg.HealthPort {
			kept, ports = append(kept, ln), append(ports, strconv.Itoa(port))
			continue
		}
		log.Info("not taking the running instance's socket: the flags name another port", "address", ln.Addr().String())
		_ = ln.Close()
	}
	if len(kept) == 0 {
		return sockets{}, false
	}
	o, err := listen(ctx, cfg, kept, log)
	if err != nil {
		log.Warn("the running instance's listening sockets are not where the flags say; opening them", "err", err)
		return sockets{}, false
	}
	o.lb.set(!o.lbPassed)
	if _, err := io.WriteString(c, handoverAck+handoverPorts+" "+strings.Join(ports, " ")+"\n"); err != nil {
		// It stopped waiting; the sockets are shared all the same, and
		// follow sees its end closed.
		log.Warn("the running instance did not wait for the hand-over's answer", "err", err)
	}
	o.predecessor = c
	msg := "took over the listening sockets from the running instance"
	if o.lbPassed {
		msg += "; it alone takes proxied connections until a check of this instance's passes an upstream"
	}
	log.Info(msg, "pid", pid, "ports", ports, "listen", o.lb.Addr().String(), "health", o.health.Addr().String())
	return o, true
}

// listenPort returns the port ln, a TCP listener, listens on.
func listenPort(ln net.Listener) int {
	return ln.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // every listener here is a TCP one
}

// takeOver asks the instance serving path for its listening sockets. It
// returns them with the connection to acknowledge them on, and the
// instance's process ID (0 in another PID namespace); no connection when
// nothing listens there.
func takeOver(path string) (lns []*net.TCPListener, c *net.UnixConn, pid int, err error) {
	conn, err := (&net.Dialer{Timeout: handoverTimeout}).Dial("unix", path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, 0, nil // no instance has run here
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, nil, 0, fmt.Errorf("the instance that made the hand-over socket has stopped: %w", err)
	case err != nil:
		return nil, nil, 0, err
	}
	c = conn.(*net.UnixConn) //nolint:forcetypeassert // a unix dial's
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
		closeAll(lns...)
		return nil, err
	}
	return lns, nil
}

// handover serves hand-overs of the daemon's listening sockets on its unix
// socket, path. openSockets makes it; daemon.run owns it and runs serve.
type handover struct {
	path string
	ln   *net.UnixListener // serve's first
	log  *slog.Logger
	lb   *steadyListener // the proxy's listener
	// health is the health server's listener, shut while a successor
	// serves it: each probe then reaches the successor.
	health *steadyListener
	// given is set by serve while a successor serves the proxy's socket
	// too; run reads it at the stop (listeners.go).
	given atomic.Bool
}

// bindOver listens on a fresh unix socket renamed over path, replacing
// whatever is there: the newest instance is the one to ask.
func bindOver(path string) (*net.UnixListener, error) {
	tmp := path + "." + rand.Text()[:8]
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = ln.Close() // which removes tmp
		return nil, err
	}
	// Once a successor renames its socket over path, the path is its own;
	// a stopping daemon must not remove it.
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// serve hands the sockets to each instance that asks, one at a time, until
// ctx is done, and shares them with each successor for as long as it runs
// (share). When share takes the path back, its listener replaces ln, which
// serve closes.
func (h *handover) serve(ctx context.Context) {
	for ln := h.ln; ln != nil; {
		sl := newSteadyListener(ln, h.log, "hand-over socket ", new(atomic.Int64))
		stop := context.AfterFunc(ctx, func() { _ = sl.Close() })
		for ln = nil; ln == nil; {
			c, err := sl.Accept()
			if err != nil {
				break // closed
			}
			uc := c.(*net.UnixConn) //nolint:forcetypeassert // a unix listener's
			taken, pid, err := h.give(uc)
			if err != nil {
				h.log.Warn("hand-over of the listening sockets failed; this instance keeps serving them alone", "err", err)
			}
			if len(taken) > 0 {
				ln = h.share(ctx, uc, taken, pid)
			}
			_ = c.Close()
		}
		stop()
		_ = sl.Close()
	}
}

// give sends the sockets over c and returns those the successor answered
// it adopted, with its process ID.
func (h *handover) give(c *net.UnixConn) (taken []*steadyListener, pid int, err error) {
	if pid, err = samePeer(c); err != nil {
		return nil, 0, err
	}
	_ = c.SetDeadline(time.Now().Add(handoverTimeout))
	var fds []int
	socks := []*steadyListener{h.lb, h.health}
	for _, s := range socks {
		f, err := s.Listener.(*net.TCPListener).File() //nolint:forcetypeassert // every listener here is a TCP one
		if err != nil {
			return nil, 0, err
		}
		defer f.Close()
		fds = append(fds, int(f.Fd()))
	}
	if _, _, err := c.WriteMsgUnix([]byte(handoverHello), unix.UnixRights(fds...), nil); err != nil {
		return nil, 0, err
	}
	ports, err := readAck(c)
	if err != nil {
		return nil, 0, fmt.Errorf("the new instance (pid %d) did not take the sockets: %w", pid, err)
	}
	for _, s := range socks {
		if ports == nil || slices.Contains(ports, strconv.Itoa(listenPort(s))) {
			taken = append(taken, s)
		}
	}
	return taken, pid, nil
}

// readAck reads the successor's answer: "ok", then the ports of the
// sockets it adopted (a port that is no number names none). Ports are nil
// after an instance of an older version, which answers "ok" alone, having
// taken both, and closes the connection.
func readAck(c *net.UnixConn) ([]string, error) {
	r := bufio.NewReaderSize(c, 64)
	line, err := r.ReadSlice('\n') // bounded, unlike ReadString
	if err != nil || string(line) != handoverAck {
		return nil, fmt.Errorf("it answered %q: %w", line, err)
	}
	if line, err = r.ReadSlice('\n'); errors.Is(err, io.EOF) && len(line) == 0 {
		return nil, nil
	}
	fields := strings.Fields(string(line))
	if err != nil || len(fields) < 2 || fields[0] != handoverPorts {
		return nil, fmt.Errorf("it answered %q: %w", line, err)
	}
	return fields[1:], nil
}

// share holds the hand-over connection c while the successor serves taken
// too. This instance takes no health probe meanwhile, so each reaches the
// successor, whose readiness is its own. Once the successor's end closes
// while this instance is not stopping (a rollback stopped it), this one
// serves alone again and takes the path back: the path names the
// successor's socket, which refuses once it has stopped, and every later
// instance would fail to bind the ports this one holds. It returns the
// listener on the path taken back, nil if it did not take it back.
func (h *handover) share(ctx context.Context, c *net.UnixConn, taken []*steadyListener, pid int) *net.UnixListener {
	h.given.Store(slices.Contains(taken, h.lb))
	h.health.set(!slices.Contains(taken, h.health))
	addrs := make([]string, len(taken))
	for i, s := range taken {
		addrs[i] = s.Addr().String()
	}
	msg := "handed the listening sockets to a new instance, but not the proxy's: this one serves it alone, and SIGTERM closes its connections at once"
	if h.given.Load() {
		msg = "handed the listening sockets to a new instance, which serves them too; SIGTERM now stops this one without refusing a connection"
	}
	h.log.Info(msg, "pid", pid, "taken", addrs)
	if !awaitClose(ctx, c) {
		return nil
	}
	h.given.Store(false)
	h.health.set(true)
	ln, err := bindOver(h.path)
	if err != nil {
		h.log.Error("the new instance is gone, and taking the hand-over socket back failed: the next instance will not find this one", "pid", pid, "err", err)
		return nil
	}
	h.log.Info("the new instance is gone: serving the listening sockets alone again, and the hand-over socket is this instance's again", "pid", pid)
	return ln
}

// awaitClose waits until the peer of c closes it, or ctx is done, and
// reports whether the peer closed it.
func awaitClose(ctx context.Context, c *net.UnixConn) bool {
	_ = c.SetReadDeadline(time.Time{})
	defer context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })()
	_, _ = io.Copy(io.Discard, c)
	return ctx.Err() == nil
}

// follow holds the connection to the instance that handed the sockets
// over for as long as both run: its closing tells that instance that this
// one is gone (share). Once that instance is gone, this one serves alone,
// as a fresh start does.
func (d *daemon) follow(ctx context.Context) {
	defer d.predecessor.Close()
	if awaitClose(ctx, d.predecessor) {
		d.log.Info("the instance that handed the sockets over has closed the hand-over connection (it stopped, or is of an older version): serving them as a fresh start does")
		d.lb.set(true)
	}
}

// openShared returns check, which opens the shared proxy socket's gate once
// a check of this instance's passed an upstream: a successor with none
// usable must not take clients from the instance it took over from, which
// serves them. Any other proxy socket's gate is open.
func (d *daemon) openShared(check checkFunc) checkFunc {
	open := sync.OnceFunc(func() {
		if !d.lb.isOpen() {
			d.log.Info("an upstream passed this instance's check: accepting proxied connections on the shared socket")
			d.lb.set(true)
		}
	})
	return func(ctx context.Context, addr string) checkResult {
		res := check(ctx, addr)
		if res.err == nil && res.notReady == nil {
			open()
		}
		return res
	}
}
