package labctl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ironlb/ironlb/test/lab/labnet"
	"github.com/ironlb/ironlb/test/procstat"
)

// Proc is a long-running lab process: a control-plane component, a node's kube-proxy or agent,
// or the API forwarder.
type Proc struct {
	// Name names the pid file (.lab/pids/NAME.pid) and log (.lab/logs/NAME.log).
	Name string
	// NS is the network namespace to run in; empty runs in the root namespace.
	NS string
	// Args is the command line; Args[0] is an absolute path.
	Args []string
	// Env is added to the lab's environment.
	Env []string
	// ExtraFiles are passed to the child as fds 3, 4, ...
	ExtraFiles []*os.File
}

// start launches p detached from the lab command (own session, so it outlives it and no
// terminal signal reaches it), appending stdout and stderr to its log, and records its pid.
func (l *Lab) start(p Proc) (int, error) {
	if err := os.MkdirAll(l.LogDir(), 0o755); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(l.PidDir(), 0o755); err != nil {
		return 0, err
	}
	logPath := filepath.Join(l.LogDir(), p.Name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("opening log of %s: %w", p.Name, err)
	}
	defer func() { _ = logf.Close() }() // the process keeps its own descriptor
	args := p.Args
	if p.NS != "" {
		// nsenter switches only the network namespace and execs the program, so the pid we
		// record is the program's own. Not `ip netns exec`: it also unshares the mount
		// namespace, and the pod namespaces the agent then creates (bind mounts under
		// /run/netns) would be invisible to everyone else.
		args = append([]string{"nsenter", "--net=" + filepath.Join(labnet.NetnsDir, p.NS), "--"}, args...)
	}
	if _, err := fmt.Fprintf(logf, "==== %s lab: starting %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(args, " ")); err != nil {
		return 0, fmt.Errorf("writing log of %s: %w", p.Name, err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = l.Root
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.ExtraFiles = p.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s (%s): %w", p.Name, args[0], err)
	}
	pid := cmd.Process.Pid
	// Reap it if it dies while we are still running, so it never lingers as a zombie of ours.
	// This goroutine needs no context: it ends when the process does, or with the (short-lived)
	// lab command, after which init adopts the daemon.
	go func() { _ = cmd.Wait() }()
	// The start time (which exec does not change) guards against a recycled pid later.
	rec := fmt.Sprintf("%d %d\n", pid, startTime(pid))
	if err := os.WriteFile(l.pidFile(p.Name), []byte(rec), 0o644); err != nil {
		return pid, fmt.Errorf("writing pid file of %s: %w", p.Name, err)
	}
	return pid, nil
}

func (l *Lab) pidFile(name string) string { return filepath.Join(l.PidDir(), name+".pid") }

// ProcInfo is what a pid file says about a lab process.
type ProcInfo struct {
	Name  string
	Pid   int
	Alive bool
	RSSKB int64
}

// Procs reads every pid file and checks each process.
func (l *Lab) Procs() ([]ProcInfo, error) {
	entries, err := os.ReadDir(l.PidDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []ProcInfo
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".pid")
		if !ok {
			continue
		}
		pi := ProcInfo{Name: name}
		pi.Pid, _ = readPid(filepath.Join(l.PidDir(), e.Name()))
		if pi.Pid > 0 {
			pi.Alive = alive(pi.Pid)
			if pi.Alive {
				pi.RSSKB = rssKB(pi.Pid)
			}
		}
		out = append(out, pi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// readPid returns the pid a pid file records, or 0 when that process has exited and the pid
// now belongs to another process (its start time differs from the recorded one).
func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("pid file %s is empty", path)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, fmt.Errorf("pid file %s: %w", path, err)
	}
	if len(f) > 1 {
		if st, err := strconv.ParseUint(f[1], 10, 64); err == nil && st != startTime(pid) {
			return 0, nil
		}
	}
	return pid, nil
}

// startTime returns a process's start time in clock ticks since boot (0 if it is gone).
func startTime(pid int) uint64 {
	st, err := procstat.Read(pid)
	if err != nil {
		return 0
	}
	return st.StartTime
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	st, err := procstat.Read(pid)
	return err == nil && st.State != "Z" && st.State != "X"
}

func rssKB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// descendants returns every live descendant of the given pids (not the pids themselves).
func descendants(roots []int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procstat.Read(pid)
		if err != nil {
			continue
		}
		children[st.PPID] = append(children[st.PPID], pid)
	}
	seen := map[int]bool{}
	for _, r := range roots {
		seen[r] = true
	}
	var out []int
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

// killAll sends SIGKILL to pids and waits (up to 10 s) until none of them is alive.
func killAll(pids []int) (stillAlive []int) {
	for _, p := range pids {
		if p > 1 {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		stillAlive = stillAlive[:0]
		for _, p := range pids {
			if p > 1 && alive(p) {
				stillAlive = append(stillAlive, p)
			}
		}
		if len(stillAlive) == 0 || time.Now().After(deadline) {
			return stillAlive
		}
		time.Sleep(50 * time.Millisecond)
	}
}
