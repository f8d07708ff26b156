package main

// Beyond the spec: the bound on proxied connections. Without it a local
// process opening connections until the daemon runs out of descriptors or
// memory would stop it serving, or get it killed with every proxied
// connection on the node. At the bound, new clients wait in the listen
// backlog (the proxy takes a slot before it accepts).

const (
	// fdsPerConn is what one proxied connection holds: its two sockets and,
	// for each direction waiting for bytes, the splice pipe (two
	// descriptors) Go's io.Copy keeps between TCP sockets. Where no pipe can
	// be had, Go copies through user space instead.
	fdsPerConn = 6
	// fdReserve descriptors are never used for proxied connections, so the
	// health server (healthMaxConns of them), the probes and discovery keep
	// working while clients hold every other descriptor.
	fdReserve = 256

	// memPerConn is what the memory bound counts per connection, all of it
	// charged to the cgroup: an idle one takes about 17 KiB of the process's
	// memory (three goroutine stacks and their state) and about 44 KiB of
	// the kernel's, two sockets and the rings of the two splice pipes, which
	// Go sizes for 1 MiB. The pipes of closed connections wait in Go's pool
	// for the next ones until the garbage collector closes them, so memory
	// and descriptors follow the peak, which this bound caps. memReserve is
	// kept for the rest of the daemon, which idles at about 17 MiB. The
	// bound is never below fewConnections: a memory limit that small still
	// runs an idle daemon, whose node agents need a few dozen.
	memPerConn = 64 << 10
	memReserve = 24 << 20

	// fewConnections is the bound below which start-up warns.
	fewConnections = 64

	// What sets the bound, as start-up logs it.
	limitByFiles  = "open files"
	limitByMemory = "memory"
)

// maxConnections returns the bound on proxied connections and what sets
// it: the open-files limit nofile or, where it is lower, the memory limit
// of the process's cgroup (0 for none), less memReserve and never below
// fewConnections.
func maxConnections(nofile, memory uint64) (int, string) {
	byFiles := 1
	if nofile > fdReserve+fdsPerConn {
		byFiles = int(min((nofile-fdReserve)/fdsPerConn, 1<<20))
	}
	byMemory := fewConnections
	if memory > memReserve+fewConnections*memPerConn {
		byMemory = int(min((memory-memReserve)/memPerConn, 1<<20))
	}
	if memory != 0 && byMemory < byFiles {
		return byMemory, limitByMemory
	}
	return byFiles, limitByFiles
}
