// Package netns builds a small test network out of Linux network namespaces:
// one hub namespace holding a bridge, and one namespace per node joined to
// the bridge by a veth pair. It needs root and the `ip` command (iproute2).
//
// Nothing is created in the namespace the tests run in: every link is made
// inside the hub or a node namespace, so a crashed run leaves only
// namespaces behind, and Sweep removes those (and the processes in them) on
// the next run.
//
// Namespace names are "<prefix>-<pid>-<random>-<node>", so two runs never
// collide and a sweep can tell a stale run (its pid is gone) from a live one.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultPrefix starts every namespace name this package creates.
const DefaultPrefix = "epe2e"

// Available reports why namespaces cannot be used here, or nil if they can.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("not root: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("the ip command (iproute2) is missing: %w", err)
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("no network namespace support: %w", err)
	}
	name := fmt.Sprintf("%s-probe-%d", DefaultPrefix, os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	_ = exec.Command("ip", "netns", "del", name).Run()
	return nil
}

// Net is one run's network: a hub namespace with a bridge and the nodes
// attached to it. Its methods are safe for concurrent use.
type Net struct {
	prefix string // "<prefix>-<pid>-<random>"
	hub    string // hub namespace name
	subnet netip.Prefix

	mu    sync.Mutex // guards nodes
	nodes map[string]*Node
}

// Node is one namespace attached to the bridge.
type Node struct {
	Name string     // short name, such as "cp1"
	NS   string     // namespace name
	IP   netip.Addr // address on the bridge
	MAC  net.HardwareAddr
	hub  string // hub-side veth name
	fd   int    // open handle on the namespace, for setns
}

// New creates the hub namespace and its bridge for the given subnet, such
// as 192.0.2.0/24. Call Close to remove everything.
func New(prefix string, subnet netip.Prefix) (*Net, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	n := &Net{
		prefix: fmt.Sprintf("%s-%d-%s", prefix, os.Getpid(), hex.EncodeToString(b[:])),
		subnet: subnet,
		nodes:  map[string]*Node{},
	}
	n.hub = n.prefix + "-hub"
	steps := [][]string{
		{"netns", "add", n.hub},
		{"-n", n.hub, "link", "set", "lo", "up"},
		{"-n", n.hub, "link", "add", "name", "br0", "type", "bridge"},
		{"-n", n.hub, "link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Prefix is the name prefix shared by this run's namespaces.
func (n *Net) Prefix() string { return n.prefix }

// AddNode creates a namespace for a node with the given address, attaches
// it to the bridge and gives every node a permanent neighbour entry for
// every other one. The permanent entries matter for black-hole tests: with
// a link down, a peer without one fails its dials at once with "no route to
// host" after ARP gives up, instead of timing out like a real dead host.
func (n *Net) AddNode(name string, addr netip.Addr) (*Node, error) {
	if !n.subnet.Contains(addr) {
		return nil, fmt.Errorf("node %s: %s is outside %s", name, addr, n.subnet)
	}
	a4 := addr.As4()
	node := &Node{
		Name: name,
		NS:   n.prefix + "-" + name,
		IP:   addr,
		MAC:  net.HardwareAddr{0x02, 0xe2, a4[0], a4[1], a4[2], a4[3]},
		hub:  "h-" + name,
	}
	cidr := netip.PrefixFrom(addr, n.subnet.Bits()).String()
	steps := [][]string{
		{"netns", "add", node.NS},
		{"-n", node.NS, "link", "set", "lo", "up"},
		{"-n", n.hub, "link", "add", "name", node.hub, "type", "veth", "peer", "name", "eth0", "netns", node.NS},
		{"-n", n.hub, "link", "set", node.hub, "master", "br0"},
		{"-n", n.hub, "link", "set", node.hub, "up"},
		{"-n", node.NS, "link", "set", "eth0", "address", node.MAC.String()},
		{"-n", node.NS, "addr", "add", cidr, "dev", "eth0"},
		{"-n", node.NS, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
	}
	fd, err := unix.Open("/run/netns/"+node.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("node %s: open namespace: %w", name, err)
	}
	node.fd = fd

	n.mu.Lock()
	defer n.mu.Unlock()
	for _, other := range n.nodes {
		if err := permanentNeighbour(other, node); err != nil {
			return nil, err
		}
		if err := permanentNeighbour(node, other); err != nil {
			return nil, err
		}
	}
	n.nodes[name] = node
	return node, nil
}

func permanentNeighbour(on, peer *Node) error {
	return ip("-n", on.NS, "neigh", "replace", peer.IP.String(), "lladdr", peer.MAC.String(),
		"dev", "eth0", "nud", "permanent")
}

// Node returns the node with the given short name, or nil.
func (n *Net) Node(name string) *Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nodes[name]
}

// SetLink takes the hub side of a node's veth down or up. Down, the node is
// black-holed: its packets go nowhere and nothing reaches it, but no peer
// gets an error, just silence.
func (n *Net) SetLink(name string, up bool) error {
	node := n.Node(name)
	if node == nil {
		return fmt.Errorf("no node %s", name)
	}
	state := "down"
	if up {
		state = "up"
	}
	return ip("-n", n.hub, "link", "set", node.hub, state)
}

// RemoveNode kills the processes left in a node's namespace and deletes it.
func (n *Net) RemoveNode(name string) error {
	n.mu.Lock()
	node := n.nodes[name]
	delete(n.nodes, name)
	n.mu.Unlock()
	if node == nil {
		return nil
	}
	_ = unix.Close(node.fd)
	return removeNamespace(node.NS)
}

// Close removes every namespace of this run, killing the processes in them.
func (n *Net) Close() error {
	n.mu.Lock()
	names := make([]string, 0, len(n.nodes))
	for name := range n.nodes {
		names = append(names, name)
	}
	n.mu.Unlock()
	var errs []error
	for _, name := range names {
		errs = append(errs, n.RemoveNode(name))
	}
	errs = append(errs, removeNamespace(n.hub))
	return errors.Join(errs...)
}

// Exec returns a command that runs argv inside the node's namespace.
func (node *Node) Exec(argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", node.NS}, argv...)...)
}

// Command returns the argv prefix that runs a program inside the node's
// namespace.
func (node *Node) Command() []string {
	return []string{"ip", "netns", "exec", node.NS}
}

// DialContext dials from inside the node's namespace. It is a drop-in
// net.Dialer.DialContext for http.Transport, client-go and grpc.
//
// A socket belongs to the namespace of the thread that created it, so the
// dial runs on a goroutine locked to its own OS thread that has entered the
// namespace. The thread goes back to the original namespace afterwards; if
// that fails, the goroutine exits still locked and the runtime discards the
// thread rather than reuse it in the wrong namespace.
func (node *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := node.Do(func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen opens a listener inside the node's namespace.
func (node *Node) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := node.Do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// Do runs fn on an OS thread that is inside the node's namespace. Sockets
// fn creates belong to the namespace for good; fn must not start goroutines
// that create sockets, since those run on other threads.
func (node *Node) Do(fn func() error) error {
	done := make(chan error, 1)
	go node.doLocked(fn, done)
	return <-done
}

func (node *Node) doLocked(fn func() error, done chan<- error) {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		done <- fmt.Errorf("open own network namespace: %w", err)
		return
	}
	defer unix.Close(orig)
	if err := unix.Setns(node.fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		done <- fmt.Errorf("enter namespace %s: %w", node.NS, err)
		return
	}
	err = fn()
	if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	done <- err
}

// Sweep removes the namespaces, and kills the processes in them, that an
// earlier run with this prefix left behind: those whose creating process no
// longer exists. Live runs are left alone.
func Sweep(prefix string) []error {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return []error{fmt.Errorf("ip netns list: %w", err)}
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		name := fields[0]
		rest, ok := strings.CutPrefix(name, prefix+"-")
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil {
			continue // the probe namespace of Available, or not ours
		}
		if processExists(pid) {
			continue
		}
		if err := removeNamespace(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// removeNamespace kills every process inside the namespace (they were
// started by this package's users) and deletes it.
func removeNamespace(name string) error {
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return ip("netns", "del", name)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
