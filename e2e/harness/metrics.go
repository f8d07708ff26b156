package harness

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is a scrape.
type Samples []Sample

// ParseMetrics reads the Prometheus text exposition format well enough for
// the daemon's own metrics: comments are skipped, label values are quoted
// strings with backslash escapes.
func ParseMetrics(text string) Samples {
	var out Samples
	s := bufio.NewScanner(strings.NewReader(text))
	s.Buffer(make([]byte, 64*1024), 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sample, ok := parseSample(line)
		if ok {
			out = append(out, sample)
		}
	}
	return out
}

func parseSample(line string) (Sample, bool) {
	smp := Sample{Labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(rest, "{ "); i >= 0 {
		smp.Name = rest[:i]
		rest = rest[i:]
	} else {
		return smp, false
	}
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, "=\"")
			if eq < 0 {
				return smp, false
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var val strings.Builder
			i := 0
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
				}
				val.WriteByte(rest[i])
			}
			if i >= len(rest) {
				return smp, false
			}
			smp.Labels[key] = val.String()
			rest = rest[i+1:]
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return smp, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return smp, false
	}
	smp.Value = v
	return smp, true
}

// Get returns the value of the series with this name and these labels
// (label pairs as "key", "value", ...), and whether it exists.
func (ss Samples) Get(name string, labels ...string) (float64, bool) {
	for _, s := range ss {
		if s.Name != name || !s.match(labels) {
			continue
		}
		return s.Value, true
	}
	return 0, false
}

// Value is Get without the presence flag (missing is 0).
func (ss Samples) Value(name string, labels ...string) float64 {
	v, _ := ss.Get(name, labels...)
	return v
}

// Sum adds the values of every series with this name and these labels
// (label pairs as in Get).
func (ss Samples) Sum(name string, labels ...string) float64 {
	var sum float64
	for _, s := range ss {
		if s.Name == name && s.match(labels) {
			sum += s.Value
		}
	}
	return sum
}

// SeriesFor lists the names of the metrics that have a series labelled
// upstream=addr.
func (ss Samples) SeriesFor(addr string) []string {
	var out []string
	for _, s := range ss {
		if s.Labels["upstream"] == addr {
			out = append(out, s.Name)
		}
	}
	return out
}

func (s Sample) match(labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if s.Labels[labels[i]] != labels[i+1] {
			return false
		}
	}
	return true
}

// upstreamConns lists the daemon's established TCP connections to port
// 6443 of any address, keyed by local port. /proc/<pid>/net/tcp shows the
// whole network namespace of the process (w1's table, read from outside
// it), so rows are kept only if their socket inode is one of the daemon's
// open descriptors: the harness's own clients in w1 do not count.
func upstreamConns(pid int) (map[int]string, error) {
	own, err := socketInodes(pid)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[int]string{}
	s := bufio.NewScanner(f)
	s.Scan() // header
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 10 || fields[3] != "01" || !own[fields[9]] { // 01 = ESTABLISHED
			continue
		}
		_, lport, ok1 := hexAddr(fields[1])
		rip, rport, ok2 := hexAddr(fields[2])
		if !ok1 || !ok2 || rport != apiPort {
			continue
		}
		out[lport] = rip + ":" + strconv.Itoa(rport)
	}
	return out, s.Err()
}

// socketInodes returns the inodes of the sockets a process has open.
func socketInodes(pid int) (map[string]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range entries {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			out[strings.TrimSuffix(inode, "]")] = true
		}
	}
	return out, nil
}

// hexAddr decodes "0100007F:1D1D" (little-endian IPv4 on x86 and arm64).
func hexAddr(s string) (string, int, bool) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	if !ok || len(ipHex) != 8 {
		return "", 0, false
	}
	v, err := strconv.ParseUint(ipHex, 16, 32)
	if err != nil {
		return "", 0, false
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return "", 0, false
	}
	ip := fmt.Sprintf("%d.%d.%d.%d", byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	return ip, int(port), true
}
