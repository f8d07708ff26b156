package main

// Beyond the spec: an endpoint that is the proxy's own listener would make
// the proxy its own upstream, a loop that takes a connection slot at every
// hop until none is left. It is refused in --endpoints and dropped from
// discovery and the endpoint cache.

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// checkOwnListener refuses --endpoints entries that are the proxy's own
// listener, when --bind-address is an IP address or localhost.
func (c *config) checkOwnListener() error {
	if c.BindPort < 1 || c.BindPort > 65535 {
		return nil // refused as such
	}
	listen := net.JoinHostPort(c.BindAddress, strconv.Itoa(c.BindPort))
	if _, own := splitOwn(c.Endpoints, listen, localAddrs()); len(own) > 0 {
		return flagError("endpoints", "must not name this proxy's own listener %s (%s, %s), which would make it its own upstream: %s",
			listen, flagRef("bind-address"), flagRef("bind-port"), strings.Join(own, ", "))
	}
	return nil
}

// withoutOwnListener returns eps without the endpoints that are the
// listener at listen, warning of them.
func withoutOwnListener(eps []string, listen string, log *slog.Logger) []string {
	// The node's addresses are read each time: it may have gained one.
	kept, dropped := splitOwn(eps, listen, localAddrs())
	if len(dropped) > 0 {
		log.Warn("ignoring endpoints that are this proxy's own listener", "endpoints", dropped, "listen", listen)
	}
	return kept
}

// splitOwn splits eps into those that do not reach the listener at listen
// and those that do, keeping their order.
func splitOwn(eps []string, listen string, local []netip.Addr) (kept, own []string) {
	for _, e := range eps {
		if ownListener(e, listen, local) {
			own = append(own, e)
		} else {
			kept = append(kept, e)
		}
	}
	return kept, own
}

// ownListener reports whether dialling endpoint reaches the listener at
// listen, whose host is an IP address or localhost (any other reaches
// nothing). local are the addresses of this node's interfaces, which a
// wildcard listener answers on too. A hostname other than localhost is
// not resolved, and never reported.
func ownListener(endpoint, listen string, local []netip.Addr) bool {
	host, port, err := net.SplitHostPort(endpoint)
	lhost, lport, lerr := net.SplitHostPort(listen)
	if err != nil || lerr != nil || port != lport {
		return false
	}
	return slices.ContainsFunc(hostAddrs(host), func(ip netip.Addr) bool {
		return slices.ContainsFunc(hostAddrs(lhost), func(l netip.Addr) bool { return reaches(ip, l, local) })
	})
}

// reaches reports whether a connection to ip reaches a listener on listen,
// the port being the same.
func reaches(ip, listen netip.Addr, local []netip.Addr) bool {
	switch {
	case ip == listen:
		return true
	case ip.IsUnspecified():
		// Linux connects a dial to 0.0.0.0 or :: to this host.
		return listen.IsLoopback() || listen.IsUnspecified() || slices.Contains(local, listen)
	case listen.IsUnspecified():
		return ip.IsLoopback() || slices.Contains(local, ip)
	}
	return false
}

// localAddrs returns the addresses of this node's interfaces, none if they
// cannot be listed.
func localAddrs() []netip.Addr {
	addrs, _ := net.InterfaceAddrs()
	var ips []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			ips = append(ips, p.Addr().Unmap())
		}
	}
	return ips
}

// hostAddrs returns the addresses a dial to host reaches: both loopback
// addresses for localhost, fully qualified or not, the address itself
// (unmapped) for an IP address, and none for another name, which is not
// resolved.
func hostAddrs(host string) []netip.Addr {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return []netip.Addr{netip.IPv6Loopback(), netip.AddrFrom4([4]byte{127, 0, 0, 1})}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip.Unmap()}
	}
	return nil
}
