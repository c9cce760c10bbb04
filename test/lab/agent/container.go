package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ironlb/ironlb/test/procstat"
)

type containerKind int

const (
	kindMain containerKind = iota
	kindInit
	kindSidecar // an init container with restartPolicy Always
)

// Restart back-off, as the kubelet's: the first restart is immediate (the
// kubelet restarts a container that crashed for the first time at its next
// sync), then 2 s doubling to a minute (shorter than the kubelet's 10 s..5
// min, to keep the lab brisk), back to immediate after a run of 10 minutes.
const (
	backoffFirst = 2 * time.Second
	backoffMax   = time.Minute
	backoffReset = 10 * time.Minute
	// startRetryMax bounds the wait between attempts to start a container
	// that could not be started at all (config or image errors).
	startRetryMax = 5 * time.Second
)

var errStopped = errors.New("container stopped")

// containerRunner runs one container: start, probes, restarts, stop.
type containerRunner struct {
	w    *podWorker
	spec corev1.Container
	kind containerKind

	stopOnce sync.Once
	stopCh   chan struct{}
	killReq  chan string // liveness or startup probe failure

	mu       sync.Mutex
	stopped  bool
	proc     *os.Process
	exited   chan struct{} // closed when proc has exited
	status   corev1.ContainerStatus
	started  chan struct{} // closed the first time the container is started (sidecars)
	execEnv  []string
	pexec    PodExec // how the current run was started, for exec probes between runs
	startedC bool
	// logStarts are the log file offsets where each run of this agent
	// started, for `kubectl logs` (current run) and `--previous`.
	logStarts []int64
}

func newContainerRunner(w *podWorker, spec corev1.Container, kind containerKind, previous []corev1.ContainerStatus) *containerRunner {
	r := &containerRunner{
		w: w, spec: spec, kind: kind,
		stopCh: make(chan struct{}), killReq: make(chan string, 1), started: make(chan struct{}),
		status: corev1.ContainerStatus{Name: spec.Name, Image: spec.Image, ImageID: ""},
	}
	// After an agent restart the previous processes are gone: carry the
	// restart count over and count this start as a restart.
	for _, p := range previous {
		if p.Name == spec.Name {
			r.status.RestartCount = p.RestartCount
			if p.State.Running != nil || p.State.Terminated != nil || p.LastTerminationState.Terminated != nil {
				r.status.RestartCount++
				if p.State.Terminated != nil {
					r.status.LastTerminationState.Terminated = p.State.Terminated.DeepCopy()
				} else if p.LastTerminationState.Terminated != nil {
					r.status.LastTerminationState.Terminated = p.LastTerminationState.Terminated.DeepCopy()
				}
			}
		}
	}
	return r
}

func (r *containerRunner) snapshot() corev1.ContainerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := *r.status.DeepCopy()
	return s
}

func (r *containerRunner) update(f func(s *corev1.ContainerStatus)) {
	r.mu.Lock()
	f(&r.status)
	r.mu.Unlock()
	r.w.markDirty()
}

func (r *containerRunner) isStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

func (r *containerRunner) restartPolicy() corev1.RestartPolicy {
	switch r.kind {
	case kindSidecar:
		return corev1.RestartPolicyAlways
	case kindInit:
		if r.w.latest().Spec.RestartPolicy == corev1.RestartPolicyNever {
			return corev1.RestartPolicyNever
		}
		return corev1.RestartPolicyOnFailure
	}
	if p := r.spec.RestartPolicy; p != nil {
		return corev1.RestartPolicy(*p)
	}
	return r.w.latest().Spec.RestartPolicy
}

// waitStarted waits until a sidecar has started (and passed its startup probe).
func (r *containerRunner) waitStarted(ctx context.Context) bool {
	select {
	case <-r.started:
		return true
	case <-ctx.Done():
		return false
	case <-r.stopCh:
		return false
	}
}

// loop runs the container until it is done for good under its restart
// policy, or stopped. It returns whether the last run exited with 0.
func (r *containerRunner) loop(ctx context.Context) bool {
	backoff := time.Duration(0)
	pullFailures := 0
	for {
		if r.isStopped() || ctx.Err() != nil {
			return false
		}
		p, err := r.start(ctx)
		if errors.Is(err, errStopped) {
			return false
		}
		if err != nil {
			reason := "CreateContainerConfigError"
			var ie *ImageError
			var ce *CommandError
			switch {
			case errors.As(err, &ie):
				reason = "ErrImagePull"
				if pullFailures > 0 {
					reason = "ImagePullBackOff"
				}
				pullFailures++
			case errors.As(err, &ce), errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
				reason = "CreateContainerError"
			}
			msg := err.Error()
			if prev := r.snapshot().State.Waiting; prev == nil || prev.Message != msg {
				// Log and record only changes; retries of the same failure are quiet.
				r.w.log.Error(err, "Starting container failed", "container", r.spec.Name, "reason", reason)
				r.w.event(corev1.EventTypeWarning, "Failed", "Error: %s: %s", reason, msg)
			}
			r.update(func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
				s.Ready, s.Started = false, ptr.To(false)
			})
			// Missing Secrets and ConfigMaps usually appear moments later
			// (created by a controller): retry start failures briskly.
			backoff = min(nextBackoff(backoff), startRetryMax)
			if !r.sleep(ctx, backoff) {
				return false
			}
			continue
		}
		term := r.supervise(ctx, p)
		r.w.log.Info("Container exited", "container", r.spec.Name, "exitCode", term.ExitCode, "reason", term.Reason)
		if r.isStopped() {
			r.update(func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Terminated: term}
				s.Ready, s.Started = false, ptr.To(false)
			})
			return term.ExitCode == 0
		}
		policy := r.restartPolicy()
		restart := policy == corev1.RestartPolicyAlways || (policy == corev1.RestartPolicyOnFailure && term.ExitCode != 0)
		if !restart {
			r.update(func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Terminated: term}
				s.Ready, s.Started = false, ptr.To(false)
			})
			return term.ExitCode == 0
		}
		var wait time.Duration
		wait, backoff = restartWait(backoff, term.FinishedAt.Sub(term.StartedAt.Time))
		state := corev1.ContainerState{Terminated: term}
		if wait > 0 {
			pod := r.w.latest()
			msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", wait, r.spec.Name, pod.Name, pod.Namespace, pod.UID)
			r.w.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", r.spec.Name, pod.Name, pod.Namespace, pod.UID)
			state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: msg}}
		}
		r.update(func(s *corev1.ContainerStatus) {
			s.RestartCount++
			s.LastTerminationState = corev1.ContainerState{Terminated: term}
			s.State = state
			s.Ready, s.Started = false, ptr.To(false)
		})
		if !r.sleep(ctx, wait) {
			return false
		}
	}
}

// restartWait returns how long to wait before restarting a container that
// exited after running for ran, and the back-off for its next exit: the
// current back-off (none after the first exit or a run longer than
// backoffReset), then the doubled one.
func restartWait(backoff, ran time.Duration) (wait, next time.Duration) {
	if ran > backoffReset {
		backoff = 0
	}
	return backoff, nextBackoff(backoff)
}

func nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return backoffFirst
	}
	return min(2*b, backoffMax)
}

func (r *containerRunner) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-r.stopCh:
		return false
	}
}

type runningProc struct {
	pid       int
	startedAt metav1.Time
	exited    chan struct{}
	state     *os.ProcessState
}

// start resolves everything the container needs and starts its process.
func (r *containerRunner) start(ctx context.Context) (*runningProc, error) {
	w := r.w
	pod := w.podForEnv()
	img, err := w.a.images.Lookup(r.spec.Image)
	if err != nil {
		return nil, err
	}
	user, err := containerCred(pod, &r.spec, img)
	if err != nil {
		return nil, err
	}
	// The image's environment, under the container's own; HOME from the image's
	// /etc/passwd for its user, unless the image sets it.
	base := w.baseEnv(ctx)
	if user != nil {
		base.Set("HOME", img.OCI.home(user.UID))
	}
	for _, kv := range img.Env() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			base.Set(k, v)
		}
	}
	env, err := ResolveEnv(ctx, pod, &r.spec, base, w.a, w.a.nodeAllocatable())
	if err != nil {
		return nil, err
	}
	prog, args, err := img.Resolve(&r.spec, env.Map())
	if err != nil {
		return nil, err
	}
	if user != nil && user.UID != 0 {
		if err := checkSearchable(prog); err != nil {
			return nil, err
		}
	}
	binds, err := w.bindsFor(&r.spec, env.Map())
	if err != nil {
		return nil, err
	}
	pe := PodExec{Binds: binds, Workdir: r.spec.WorkingDir, User: user}
	if pe.Workdir == "" && img.OCI != nil {
		pe.Workdir = img.OCI.Config.WorkingDir
	}
	logPath := w.a.containerLogPath(pod.Namespace, pod.Name, r.spec.Name)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening container log: %w", err)
	}
	var logStart int64
	if st, err := logf.Stat(); err == nil {
		logStart = st.Size()
	}
	cmd := w.command(pe, prog, args)
	cmd.Env = env.List()
	cmd.Stdout, cmd.Stderr = logf, logf

	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		_ = logf.Close() // nothing was written to it
		return nil, errStopped
	}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		_ = logf.Close() // the start error is the one to report
		return nil, fmt.Errorf("starting %s: %w", prog, err)
	}
	p := &runningProc{pid: cmd.Process.Pid, startedAt: metav1.Now(), exited: make(chan struct{})}
	r.proc = cmd.Process
	r.exited = p.exited
	r.logStarts = append(r.logStarts, logStart)
	r.execEnv = cmd.Env
	r.pexec = pe
	hasStartup := r.spec.StartupProbe != nil
	r.status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: p.startedAt}}
	r.status.ContainerID = "lab://" + strconv.Itoa(p.pid)
	r.status.ImageID = img.ID(prog)
	r.status.Started = ptr.To(!hasStartup)
	r.status.Ready = !hasStartup && r.spec.ReadinessProbe == nil
	r.mu.Unlock()
	w.markDirty()
	if !hasStartup {
		r.markStarted()
	}
	w.log.Info("Started container", "container", r.spec.Name, "pid", p.pid, "program", prog, "args", args, "imageID", img.ID(prog), "user", user)
	w.event(corev1.EventTypeNormal, "Started", "Started container %s", r.spec.Name)
	writePidfile(filepath.Join(w.dir, r.spec.Name+".pid"), p.pid)
	go func() {
		_ = cmd.Wait()
		_ = logf.Close() // the container's output: no one to report a failed flush to
		p.state = cmd.ProcessState
		r.mu.Lock()
		r.proc = nil
		r.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// logRange returns the log file range of the current run (or the previous
// one): start offset and end offset (-1 = open ended); ok is false when
// there is no such run.
func (r *containerRunner) logRange(previous bool) (start, end int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.logStarts)
	switch {
	case !previous && n > 0:
		return r.logStarts[n-1], -1, true
	case !previous:
		return 0, -1, true
	case n >= 2:
		return r.logStarts[n-2], r.logStarts[n-1], true
	}
	return 0, 0, false
}

func (r *containerRunner) markStarted() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.startedC {
		r.startedC = true
		close(r.started)
	}
}

// supervise runs the probes while the process lives, restarts it on a
// liveness failure, and returns how it ended.
func (r *containerRunner) supervise(ctx context.Context, p *runningProc) *corev1.ContainerStateTerminated {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	select { // a kill request for an earlier run of the container is stale
	case <-r.killReq:
	default:
	}
	target := ProbeTarget{Host: r.w.podForEnv().Status.PodIP, Ports: r.spec.Ports, Exec: r.execIn}
	startProbes := func() {
		if pr := r.spec.ReadinessProbe; pr != nil {
			go probeLoop(pctx, pr, target, false, func(ok, crossed bool, err error) {
				r.setReady(p, ok)
				if crossed && err != nil {
					r.w.log.Info("Readiness probe failed", "container", r.spec.Name, "error", err.Error())
					r.w.event(corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: %v", err)
				}
			})
		}
		if pr := r.spec.LivenessProbe; pr != nil {
			go probeLoop(pctx, pr, target, true, func(ok, crossed bool, err error) {
				if crossed && !ok {
					r.requestKill(fmt.Sprintf("Liveness probe failed: %v", err))
				}
			})
		}
	}
	if pr := r.spec.StartupProbe; pr != nil {
		sctx, scancel := context.WithCancel(pctx)
		go probeLoop(sctx, pr, target, false, func(ok, crossed bool, err error) {
			if !crossed {
				return
			}
			scancel()
			if !ok {
				r.requestKill(fmt.Sprintf("Startup probe failed: %v", err))
				return
			}
			r.mu.Lock()
			if r.exited == p.exited {
				r.status.Started = ptr.To(true)
				r.status.Ready = r.spec.ReadinessProbe == nil
			}
			r.mu.Unlock()
			r.w.markDirty()
			r.markStarted()
			startProbes()
		})
	} else {
		startProbes()
	}

	var message string
	select {
	case <-p.exited:
	case message = <-r.killReq:
		r.w.log.Info("Killing container", "container", r.spec.Name, "reason", message)
		r.w.event(corev1.EventTypeWarning, "Unhealthy", "%s", message)
		r.w.event(corev1.EventTypeNormal, "Killing", "Container %s failed a probe, will be restarted", r.spec.Name)
		r.signalAndWait(p, r.w.grace())
	}
	cancel()
	term := &corev1.ContainerStateTerminated{
		StartedAt: p.startedAt, FinishedAt: metav1.Now(), ContainerID: "lab://" + strconv.Itoa(p.pid), Message: message,
	}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			term.ExitCode = 128 + int32(ws.Signal())
			term.Signal = int32(ws.Signal())
		default:
			term.ExitCode = int32(ws.ExitStatus())
		}
	}
	term.Reason = "Error"
	if term.ExitCode == 0 {
		term.Reason = "Completed"
	}
	return term
}

func (r *containerRunner) setReady(p *runningProc, ok bool) {
	r.mu.Lock()
	if r.exited != p.exited || r.status.State.Running == nil || r.status.Ready == ok {
		r.mu.Unlock()
		return
	}
	r.status.Ready = ok
	r.mu.Unlock()
	r.w.log.Info("Container readiness changed", "container", r.spec.Name, "ready", ok)
	r.w.markDirty()
}

func (r *containerRunner) requestKill(msg string) {
	select {
	case r.killReq <- msg:
	default:
	}
}

// stop stops the container for good: SIGTERM to its process group, SIGKILL
// after grace.
func (r *containerRunner) stop(grace time.Duration) {
	r.stopOnce.Do(func() { close(r.stopCh) })
	r.mu.Lock()
	r.stopped = true
	proc, exited := r.proc, r.exited
	r.mu.Unlock()
	if proc == nil {
		return
	}
	r.signalAndWait(&runningProc{pid: proc.Pid, exited: exited}, grace)
}

// preStop runs the container's preStop hook (exec, httpGet or sleep) within
// grace and returns the grace left for SIGTERM.
func (r *containerRunner) preStop(p *runningProc, grace time.Duration) time.Duration {
	lc := r.spec.Lifecycle
	if lc == nil || lc.PreStop == nil || grace <= 0 {
		return grace
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	h := lc.PreStop
	var err error
	switch {
	case h.Exec != nil:
		err = r.execIn(ctx, h.Exec.Command)
	case h.HTTPGet != nil:
		err = probeHTTP(ctx, h.HTTPGet, ProbeTarget{Host: r.w.podForEnv().Status.PodIP, Ports: r.spec.Ports})
	case h.Sleep != nil:
		select {
		case <-time.After(time.Duration(h.Sleep.Seconds) * time.Second):
		case <-ctx.Done():
		case <-p.exited:
		}
	}
	if err != nil {
		r.w.log.Info("PreStop hook failed", "container", r.spec.Name, "error", err.Error())
		r.w.event(corev1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: %v", err)
	}
	return max(grace-time.Since(start), 0)
}

func (r *containerRunner) signalAndWait(p *runningProc, grace time.Duration) {
	grace = r.preStop(p, grace)
	if grace > 0 {
		_ = syscall.Kill(-p.pid, syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.exited:
			return
		case <-t.C:
			r.w.log.Info("Grace period over, killing container", "container", r.spec.Name, "gracePeriod", grace.String())
		}
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	<-p.exited
}

// execIn runs cmd inside the container (its network namespace, mounts and
// environment) for exec probes; a non-zero exit is an error.
func (r *containerRunner) execIn(ctx context.Context, cmd []string) error {
	if len(cmd) == 0 {
		return errors.New("empty command")
	}
	r.mu.Lock()
	env, pe, proc := r.execEnv, r.pexec, r.proc
	r.mu.Unlock()
	var c *exec.Cmd
	if proc != nil {
		c, _ = r.execCommand(cmd)
	} else {
		c = r.w.command(pe, cmd[0], cmd[1:])
		c.Env = env
	}
	var out strings.Builder
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		return err
	}
	var waitErr error // read after done is closed
	done := make(chan struct{})
	go func() { waitErr = c.Wait(); close(done) }()
	select {
	case <-done:
		if waitErr != nil {
			return fmt.Errorf("%w: %s", waitErr, strings.TrimSpace(out.String()))
		}
		return nil
	case <-ctx.Done():
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done // waitErr is "signal: killed": the timeout is the error to report
		return fmt.Errorf("timed out: %w", ctx.Err())
	}
}

// execCommand prepares cmd to run inside the running container: it joins
// the container's mount, network and UTS namespaces with nsenter (a small C
// program, far cheaper than starting pod-exec, a Go binary with client-go,
// on a loaded machine where probe timeouts are a second) and gets the
// container's environment. As in a real container, a program the image
// holds (`kubectl exec ... -- /ironlb status --local`) is the image's: the
// container sees the host's file system, not the image's, so cmd[0] is
// looked up in the image's root file system first, then on the host.
func (r *containerRunner) execCommand(cmd []string) (*exec.Cmd, error) {
	r.mu.Lock()
	env, proc := r.execEnv, r.proc
	r.mu.Unlock()
	if proc == nil {
		return nil, fmt.Errorf("container %s is not running", r.spec.Name)
	}
	if img, err := r.w.a.images.Lookup(r.spec.Image); err == nil && img.OCI != nil && len(cmd) > 0 {
		if prog, err := img.OCI.lookup(cmd[0], envValue(env, "PATH")); err == nil {
			cmd = append([]string{prog}, cmd[1:]...)
		}
	}
	wd := r.spec.WorkingDir
	if wd == "" {
		wd = "/"
	}
	args := append([]string{"-t", strconv.Itoa(proc.Pid), "-m", "-n", "-u", "--wd=" + wd, "--"}, cmd...)
	c := exec.Command("nsenter", args...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c.Env = env
	return c, nil
}

// envValue returns name's value in an environment list ("" if unset).
func envValue(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- { // the last assignment wins
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v
		}
	}
	return ""
}

// command builds the process that runs prog in the pod's network namespace
// and a private mount namespace with pe's binds, working directory and user.
func (w *podWorker) command(pe PodExec, prog string, args []string) *exec.Cmd {
	pod := w.latest()
	flags := uintptr(syscall.CLONE_NEWNS)
	if !pod.Spec.HostNetwork && pod.Name != "" {
		// Pods have their own host name, as in Kubernetes.
		flags |= syscall.CLONE_NEWUTS
		pe.Hostname = pod.Name
		if len(pe.Hostname) > 63 {
			pe.Hostname = pe.Hostname[:63]
		}
	}
	peArgs := PodExecArgs(pe, prog, args)
	var cmd *exec.Cmd
	if ns := w.netnsName(); ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, w.a.cfg.Self}, peArgs...)...)
	} else {
		cmd = exec.Command(w.a.cfg.Self, peArgs...)
	}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// Pods die with the agent (a hard-killed node takes its pods along);
		// a restarted agent starts them again.
		Pdeathsig:    syscall.SIGKILL,
		Unshareflags: flags,
	}
	return cmd
}

// containerCred returns the user an OCI image's container runs as: runAsUser and
// runAsGroup of the container's securityContext, else of the pod's, else the image's
// USER (a uid without a group gets its primary group from the image's /etc/passwd,
// else 0); the supplementary groups are the pod's fsGroup and supplementalGroups.
// runAsNonRoot refuses uid 0, as the kubelet does. Stand-ins (nil) run as root.
func containerCred(pod *corev1.Pod, c *corev1.Container, img *Image) (*Cred, error) {
	if img.OCI == nil {
		return nil, nil
	}
	var runAsUser, runAsGroup *int64
	var nonRoot *bool
	psc := pod.Spec.SecurityContext
	if psc != nil {
		runAsUser, runAsGroup, nonRoot = psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			runAsUser = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			runAsGroup = sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
	}
	spec := img.OCI.Config.User
	if runAsUser != nil {
		spec = strconv.FormatInt(*runAsUser, 10)
	}
	uid, gid, err := img.OCI.user(spec)
	if err != nil {
		return nil, err
	}
	if runAsGroup != nil {
		gid = *runAsGroup
	}
	if isTrue(nonRoot) && uid == 0 {
		return nil, fmt.Errorf("container has runAsNonRoot and image will run as root (pod: %s/%s, container: %s)", pod.Namespace, pod.Name, c.Name)
	}
	cred := &Cred{UID: uid, GID: gid}
	if psc != nil {
		if psc.FSGroup != nil {
			cred.Groups = append(cred.Groups, *psc.FSGroup)
		}
		cred.Groups = append(cred.Groups, psc.SupplementalGroups...)
	}
	return cred, nil
}

// writePidfile records pid with its start time, so that a restarted agent
// can kill exactly the processes it left behind.
func writePidfile(path string, pid int) {
	st, err := procStartTime(pid)
	if err != nil {
		return
	}
	_ = writeFileAtomic(path, []byte(fmt.Sprintf("%d %s\n", pid, st)), 0o644)
}

func procStartTime(pid int) (string, error) {
	st, err := procstat.Read(pid)
	if err != nil {
		return "", err
	}
	return strconv.FormatUint(st.StartTime, 10), nil
}

// killLeftovers kills processes an earlier agent run started and left
// behind (normally Pdeathsig already did).
func (a *Agent) killLeftovers() {
	files, _ := filepath.Glob(filepath.Join(a.cfg.StateDir, "pods", "*", "*.pid"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if rerr := os.Remove(f); rerr != nil && !os.IsNotExist(rerr) {
			a.log.Error(rerr, "Cannot remove a stale pid file", "path", f)
		}
		if err != nil {
			continue
		}
		var pid int
		var start string
		if _, err := fmt.Sscanf(string(data), "%d %s", &pid, &start); err != nil || pid <= 1 {
			continue
		}
		if cur, err := procStartTime(pid); err == nil && cur == start {
			a.log.Info("Killing a process left by an earlier agent run", "pid", pid, "pidfile", f)
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
