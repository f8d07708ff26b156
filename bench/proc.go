package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat; it
// is 100 on every Linux architecture Go supports.
const clockTick = 100

func procComm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// statFields returns the fields of /proc/PID/stat after the command name
// (field 3, the state, is index 0).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// cpuTime is utime+stime of pid's whole thread group.
func cpuTime(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTick, nil
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var kids []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(p)
		if err != nil || len(f) < 2 {
			continue
		}
		if pp, _ := strconv.Atoi(f[1]); pp == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

// statusKiB reads a "Key:   N kB" line of /proc/PID/status.
func statusKiB(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, key)
}

func rssKiB(pid int) int64 {
	v, _ := statusKiB(pid, "VmRSS")
	return v
}

// fdCount counts pid's open descriptors.
func fdCount(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// fdKinds counts pid's descriptors by kind: socket, pipe, other.
func fdKinds(pid int) map[string]int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	k := map[string]int{}
	for _, e := range ents {
		t, err := os.Readlink(dir + "/" + e.Name())
		switch {
		case err != nil:
		case strings.HasPrefix(t, "socket:"):
			k["socket"]++
		case strings.HasPrefix(t, "pipe:"):
			k["pipe"]++
		default:
			k["other"]++
		}
	}
	return k
}

// kernelKiB is the machine's unreclaimable slab memory (SUnreclaim), where
// sockets and pipe rings live; large kmalloc blocks count there too.
func kernelKiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "SUnreclaim:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func loadAvg1() float64 {
	f := strings.Fields(loadAvg())
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// machineInfo is what RESULTS.md says about the machine.
type machineInfo struct {
	CPUs     int
	Model    string
	Kernel   string
	MemTotal string
}

func readMachineInfo() machineInfo {
	var mi machineInfo
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "processor":
				mi.CPUs++
			case "model name":
				if mi.Model == "" {
					mi.Model = strings.TrimSpace(v)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		mi.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		mi.MemTotal = strings.Join(strings.Fields(line)[1:], " ")
	}
	return mi
}

// cpu is the proxying process's utime+stime so far; 0 for direct.
func (in *instance) cpu() time.Duration {
	if in.pid == 0 {
		return 0
	}
	d, _ := cpuTime(in.pid)
	return d
}
