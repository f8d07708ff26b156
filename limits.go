package main

import (
	"context"
	"time"
)

// Beyond the spec: the bound on proxied connections. Without it a local
// process opening connections until the daemon runs out of descriptors or
// memory would stop it serving, or get it killed with every proxied
// connection on the node. At the bound, new clients wait in the listen
// backlog (the proxy takes a slot before it accepts), and a silent
// connection (idle.go) or one of the owner of the most slots
// (fairshare.go) gives way to the first.

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
	// charged to the cgroup, at worst: a client that never reads while it
	// sends to an upstream that never reads, so that both directions stall.
	// An idle connection takes idleMemPerConn. A stalled direction adds
	// what the kernel queues for it: its source socket's receive queue, up
	// to twice sockRcvBuf (the kernel doubles the setting for its
	// overhead), and its destination's send queue, sockNotsentLowat unsent
	// and one segment of up to 64 KiB past that mark, which the kernel
	// checks only as it starts a segment. TestSockMemStalledClientsBounded
	// measures 1.29 MiB of socket memory per connection so stalled, of the
	// 1.44 MiB counted; without the buffer bounds a client that only did not
	// read pinned 19 MiB. What a stalled copy leaves in its splice pipe (up
	// to 1 MiB, 0.2 MiB on average) is not charged: those are the socket's
	// pages, uncharged as they leave its receive queue (16 MiB spliced into
	// pipes in a memory cgroup added only the pipes' rings to its usage).
	// The pipes of closed connections wait in Go's pool for the next ones
	// until the garbage collector closes them, so memory and descriptors
	// follow the peak, which this bound caps. memReserve is kept for the
	// rest of the daemon, which idles at about 17 MiB. The bound is never
	// below fewConnections: a memory limit that small still runs an idle
	// daemon, whose node agents need a few dozen.
	memPerConn = idleMemPerConn + 2*(2*sockRcvBuf+sockNotsentLowat+(64<<10))
	memReserve = 24 << 20
	// idleMemPerConn is about 17 KiB of the process's memory (three
	// goroutine stacks and their state) and about 44 KiB of the kernel's,
	// two sockets and the rings of the two splice pipes, which Go sizes for
	// 1 MiB.
	idleMemPerConn = 64 << 10

	// sockRcvBuf and sockNotsentLowat bound what a proxied socket queues for
	// a peer that does not read (setRcvBuf, setNotsentLowat). A fixed
	// receive buffer caps a stream at about its window, 0.5 to 0.9 times
	// twice sockRcvBuf, per round trip: 2 to 4 Gbit/s at a LAN's 1 ms,
	// 10 Gbit/s and more at 0.2 ms; on loopback the proxy keeps its pace
	// (bench/). Twice this size would halve the connection bound, below
	// fewConnections at the chart's 128 MiB. A kernel whose
	// net.core.rmem_max is lower (212992 by default) gives less.
	sockRcvBuf       = 256 << 10
	sockNotsentLowat = 128 << 10

	// fewConnections is the bound below which start-up warns.
	fewConnections = 64

	// What sets the bound, as start-up logs it.
	limitByFiles  = "open files"
	limitByMemory = "memory"
)

// maxConnections returns the bound on proxied connections and what sets
// it: the open-files limit nofile or, where it is lower, the memory limit
// of the process's cgroup (0 for none), less memReserve and never below
// fewConnections; the bound by files is at least 1.
func maxConnections(nofile, memory uint64) (int, string) {
	// Raised to the floor first, so that neither subtraction wraps.
	byFiles := int(min((max(nofile, fdReserve+fdsPerConn)-fdReserve)/fdsPerConn, 1<<20))
	byMemory := int(min((max(memory, memReserve+fewConnections*memPerConn)-memReserve)/memPerConn, 1<<20))
	if memory != 0 && byMemory < byFiles {
		return byMemory, limitByMemory
	}
	return byFiles, limitByFiles
}

// takeSlot takes a connection slot for the client just accepted. While
// every slot is in use, it closes a silent connection for it where one
// qualifies (see idle.go) and waits for a slot, looking again every
// reclaimPoll; the clients after it wait in the listen backlog meanwhile.
// It reports false once ctx ends.
func (p *proxy) takeSlot(ctx context.Context) bool {
	select {
	case p.slots <- struct{}{}:
		return true
	default:
	}
	if _, due := p.limitWarn.note(time.Now()); due {
		p.log.Warn("at the connection limit: new clients wait in the listen backlog until a connection ends or a silent one is closed for them; raise the open-files or memory limit for more",
			"limit", cap(p.slots))
	}
	for {
		p.reclaim()
		select {
		case p.slots <- struct{}{}:
			return true
		case <-ctx.Done():
			return false
		case <-time.After(reclaimPoll):
		}
	}
}
