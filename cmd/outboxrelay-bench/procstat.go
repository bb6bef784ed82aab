package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc/PID/stat. Linux fixes it at
// 100 for user space whatever the kernel's own tick rate.
const userHZ = 100

// procSample is what /proc says about one process at one moment.
type procSample struct {
	cpu     time.Duration // utime + stime
	hwmKiB  int64         // VmHWM: peak resident set size
	started time.Time     // when the process started, to 10 ms
	ok      bool
}

// readProc reads the CPU time and peak RSS of pid. ok is false once the
// process is gone.
func readProc(pid int) procSample {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}
	}
	// The command name (field 2) may hold spaces; the fields after it
	// start behind its closing parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return procSample{}
	}
	f := strings.Fields(string(stat[i+1:]))
	// After the name: state is field 3, utime field 14, stime field 15.
	if len(f) < 13 {
		return procSample{}
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return procSample{}
	}
	s := procSample{cpu: time.Duration(utime+stime) * time.Second / userHZ, ok: true}
	// starttime (field 22) counts ticks since boot; /proc/uptime puts it
	// on the wall clock.
	if len(f) > 19 {
		if ticks, err := strconv.ParseInt(f[19], 10, 64); err == nil {
			if up := uptime(); up > 0 {
				s.started = time.Now().Add(-(up - time.Duration(ticks)*time.Second/userHZ))
			}
		}
	}
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for line := range strings.SplitSeq(string(status), "\n") {
			if rest, found := strings.CutPrefix(line, "VmHWM:"); found {
				kb := strings.Fields(rest)
				if len(kb) > 0 {
					s.hwmKiB, _ = strconv.ParseInt(kb[0], 10, 64)
				}
				break
			}
		}
	}
	return s
}

// switches counts a process's context switches, summed over its threads.
type switches struct{ voluntary, involuntary int64 }

func (s switches) total() int64 { return s.voluntary + s.involuntary }

func (s switches) minus(o switches) switches {
	return switches{s.voluntary - o.voluntary, s.involuntary - o.involuntary}
}

// contextSwitches reads the context switches of every live thread of pid. A
// voluntary switch is a thread going to sleep (a futex, epoll or nanosleep
// wait): the count of wakeups that a per-row goroutine handoff costs.
func contextSwitches(pid int) switches {
	var s switches
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return s
	}
	for _, t := range tasks {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				s.voluntary += n
			} else if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				s.involuntary += n
			}
		}
	}
	return s
}

// findProcess returns the pid of a process named comm whose command line
// contains arg, or 0.
func findProcess(comm, arg string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), arg) {
			return pid
		}
	}
	return 0
}

func uptime() time.Duration {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return time.Duration(v * float64(time.Second))
}

// selfCPU returns the CPU time this process has used so far.
func selfCPU() time.Duration {
	return readProc(os.Getpid()).cpu
}

// loadAvg returns the 1-minute load average, a hint of how busy the
// machine was besides the benchmark.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// machineBusy returns the CPU time all processes spent, from /proc/stat, so
// that a run can report how much of the machine others used meanwhile.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:8] { // user nice system idle iowait irq softirq
		if i == 3 || i == 4 {
			continue // idle, iowait
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// waitQuiet waits, up to maxWait, until the rest of the machine uses less
// than a sixth of its CPU over a 300 ms window, so that a run does not start
// in the middle of someone else's burst (a build, a test suite). It returns
// the share the others used in the last window.
func waitQuiet(maxWait time.Duration, cpus int) float64 {
	deadline := time.Now().Add(maxWait)
	for {
		busy0, self0, t0 := machineBusy(), selfCPU(), time.Now()
		time.Sleep(300 * time.Millisecond)
		others := (machineBusy() - busy0) - (selfCPU() - self0)
		share := others.Seconds() / (time.Since(t0).Seconds() * float64(cpus))
		if share < 1.0/6 || time.Now().After(deadline) {
			return share
		}
	}
}

// postgresCPU returns the CPU time used so far by the live processes of
// the PostgreSQL cluster in dataDir (those whose command line names it, and
// their children, which are PostgreSQL's backends).
func postgresCPU(dataDir string) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var postmaster int
	var total time.Duration
	type proc struct{ pid, ppid int }
	var all []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		all = append(all, proc{pid, ppid})
		if postmaster == 0 {
			if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmd), dataDir) {
				postmaster = pid
			}
		}
	}
	for _, p := range all {
		if p.pid == postmaster || (postmaster != 0 && p.ppid == postmaster) {
			total += readProc(p.pid).cpu
		}
	}
	return total
}
