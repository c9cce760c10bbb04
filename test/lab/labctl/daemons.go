package labctl

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// Names of the control plane's processes (pid files, logs, `lab stop` and `lab start`).
const (
	ProcEtcd      = "etcd"
	ProcAPIServer = "kube-apiserver"
)

// stopGrace is how long StopProcess waits for a process to exit after its signal.
const stopGrace = 30 * time.Second

// daemons returns every lab process that StopProcess and StartProcess may act on, in start
// order: the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), then
// each node's kube-proxy and agent. The API forwarder is not one: it needs the listening socket
// lab up opened.
func (l *Lab) daemons() ([]Proc, error) {
	topo, err := l.Topology()
	if err != nil {
		return nil, err
	}
	procs := l.controlPlaneProcs(topo)
	for _, n := range topo.Nodes() {
		procs = append(procs, l.nodeProcs(topo, n)...)
	}
	return procs, nil
}

// daemon returns the lab process called name.
func (l *Lab) daemon(name string) (Proc, error) {
	procs, err := l.daemons()
	if err != nil {
		return Proc{}, err
	}
	var names []string
	for _, p := range procs {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Proc{}, fmt.Errorf("no lab process %q (processes: %s)", name, strings.Join(names, ", "))
}

// ParseSignal parses the signals `lab stop --signal` accepts: TERM (a clean stop) or KILL (a
// crash), with or without the SIG prefix, in any case.
func ParseSignal(s string) (syscall.Signal, error) {
	switch strings.TrimPrefix(strings.ToUpper(s), "SIG") {
	case "TERM":
		return syscall.SIGTERM, nil
	case "KILL":
		return syscall.SIGKILL, nil
	}
	return 0, fmt.Errorf("signal %q: want TERM or KILL", s)
}

// StopProcess stops one lab process (see daemons) with sig and waits until it has exited; a
// process that outlives SIGTERM by stopGrace is killed. The pid file stays, so `lab status`
// shows it dead and StartProcess starts it again: a fault the e2e suite injects (the API
// server or etcd away while the data path carries traffic).
func (l *Lab) StopProcess(_ context.Context, name string, sig syscall.Signal) error {
	if sig != syscall.SIGTERM && sig != syscall.SIGKILL {
		return fmt.Errorf("stopping %s: signal %v: want SIGTERM or SIGKILL", name, sig)
	}
	if _, err := l.daemon(name); err != nil {
		return err
	}
	pid, err := readPid(l.pidFile(name))
	if err != nil {
		return fmt.Errorf("%s is not running: %w", name, err)
	}
	if pid <= 1 || !alive(pid) {
		return fmt.Errorf("%s is not running (its pid file %s names no live process)", name, l.pidFile(name))
	}
	start := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("stopping %s: kill -%d %d: %w", name, sig, pid, err)
	}
	if !waitExit(pid, stopGrace) {
		if sig == syscall.SIGKILL {
			return fmt.Errorf("%s (pid %d) still alive %v after SIGKILL", name, pid, stopGrace)
		}
		l.printf("%s (pid %d) still running %v after SIGTERM; sending SIGKILL\n", name, pid, stopGrace)
		if left := killAll([]int{pid}); len(left) > 0 {
			return fmt.Errorf("%s (pid %d) still alive after SIGKILL", name, pid)
		}
	}
	l.printf("stopped %s (pid %d, %v) in %.1fs\n", name, pid, sig, time.Since(start).Seconds())
	return nil
}

// waitExit polls until pid has exited (or is a zombie) or d has passed.
func waitExit(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// StartProcess starts one stopped lab process (see daemons) as lab up does and waits until it
// serves where that is observable: etcd healthy, the API server ready.
func (l *Lab) StartProcess(ctx context.Context, name string) error {
	p, err := l.daemon(name)
	if err != nil {
		return err
	}
	if pid, _ := readPid(l.pidFile(name)); pid > 1 && alive(pid) {
		return fmt.Errorf("%s is already running (pid %d)", name, pid)
	}
	start := time.Now()
	if err := l.startAndWait(ctx, p); err != nil {
		return err
	}
	l.printf("started %s in %.1fs\n", name, time.Since(start).Seconds())
	return nil
}

// startAndWait starts p and, for etcd and the API server, waits until they serve.
func (l *Lab) startAndWait(ctx context.Context, p Proc) error {
	if _, err := l.start(p); err != nil {
		return err
	}
	switch p.Name {
	case ProcEtcd:
		return waitEtcd(ctx, p.NS)
	case ProcAPIServer:
		c, err := l.Client()
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		return waitAPIReady(actx, c)
	}
	return nil
}
