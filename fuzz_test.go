package main

// Fuzz targets for the code that reads untrusted or operator-written input:
// endpoint spellings, the command line and environment, the endpoint cache
// file, EndpointSlices from the API server, and the latency arithmetic that
// orders upstreams (the cgroup files: FuzzCgroupMemoryLimit). Each
// target checks properties rather than examples, so a crash or a broken
// invariant found by `go test -fuzz` lands in testdata/fuzz/<FuzzName>/ and
// from then on runs with every plain `go test`, like the committed seeds.
//
// A short run for CI takes one target at a time, for each Fuzz function:
//
//	go test -run '^$' -fuzz '^FuzzNormalizeEndpoint$' -fuzztime 20s .

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkEndpointForm reports what is wrong with e as a canonical endpoint, or
// "" when nothing is: host:port that net.SplitHostPort accepts, a decimal
// port in 1-65535 without leading zeros, and a host that is an IP address in
// netip's spelling, not IPv4-mapped (as discovery spells it, so a static
// endpoint and a discovered one are one upstream), or a lower-case RFC 1123
// hostname.
func checkEndpointForm(e string) string {
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return "net.SplitHostPort: " + err.Error()
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		return "port " + strconv.Quote(port) + " is not a canonical number in 1-65535"
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.String() != host {
			return "IP " + strconv.Quote(host) + " is not spelled as netip prints it, " + strconv.Quote(addr.String())
		}
		if addr.Is4In6() {
			return "IP " + strconv.Quote(host) + " is IPv4-mapped"
		}
		return ""
	}
	if !validHostname(host) || strings.ToLower(host) != host {
		return "host " + strconv.Quote(host) + " is neither an IP nor a lower-case hostname"
	}
	return ""
}

func FuzzNormalizeEndpoint(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1:6443", "[fd00::1]:6443", "[FD00:0::1]:06443", "[::ffff:10.0.0.1]:6443",
		"API.Example.COM:443", "localhost:1", "[fe80::1%eth0]:6443", "10.0.0.256:6443",
		"fd00::1", "https://10.0.0.1:6443", ":6443", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536",
		"10.0.0.1:+1", "10.0.0.1:-1", "a..b:1", "-a:1", "a-:1", "123:1", "[10.0.0.1]:1", "",
		"[::1%]:1", "[::1%a:b]:1", "x:1:2", "\x00:1", "é.example:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := normalizeEndpoint(s)
		if err != nil {
			if n != "" {
				t.Errorf("normalizeEndpoint(%q): got %q with error %v; want \"\" with an error", s, n, err)
			}
			return
		}
		if problem := checkEndpointForm(n); problem != "" {
			t.Errorf("normalizeEndpoint(%q) = %q: %s", s, n, problem)
		}
		again, err := normalizeEndpoint(n)
		if err != nil || again != n {
			t.Errorf("normalizeEndpoint(%q) = %q; normalizing that again: got %q, %v; want %q, nil", s, n, again, err, n)
		}
		// Normalizing changes the spelling, never the address or port.
		inHost, inPort, _ := net.SplitHostPort(s)
		outHost, outPort, _ := net.SplitHostPort(n)
		if a, _ := strconv.ParseUint(inPort, 10, 16); strconv.FormatUint(a, 10) != outPort {
			t.Errorf("normalizeEndpoint(%q) = %q: got port %s; want %d", s, n, outPort, a)
		}
		if in, err := netip.ParseAddr(inHost); err == nil {
			if out, err := netip.ParseAddr(outHost); err != nil || out != in.Unmap() {
				t.Errorf("normalizeEndpoint(%q) = %q: got host %s; want %s", s, n, outHost, in.Unmap())
			}
		} else if !strings.EqualFold(inHost, outHost) {
			t.Errorf("normalizeEndpoint(%q) = %q: got host %s; want %s in any case", s, n, outHost, inHost)
		}
	})
}

// splitFuzzArgs turns a fuzz string into arguments: split on NUL when it has
// one, so arguments may hold spaces, and on spaces otherwise.
func splitFuzzArgs(s string) []string {
	if strings.Contains(s, "\x00") {
		return strings.Split(s, "\x00")
	}
	return strings.Fields(s)
}

// parseFuzzEnv reads "K=V" lines; a line without "=" sets K to "".
func parseFuzzEnv(s string) map[string]string {
	env := map[string]string{}
	for line := range strings.SplitSeq(s, "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	return env
}

// leafErrors returns the errors err joins, recursively, or err itself.
func leafErrors(err error) []error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var leaves []error
	for _, e := range joined.Unwrap() {
		leaves = append(leaves, leafErrors(e)...)
	}
	return leaves
}

// unnamedError reports what is wrong with msg as one of parseConfig's
// errors, or "" when nothing is: each names its flag and variable, or is
// the flag package's complaint about the command line with the pointer to
// --help, or names the stray argument.
func unnamedError(msg string) string {
	switch {
	case strings.HasPrefix(msg, "--") && strings.Contains(msg, " (EP_"):
	case strings.HasPrefix(msg, "EP_") && strings.Contains(msg, " (--"):
	case strings.HasSuffix(msg, " (--help lists the flags)"):
	case strings.HasPrefix(msg, "unexpected argument "):
	default:
		return "names no flag and variable"
	}
	// The flag package's words for a value it refused: every value goes
	// through a lenientValue, which never refuses.
	if strings.HasPrefix(msg, "invalid value ") || strings.HasPrefix(msg, "invalid boolean value ") {
		return "is the flag package's refusal of a value"
	}
	return ""
}

func FuzzParseConfig(f *testing.F) {
	seeds := []struct{ args, env string }{
		{"--endpoints 10.0.0.1:6443", ""},
		{"", "EP_ENDPOINTS=10.0.0.1:6443,[fd00::1]:6443"},
		{"--endpoints=a.example:1,b.example:2 --bind-port 1 --health-port 2", "EP_HEALTH_INTERVAL=2s\nEP_HEALTH_TIMEOUT=1s"},
		{"--endpoints 10.0.0.1:6443 --health-timeout 30s", ""},
		{"--endpoints\x0010.0.0.1:6443, 10.0.0.2:6443\x00--log-level\x00fatal", ""},
		{"--health-check readyz --endpoints 10.0.0.1:6443", "EP_HEALTH_CHECK_CA_FILE=/ca.crt"},
		{"--endpoints=10.0.0.1:6443,,", "EP_BIND_PORT=x\nEP_ENABLE_DISCOVERY=maybe"},
		{"--help", ""},
		{"--version", "EP_VERSION=true"},
		{"--endpoints 10.0.0.1:6443 extra", ""},
		{"--health-bind-address= --endpoints 10.0.0.1:6443", "EP_BIND_ADDRESS=::1"},
		{"--endpoints [::ffff:10.0.0.1]:6443 --drain-timeout -1s", "EP_LIVENESS_THRESHOLD=1s"},
		{"-endpoints=10.0.0.1:1 -upstream-selection=latency", "EP_HEALTH_CHECK_CERT_FILE=/c"},
		{"--bind-port seven --health-interval=abc --enable-discovery=maybe --endpoints 10.0.0.1:6443", "EP_HEALTH_PORT=0x1d1d"},
		{"--no-such-flag --bind-port", ""},
	}
	for _, s := range seeds {
		f.Add(s.args, s.env)
	}
	f.Fuzz(func(t *testing.T, argText, envText string) {
		args := splitFuzzArgs(argText)
		env := parseFuzzEnv(envText)
		var read []string
		getenv := func(k string) string {
			read = append(read, k)
			return env[k]
		}
		var out bytes.Buffer
		cfg, err := parseConfig(slices.Clone(args), getenv, &out)
		for _, k := range read {
			if !strings.HasPrefix(k, "EP_") {
				t.Errorf("parseConfig read variable %q; want only EP_ variables", k)
			}
		}
		// Two parses of the same input agree: no hidden state.
		cfg2, err2 := parseConfig(slices.Clone(args), func(k string) string { return env[k] }, new(bytes.Buffer))
		if !reflect.DeepEqual(cfg, cfg2) || (err == nil) != (err2 == nil) {
			t.Errorf("second parse: got %+v, %v; want %+v, %v", cfg2, err2, cfg, err)
		}
		if err != nil {
			if cfg != nil {
				t.Errorf("parseConfig returned a config with error %v", err)
			}
			shown := errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown)
			if got := out.Len() > 0; got != shown {
				t.Errorf("output written: got %v; want %v (err %v, output %q)", got, shown, err, out.String())
			}
			if err.Error() == "" {
				t.Error("empty error message")
			}
			if !shown {
				for _, e := range leafErrors(err) {
					if problem := unnamedError(e.Error()); problem != "" {
						t.Errorf("error %q: %s", e, problem)
					}
				}
			}
			return
		}
		if out.Len() != 0 {
			t.Errorf("output of a successful parse: got %q; want none", out.String())
		}
		if len(cfg.Endpoints) == 0 {
			t.Error("valid config without endpoints")
		}
		for _, e := range cfg.Endpoints {
			if problem := checkEndpointForm(e); problem != "" {
				t.Errorf("endpoint %q: %s", e, problem)
			}
		}
		again := *cfg
		again.Endpoints = slices.Clone(cfg.Endpoints)
		if err := again.validate(); err != nil {
			t.Fatalf("validate() of a config parseConfig accepted: got %v; want nil", err)
		}
		if !reflect.DeepEqual(&again, cfg) {
			t.Errorf("validate() changed an accepted config: got %+v; want %+v", again, *cfg)
		}
	})
}

// fuzzBytes hands out fuzz input a piece at a time; an exhausted input
// reads as zeros, so every input builds something.
type fuzzBytes struct{ b []byte }

func (f *fuzzBytes) byte() byte {
	if len(f.b) == 0 {
		return 0
	}
	c := f.b[0]
	f.b = f.b[1:]
	return c
}

// pick returns a choice in [0, n).
func (f *fuzzBytes) pick(n int) int { return int(f.byte()) % n }

// str returns up to 15 raw bytes as a string.
func (f *fuzzBytes) str() string {
	n := min(f.pick(16), len(f.b))
	s := string(f.b[:n])
	f.b = f.b[n:]
	return s
}

var (
	fuzzSliceNames   = []string{"kubernetes", "kubernetes-x1", "", "kubernetes"}
	fuzzAddressTypes = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN, "", "IPv5"}
	fuzzPortNames    = []*string{nil, new("https"), new("http"), new(""), new("HTTPS")}
	fuzzPortValues   = []*int32{nil, new(int32(6443)), new(int32(443)), new(int32(0)), new(int32(-1)),
		new(int32(1)), new(int32(65535)), new(int32(65536)), new(int32(math.MaxInt32)), new(int32(math.MinInt32))}
	fuzzReadiness = []*bool{nil, new(true), new(false)}
	// fuzzAddresses are plain, odd and invalid spellings; the fuzzer adds
	// raw ones (see fuzzSlices).
	fuzzAddresses = []string{
		"10.0.0.1", "10.0.0.2", "fd00::1", "FD00:0:0::1", "::1", "0:0::1", "fe80::1%eth0",
		"010.0.0.1", "10.0.0.256", "kube.example", "", " 10.0.0.1", "10.0.0.1:6443", "[::1]", "0.0.0.0",
		"::ffff:10.0.0.1",
	}
)

// fuzzSlices builds up to four EndpointSlices, each with up to three ports
// and four endpoints of up to three addresses, from fuzz input.
func fuzzSlices(data []byte) map[string]*discoveryv1.EndpointSlice {
	in := &fuzzBytes{data}
	cache := map[string]*discoveryv1.EndpointSlice{}
	for range in.pick(5) {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fuzzSliceNames[in.pick(len(fuzzSliceNames))]},
			AddressType: fuzzAddressTypes[in.pick(len(fuzzAddressTypes))],
		}
		for range in.pick(4) {
			s.Ports = append(s.Ports, discoveryv1.EndpointPort{
				Name: fuzzPortNames[in.pick(len(fuzzPortNames))],
				Port: fuzzPortValues[in.pick(len(fuzzPortValues))],
			})
		}
		for range in.pick(5) {
			ep := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{
				Ready:       fuzzReadiness[in.pick(len(fuzzReadiness))],
				Serving:     fuzzReadiness[in.pick(len(fuzzReadiness))],
				Terminating: fuzzReadiness[in.pick(len(fuzzReadiness))],
			}}
			for range in.pick(4) {
				if c := in.pick(len(fuzzAddresses) + 1); c < len(fuzzAddresses) {
					ep.Addresses = append(ep.Addresses, fuzzAddresses[c])
				} else {
					ep.Addresses = append(ep.Addresses, in.str())
				}
			}
			s.Endpoints = append(s.Endpoints, ep)
		}
		// Same-named slices replace each other, as in the watcher's cache.
		cache[s.Name] = s
	}
	return cache
}

// fuzzSlicePorts returns the ports a slice may lend its endpoints: a valid
// port named "https", or the only port if it is valid.
func fuzzSlicePorts(s *discoveryv1.EndpointSlice) []int32 {
	valid := func(p discoveryv1.EndpointPort) bool { return p.Port != nil && *p.Port >= 1 && *p.Port <= 65535 }
	var ports []int32
	for _, p := range s.Ports {
		if valid(p) && p.Name != nil && *p.Name == "https" {
			ports = append(ports, *p.Port)
		}
	}
	if len(s.Ports) == 1 && valid(s.Ports[0]) {
		ports = append(ports, *s.Ports[0].Port)
	}
	return ports
}

func FuzzEndpointsOf(f *testing.F) {
	f.Add([]byte{})
	// One IPv4 slice, port https/6443, one endpoint of unknown readiness
	// at 10.0.0.1.
	f.Add([]byte{1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0})
	// The same address not ready, and an IPv6 slice whose ready endpoint
	// has a raw "::2" and fd00::1.
	f.Add([]byte{2, 0, 0, 1, 1, 1, 1, 2, 0, 0, 1, 0,
		1, 1, 1, 1, 1, 1, 1, 0, 0, 2, 16, 3, ':', ':', '2', 2})
	// An FQDN slice; an IPv4 slice with two unnamed ports, so no port;
	// an IPv4 slice whose only port, named http, is 65535.
	f.Add([]byte{3, 0, 2, 1, 1, 1, 1, 0, 0, 0, 1, 9,
		1, 0, 2, 0, 1, 0, 2, 1, 1, 0, 0, 3, 6, 7, 13,
		2, 0, 1, 2, 6, 1, 0, 0, 0, 2, 14, 4})
	f.Add([]byte{4, 2, 2, 3, 0, 3, 4, 9, 2, 0, 0, 0, 3, 7, 8, 9})
	// A ready endpoint at ::ffff:10.0.0.1 and 10.0.0.1, which the API
	// server's IPv4 validation lets through: one upstream, spelled as
	// --endpoints spells it.
	f.Add([]byte{1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 2, 15, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		cache := fuzzSlices(data)
		got, rejected := endpointsOf(cache)
		if got == nil {
			t.Fatal("endpointsOf returned nil; want a non-nil list")
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("got %q; want sorted without duplicates", got)
		}
		// want is every address a ready (or unknown) endpoint of an IP
		// slice names, with a port its slice lends it.
		want := map[string]bool{}
		for _, s := range cache {
			if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
				continue
			}
			ports := fuzzSlicePorts(s)
			if len(ports) == 0 {
				continue
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					continue
				}
				for _, a := range ep.Addresses {
					if ip, err := netip.ParseAddr(a); err == nil && unusableAddr(ip.Unmap()) == "" {
						want[net.JoinHostPort(ip.Unmap().String(), strconv.Itoa(int(ports[0])))] = true
					}
				}
			}
		}
		for _, e := range got {
			if problem := checkEndpointForm(e); problem != "" {
				t.Errorf("endpoint %q: %s", e, problem)
			}
			// The same address written in --endpoints must be the same
			// upstream, not a second one.
			if n, err := normalizeEndpoint(e); err != nil || n != e {
				t.Errorf("normalizeEndpoint(%q): got %q, %v; want %q, nil", e, n, err, e)
			}
			if !want[e] {
				t.Errorf("endpoint %q: no ready endpoint of an IP slice with a usable port names it", e)
			}
		}
		for e := range want {
			over := slices.Contains(rejected, e+" (over the limit of "+strconv.Itoa(maxDiscoveredEndpoints)+")")
			if !slices.Contains(got, e) && !over {
				t.Errorf("endpoints %q lack %q, which a ready endpoint names", got, e)
			}
		}
	})
}

// fuzzDuration decodes a duration from three bytes: a scale (nanoseconds,
// microseconds, milliseconds or tens of milliseconds) and a 16-bit value,
// which covers zero, ties, sub-millisecond sites and far regions.
func fuzzDuration(in *fuzzBytes) time.Duration {
	scale := []time.Duration{1, time.Microsecond, time.Millisecond, 10 * time.Millisecond}[in.pick(4)]
	v := time.Duration(in.byte())<<8 | time.Duration(in.byte())
	return v * scale //nolint:durationcheck // a count times a unit, decoded from fuzz input
}

func FuzzBuildTiers(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 2, 0, 1, 0, 2, 0, 2, 0, 0, 2, 0, 3, 0})
	f.Add([]byte{5, 2, 0, 10, 128, 2, 0, 25, 128, 2, 0, 22, 129, 1, 3, 232, 0, 0, 0, 0, 255})
	f.Add([]byte{12, 1, 1, 1, 130, 1, 1, 1, 130, 1, 1, 1, 131, 3, 9, 9, 200, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzBytes{data}
		n := in.pick(13)
		var samples []*upstream
		avg := map[string]time.Duration{}
		prev := map[string]int{}
		for i := range n {
			addr := net.JoinHostPort(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}).String(), "6443")
			d := fuzzDuration(in)
			samples = append(samples, &upstream{addr: addr, rtt: d, hasRTT: true})
			avg[addr] = d
			// Half the bytes give a previous group, some of them far off
			// or negative, as a stale map might hold.
			if g := in.byte(); g >= 128 {
				prev[addr] = int(g%8) - 1
			}
		}
		if in.byte()%2 == 1 {
			prev["10.9.9.9:6443"] = 0 // a member that left
		}
		tiers, groups := tiersOf(t, samples, prev)

		seen := map[string]int{}
		for _, tier := range tiers {
			if len(tier) == 0 {
				t.Fatalf("empty tier in %v", tiers)
			}
			for _, a := range tier {
				seen[a]++
			}
		}
		for _, s := range samples {
			if seen[s.addr] != 1 {
				t.Errorf("%s is in %d tiers; want exactly 1 (tiers %v)", s.addr, seen[s.addr], tiers)
			}
		}
		if len(seen) != len(samples) {
			t.Errorf("tiers %v hold %d addresses; want the %d sampled", tiers, len(seen), len(samples))
		}
		lastBest := time.Duration(-1)
		for i, tier := range tiers {
			best := avg[tier[0]]
			for _, a := range tier {
				best = min(best, avg[a])
			}
			if best <= lastBest {
				t.Errorf("tier %d best %v not above the previous tier's %v (tiers %v)", i, best, lastBest, tiers)
			}
			lastBest = best
			limit := tierLimit(best)
			stay := time.Duration(tierStay * float64(limit))
			for _, a := range tier {
				if avg[a] > stay {
					t.Errorf("tier %d (best %v) holds %s at %v; want at most %v", i, best, a, avg[a], stay)
				}
			}
			// Whatever is within the plain limit of a tier's best joins
			// that tier or an earlier one, never a later one.
			for _, later := range tiers[i+1:] {
				for _, a := range later {
					if avg[a] <= limit {
						t.Errorf("%s at %v is past tier %d though within its limit %v (tiers %v)", a, avg[a], i, limit, tiers)
					}
				}
			}
		}
		if again, _ := tiersOf(t, samples, groups); !reflect.DeepEqual(again, tiers) {
			t.Errorf("rebuild with its own groups: got %v; want %v", again, tiers)
		}
		reversed := slices.Clone(samples)
		slices.Reverse(reversed)
		if again, _ := tiersOf(t, reversed, prev); !reflect.DeepEqual(again, tiers) {
			t.Errorf("rebuild from reversed samples: got %v; want %v", again, tiers)
		}
	})
}

func FuzzNextRTT(f *testing.F) {
	f.Add(int64(0), false, int64(time.Millisecond))
	f.Add(int64(10*time.Millisecond), true, int64(time.Second))
	f.Add(int64(10*time.Millisecond), true, int64(2*time.Millisecond))
	f.Add(int64(100*time.Microsecond), true, int64(10*time.Millisecond))
	f.Add(int64(time.Second), true, int64(0))
	f.Fuzz(func(t *testing.T, avgNs int64, have bool, sampleNs int64) {
		// Connect times are bounded by the health timeout; an hour is far
		// beyond any configuration.
		const bound = int64(time.Hour)
		avg := time.Duration(((avgNs % bound) + bound) % bound)
		sample := time.Duration(((sampleNs % bound) + bound) % bound)
		if !have {
			avg = 0
		}
		got := nextRTT(avg, have, sample)
		if !have || sample < avg/rttCapFactor {
			if got != sample {
				t.Errorf("nextRTT(%v, %v, %v): got %v; want the sample itself", avg, have, sample, got)
			}
			return
		}
		capped := min(sample, max(rttCapFactor*avg, rttCapFloor))
		lo, hi := min(avg, capped), max(avg, capped)
		if got < lo-1 || got > hi+1 { // one nanosecond of float rounding
			t.Errorf("nextRTT(%v, %v, %v): got %v; want between %v and %v", avg, have, sample, got, lo, hi)
		}
		// One slow check moves the average by a bounded step.
		if limit := time.Duration(rttAlpha*float64(max(rttCapFactor*avg, rttCapFloor))+(1-rttAlpha)*float64(avg)) + 1; got > limit {
			t.Errorf("nextRTT(%v, %v, %v): got %v; want at most %v", avg, have, sample, got, limit)
		}
	})
}

// Whatever the endpoint cache file holds, load either refuses it or returns
// what discovery could have written: normalized, usable IP endpoints, no
// more than discovery keeps, which store and load give back unchanged.
func FuzzEndpointCache(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"written":"2026-01-01T00:00:00Z","endpoints":["10.0.0.1:6443","[fd00::1]:6443"]}`,
		`{"version":1,"endpoints":["10.0.0.1:64`, "\x00\x01garbage", `{"version":99,"endpoints":["10.0.0.1:6443"]}`,
		`{"version":1,"endpoints":["10.0.0.1:99999"]}`, "", `{"version":1,"endpoints":["169.254.169.254:80"]}`,
		`{"version":1,"endpoints":["api.example.com:6443"]}`, `{"version":1,"endpoints":["[::ffff:10.0.0.1]:06443"]}`,
		`{"version":1,"endpoints":null}`, `{"version":1,"Endpoints":["10.0.0.1:6443"],"endpoints":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		c := &endpointCache{path: filepath.Join(t.TempDir(), "endpoints.json")}
		if err := os.WriteFile(c.path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		eps, err := c.load()
		if err != nil {
			if eps != nil {
				t.Errorf("load: got %q with error %v; want none", eps, err)
			}
			return
		}
		if len(eps) > maxDiscoveredEndpoints {
			t.Errorf("load: got %d endpoints; want at most %d", len(eps), maxDiscoveredEndpoints)
		}
		for _, e := range eps {
			if n, err := cachedEndpoint(e); err != nil || n != e {
				t.Errorf("load: got endpoint %q; checking it again gives %q, %v", e, n, err)
			}
		}
		if err := c.store(eps); err != nil {
			t.Fatal(err)
		}
		if again, err := c.load(); err != nil || !slices.Equal(again, eps) {
			t.Errorf("store then load of %q: got %q, %v", eps, again, err)
		}
	})
}
