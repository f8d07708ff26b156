package main

// Beyond the spec: at the bound, the owner of the most slots gives one up.
// Silent connections give way (idle.go), but a connection that trickles a
// byte now and then is never silent for long: 140 connections of one uid,
// each sending a byte every 20 s, held all 128 slots of `ulimit -n 1024`,
// and every other client on the node, the kubelet's among them, waited in
// the backlog until it gave up (issue 44). So when every slot is taken, a
// client waits and no silent connection qualifies:
//
//   - The connections are counted by owner: for a client on this node, the
//     uid of its socket; for any other, its IP address.
//   - The owner holding the most slots gives one up, the one that goes
//     first by idle.go's order (never spoken, then silent longest), if it
//     holds at least two. Between owners holding as many, that order
//     decides too.
//   - Root (uid 0: the kubelet, kube-proxy, the CNI agent) is trusted and
//     never gives up a slot this way.
//
// What it costs: at the bound, a non-root client that holds the most
// connections (a monitoring agent, an operator on the host network; all
// clients of a remote host behind one address) loses one for each client
// that waits, and reconnects into the same queue. A client with one
// connection never loses it, and a waiting client of the owner of the most
// slots only replaces one of that owner's own. Someone must wait at the
// bound; taking from whoever holds the most is the choice by which no
// single owner but root can hold the node's API path.
//
// The owners are looked up only when a client waits at the bound, one
// socket at a time (see socketUIDs); the data path never looks. Outside
// Linux there is no TCP_INFO, so no candidate, and nothing is closed.

import (
	"net"
	"net/netip"
	"strconv"
)

// reasonShare is the reason of idleConnsClosed for a connection closed by
// this rule.
const reasonShare = "share"

// rootOwner is the owner of the trusted clients' connections.
const rootOwner = "uid 0"

// sockPair names a socket by its local and remote address, IPv4 unmapped.
type sockPair struct{ local, remote netip.AddrPort }

// clientSocket names the socket at the other end of c: its local address
// is c's remote one. One of no TCP connection is the zero sockPair: its
// addresses do not parse. Both come unmapped, as net.IP writes an
// IPv4-mapped address as an IPv4 one.
func clientSocket(c net.Conn) sockPair {
	remote, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	return sockPair{local: remote, remote: local}
}

// shareVictim returns the connection of cands that gives way by this rule,
// its owner and how many slots the owner holds; nil when none does. cands
// are in the order they give way (see candidates), and owners[i] is the
// owner of cands[i] (see ownersOf); nil, where they are not known, closes
// none.
func shareVictim(cands []idleCandidate, owners []string) (victim *idleCandidate, owner string, held int) {
	slots := make(map[string]int, len(owners))
	most := 2 // an owner with a single slot keeps it
	for _, o := range owners {
		if o != rootOwner {
			slots[o]++
			most = max(most, slots[o])
		}
	}
	for i, o := range owners {
		if slots[o] == most {
			return &cands[i], o, most
		}
	}
	return nil, "", 0
}

// ownersOf returns the owner of each candidate's connection: the uid of
// its client's socket where this node's network namespace has it, else the
// client's address; nil if the sockets could not be looked up, lest every
// local client, root's too, count as one owner, its address.
func ownersOf(cands []idleCandidate) []string {
	socks := make([]sockPair, len(cands))
	for i, c := range cands {
		socks[i] = clientSocket(c.pc.client)
	}
	uids := socketUIDs(socks)
	if uids == nil {
		return nil
	}
	out := make([]string, len(cands))
	for i, sp := range socks {
		out[i] = sp.local.Addr().String()
		if uids[i] >= 0 {
			out[i] = "uid " + strconv.Itoa(uids[i])
		}
	}
	return out
}
