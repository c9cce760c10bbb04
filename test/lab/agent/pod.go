package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// podWorker runs one pod: network, volumes, containers, status, deletion.
type podWorker struct {
	a   *Agent
	uid types.UID
	log logr.Logger
	dir string

	notify chan struct{} // the pod object changed
	dirty  chan struct{} // the status we report changed

	mu          sync.Mutex
	pod         *corev1.Pod
	isGone      bool
	podIPs      []string // primary family first
	netReady    bool
	startTime   *metav1.Time
	setupWait   *corev1.ContainerStateWaiting // why containers have not been created yet
	initDone    bool
	terminal    corev1.PodPhase // Succeeded or Failed once every container is done for good
	inits       []*containerRunner
	mains       []*containerRunner
	tokens      map[string]cachedToken
	statusFinal bool // no more status updates (the pod is being removed)
	lastWritten *corev1.PodStatus
}

func newPodWorker(a *Agent, pod *corev1.Pod) *podWorker {
	w := &podWorker{
		a: a, uid: pod.UID, dir: a.podDir(pod.UID), pod: pod.DeepCopy(),
		log:    a.log.WithValues("pod", pod.Namespace+"/"+pod.Name, "podUID", pod.UID),
		notify: make(chan struct{}, 1), dirty: make(chan struct{}, 1),
		tokens: map[string]cachedToken{},
	}
	for i := range pod.Spec.InitContainers {
		c := pod.Spec.InitContainers[i]
		kind := kindInit
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			kind = kindSidecar
		}
		w.inits = append(w.inits, newContainerRunner(w, c, kind, pod.Status.InitContainerStatuses))
	}
	for i := range pod.Spec.Containers {
		w.mains = append(w.mains, newContainerRunner(w, pod.Spec.Containers[i], kindMain, pod.Status.ContainerStatuses))
	}
	return w
}

// update takes the API's latest copy of the pod. Its status is checked
// against what the agent computes, as the kubelet's status manager does:
// another component may have written it (the node lifecycle controller marks
// the pods of a node whose lease went stale not Ready, e.g. after the API
// server was away), and only the agent ever sets it right again.
func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.pod = pod.DeepCopy()
	w.mu.Unlock()
	signal(w.notify)
	w.markDirty()
}

func (w *podWorker) gone() {
	w.mu.Lock()
	w.isGone = true
	w.mu.Unlock()
	signal(w.notify)
}

func (w *podWorker) latest() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

func (w *podWorker) deleting() (bool, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.isGone || w.pod.DeletionTimestamp != nil, w.isGone
}

func (w *podWorker) markDirty() { signal(w.dirty) }

// runner returns the container named name (main or init), or nil.
func (w *podWorker) runner(name string) *containerRunner {
	for _, r := range append(append([]*containerRunner{}, w.mains...), w.inits...) {
		if r.spec.Name == name {
			return r
		}
	}
	return nil
}

// event records a Kubernetes event on the pod (the recorder aggregates repeats).
func (w *podWorker) event(eventType, reason, format string, args ...any) {
	if w.a.recorder == nil {
		return
	}
	w.a.recorder.Eventf(w.latest(), eventType, reason, format, args...)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// netnsName is the network namespace the pod's processes run in ("" = the
// agent's own, for hostNetwork pods when the agent was given no --netns).
func (w *podWorker) netnsName() string {
	if w.latest().Spec.HostNetwork {
		return w.a.cfg.NetNS
	}
	ns, _ := PodNetNames(w.uid)
	return ns
}

// setIPs writes the node's and the pod's addresses into a pod status.
func setIPs(st *corev1.PodStatus, a *Agent, podIPs []string) {
	st.HostIP = a.cfg.NodeIP
	st.HostIPs = a.hostIPs()
	if len(podIPs) > 0 {
		st.PodIP = podIPs[0]
		st.PodIPs = nil
		for _, ip := range podIPs {
			st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
		}
	}
}

// podForEnv is the pod as its containers see it through the downward API:
// with the addresses this agent assigned.
func (w *podWorker) podForEnv() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pod.DeepCopy()
	setIPs(&p.Status, w.a, w.podIPs)
	return p
}

// run runs the pod until it is removed (returns true) or the agent stops.
func (w *podWorker) run(ctx context.Context) bool {
	w.log.Info("Pod bound to this node")
	statusCtx, stopStatus := context.WithCancel(context.Background())
	statusDone := make(chan struct{})
	go func() { defer close(statusDone); w.statusLoop(statusCtx) }()
	defer func() { stopStatus(); <-statusDone }()

	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	allDone := make(chan struct{})

	if ph := w.latest().Status.Phase; ph == corev1.PodSucceeded || ph == corev1.PodFailed {
		// Finished before an agent restart: nothing to run, only deletion to handle.
		w.mu.Lock()
		w.terminal = ph
		w.statusFinal = true
		w.mu.Unlock()
	} else if w.prepare(ctx) {
		go w.runContainers(runCtx, allDone)
		go w.refreshVolumes(runCtx)
	}

	for {
		if del, _ := w.deleting(); del {
			w.remove(stopRun)
			return true
		}
		select {
		case <-ctx.Done():
			// Agent shutdown: stop the processes, keep namespace and address.
			stopRun()
			w.stopContainers(5 * time.Second)
			return false
		case <-w.notify:
		case <-allDone:
			allDone = nil
			w.finish()
		}
	}
}

// prepare sets up network and volumes, retrying until it works. It returns
// false if the pod is deleted or the agent stops first.
func (w *podWorker) prepare(ctx context.Context) bool {
	backoff := time.Second
	for {
		if del, _ := w.deleting(); del || ctx.Err() != nil {
			return false
		}
		err := w.setup(ctx)
		if err == nil {
			w.mu.Lock()
			w.setupWait = nil
			w.mu.Unlock()
			w.markDirty()
			return true
		}
		w.log.Error(err, "Preparing pod failed, retrying", "retryIn", backoff.String())
		w.mu.Lock()
		w.setupWait = &corev1.ContainerStateWaiting{Reason: "ContainerCreating", Message: err.Error()}
		w.mu.Unlock()
		w.markDirty()
		select {
		case <-ctx.Done():
		case <-w.notify:
		case <-time.After(backoff):
		}
		// Volumes wait for Secrets a controller creates: keep retries brisk.
		backoff = min(backoff*2, 4*time.Second)
	}
}

func (w *podWorker) setup(ctx context.Context) error {
	now := metav1.Now()
	w.mu.Lock()
	if w.startTime == nil {
		if st := w.pod.Status.StartTime; st != nil {
			w.startTime = st
		} else {
			w.startTime = &now
		}
	}
	w.mu.Unlock()
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return fmt.Errorf("creating pod state dir: %w", err)
	}
	if !w.latest().Spec.HostNetwork {
		ips, err := w.a.allocatePodIPs(string(w.uid))
		if err != nil {
			return err
		}
		if err := w.a.net.Setup(ctx, w.uid, ips); err != nil {
			return err
		}
		podIPs := make([]string, len(ips))
		for i, ip := range ips {
			podIPs[i] = ip.String()
		}
		w.mu.Lock()
		w.podIPs = podIPs
		w.netReady = true
		w.mu.Unlock()
		w.log.Info("Pod network ready", "podIPs", podIPs)
	} else {
		w.mu.Lock()
		w.podIPs = w.a.nodeIPs()
		w.netReady = true
		w.mu.Unlock()
	}
	w.markDirty()
	return w.materializeVolumes(ctx)
}

// runContainers runs init containers in order, then the main containers,
// and closes allDone when every main container is done for good.
func (w *podWorker) runContainers(ctx context.Context, allDone chan struct{}) {
	var wg sync.WaitGroup
	for _, ic := range w.inits {
		if ic.kind == kindSidecar {
			wg.Add(1)
			go func() { defer wg.Done(); ic.loop(ctx) }()
			if !ic.waitStarted(ctx) {
				return
			}
			continue
		}
		if !ic.loop(ctx) {
			if ctx.Err() == nil {
				w.mu.Lock()
				w.terminal = corev1.PodFailed
				w.mu.Unlock()
				w.markDirty()
				close(allDone)
			}
			return
		}
	}
	w.mu.Lock()
	w.initDone = true
	w.mu.Unlock()
	w.markDirty()
	var mainWG sync.WaitGroup
	for _, c := range w.mains {
		mainWG.Add(1)
		go func() { defer mainWG.Done(); c.loop(ctx) }()
	}
	mainWG.Wait()
	if ctx.Err() != nil {
		return
	}
	// Sidecars stop once the main containers are done.
	for _, ic := range w.inits {
		if ic.kind == kindSidecar {
			ic.stop(w.grace())
		}
	}
	wg.Wait()
	close(allDone)
}

// finish records the terminal phase once all containers are done for good
// and frees the network, as the kubelet does for completed pods.
func (w *podWorker) finish() {
	phase := corev1.PodSucceeded
	for _, c := range w.mains {
		if t := c.snapshot().State.Terminated; t == nil || t.ExitCode != 0 {
			phase = corev1.PodFailed
		}
	}
	w.mu.Lock()
	if w.terminal == "" {
		w.terminal = phase
	}
	w.mu.Unlock()
	w.log.Info("All containers finished", "phase", phase)
	w.markDirty()
	if !w.latest().Spec.HostNetwork {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w.a.net.Teardown(ctx, w.uid)
		// The status keeps showing the address, as in Kubernetes, but it is
		// free for new pods (completed Job pods must not exhaust the CIDR).
		if err := w.a.releasePodIPs(string(w.uid)); err != nil {
			w.log.Error(err, "Releasing pod address failed")
		}
	}
}

func (w *podWorker) grace() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g := w.pod.DeletionGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

func (w *podWorker) stopContainers(grace time.Duration) {
	var wg sync.WaitGroup
	for _, c := range append(append([]*containerRunner{}, w.mains...), w.inits...) {
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(grace) }()
	}
	wg.Wait()
}

// remove stops the containers with the grace period, frees network and
// address, and deletes the pod object so the API server can forget it.
func (w *podWorker) remove(stopRun context.CancelFunc) {
	_, gone := w.deleting()
	grace := w.grace()
	if gone {
		grace = 0
	}
	w.log.Info("Stopping pod", "gracePeriod", grace.String())
	if !gone {
		for _, c := range w.mains {
			if c.snapshot().State.Running != nil {
				w.event(corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
			}
		}
	}
	w.stopContainers(grace)
	stopRun()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !w.latest().Spec.HostNetwork {
		w.a.net.Teardown(ctx, w.uid)
		if err := w.a.releasePodIPs(string(w.uid)); err != nil {
			w.log.Error(err, "Releasing pod address failed")
		}
	}
	if err := os.RemoveAll(w.dir); err != nil {
		w.log.Error(err, "Removing pod state failed", "dir", w.dir)
	}
	w.mu.Lock()
	w.statusFinal = true
	pod := w.pod
	w.mu.Unlock()
	if gone {
		w.log.Info("Pod removed")
		return
	}
	// Report the final container states, then let the API server free the pod.
	w.syncStatus(ctx, true)
	err := w.a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &w.uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.log.Error(err, "Deleting pod object failed")
		return
	}
	w.log.Info("Pod removed")
}

// statusLoop writes the pod status whenever it changes.
func (w *podWorker) statusLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.dirty:
		}
		if !w.syncStatus(ctx, false) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				signal(w.dirty)
			}
		}
	}
}

// syncStatus writes the computed status if it differs from the stored one.
// It returns false when the write should be retried.
func (w *podWorker) syncStatus(ctx context.Context, final bool) bool {
	w.mu.Lock()
	if w.statusFinal && !final {
		w.mu.Unlock()
		return true
	}
	pod := w.pod
	w.mu.Unlock()
	pods := w.a.client.CoreV1().Pods(pod.Namespace)
	for attempt := 0; attempt < 5; attempt++ {
		st := w.computeStatus(pod, time.Now())
		// The informer's copy may predate our last write: skip only when the
		// status matches both.
		w.mu.Lock()
		last := w.lastWritten
		w.mu.Unlock()
		if apiequality.Semantic.DeepEqual(st, pod.Status) && (last == nil || apiequality.Semantic.DeepEqual(st, *last)) {
			return true
		}
		upd := pod.DeepCopy()
		upd.Status = st
		res, err := pods.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		if err == nil {
			w.mu.Lock()
			w.lastWritten = res.Status.DeepCopy()
			w.mu.Unlock()
			return true
		}
		if apierrors.IsNotFound(err) || ctx.Err() != nil {
			return true
		}
		if !apierrors.IsConflict(err) {
			w.log.Error(err, "Updating pod status failed")
			return false
		}
		fresh, gerr := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr != nil {
			return apierrors.IsNotFound(gerr)
		}
		if fresh.UID != w.uid {
			return true
		}
		pod = fresh
	}
	return false
}

// computeStatus derives the pod status from the containers' states, keeping
// conditions other components own (PodScheduled, DisruptionTarget, ...).
func (w *podWorker) computeStatus(pod *corev1.Pod, now time.Time) corev1.PodStatus {
	w.mu.Lock()
	podIPs, netReady, startTime, setupWait := w.podIPs, w.netReady, w.startTime, w.setupWait
	initDone, terminal := w.initDone, w.terminal
	w.mu.Unlock()

	st := *pod.Status.DeepCopy()
	setIPs(&st, w.a, podIPs)
	st.StartTime = startTime
	st.InitContainerStatuses = w.containerStatuses(w.inits, setupWait)
	st.ContainerStatuses = w.containerStatuses(w.mains, setupWait)
	if len(w.inits) == 0 {
		initDone = setupWait == nil && netReady
	}

	allReady := len(st.ContainerStatuses) > 0
	var notReady []string
	pending := setupWait != nil || !initDone
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready {
			allReady = false
			notReady = append(notReady, cs.Name)
		}
		if cs.State.Waiting != nil && cs.LastTerminationState.Terminated == nil {
			pending = true
		}
	}
	switch {
	case terminal != "":
		st.Phase = terminal
	case pending:
		st.Phase = corev1.PodPending
	default:
		st.Phase = corev1.PodRunning
	}

	cond := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
			reason, msg = "", ""
		}
		setPodCondition(&st, corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg}, now)
	}
	cond(corev1.PodReadyToStartContainers, netReady && terminal == "", "", "")
	cond(corev1.PodInitialized, initDone, "ContainersNotInitialized", "containers with incomplete status: "+names(w.inits))
	if terminal != "" {
		cond(corev1.ContainersReady, false, "PodCompleted", "")
		cond(corev1.PodReady, false, "PodCompleted", "")
	} else {
		msg := fmt.Sprintf("containers with unready status: [%s]", strings.Join(notReady, " "))
		cond(corev1.ContainersReady, allReady, "ContainersNotReady", msg)
		ready := allReady
		var gates []string
		for _, g := range pod.Spec.ReadinessGates {
			if c := findCondition(st.Conditions, g.ConditionType); c == nil || c.Status != corev1.ConditionTrue {
				ready = false
				gates = append(gates, string(g.ConditionType))
			}
		}
		reason := "ContainersNotReady"
		if allReady && len(gates) > 0 {
			reason, msg = "ReadinessGatesNotReady", "corresponding condition of pod readiness gate "+strings.Join(gates, ",")+" does not exist or is not True"
		}
		cond(corev1.PodReady, ready, reason, msg)
	}
	return st
}

func names(rs []*containerRunner) string {
	var n []string
	for _, r := range rs {
		if s := r.snapshot(); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			n = append(n, r.spec.Name)
		}
	}
	return "[" + strings.Join(n, " ") + "]"
}

func (w *podWorker) containerStatuses(rs []*containerRunner, setupWait *corev1.ContainerStateWaiting) []corev1.ContainerStatus {
	if len(rs) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, 0, len(rs))
	for _, r := range rs {
		s := r.snapshot()
		if setupWait != nil && s.State.Running == nil && s.State.Terminated == nil && s.State.Waiting == nil {
			s.State.Waiting = setupWait.DeepCopy()
		}
		if s.State.Running == nil && s.State.Terminated == nil && s.State.Waiting == nil {
			s.State.Waiting = &corev1.ContainerStateWaiting{Reason: "PodInitializing"}
		}
		out = append(out, s)
	}
	return out
}

func findCondition(cs []corev1.PodCondition, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// setPodCondition sets c, keeping the transition time when the status is unchanged.
func setPodCondition(st *corev1.PodStatus, c corev1.PodCondition, now time.Time) {
	if old := findCondition(st.Conditions, c.Type); old != nil {
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.NewTime(now)
		}
		c.LastProbeTime = old.LastProbeTime
		*old = c
		return
	}
	c.LastTransitionTime = metav1.NewTime(now)
	st.Conditions = append(st.Conditions, c)
}

// baseEnv is what every container gets before its own env: PATH, HOSTNAME
// and the kubernetes Service variables.
func (w *podWorker) baseEnv(ctx context.Context) *Env {
	e := NewEnv()
	e.Set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if pod := w.latest(); pod.Spec.HostNetwork {
		e.Set("HOSTNAME", w.a.cfg.NodeName)
	} else {
		e.Set("HOSTNAME", pod.Name)
	}
	e.Set("HOME", "/root")
	host := w.a.kubernetesServiceHost(ctx)
	addr, err := netip.ParseAddr(host)
	if err == nil {
		host = addr.String()
	}
	e.Set("KUBERNETES_SERVICE_HOST", host)
	e.Set("KUBERNETES_SERVICE_PORT", "443")
	e.Set("KUBERNETES_SERVICE_PORT_HTTPS", "443")
	e.Set("KUBERNETES_PORT", "tcp://"+host+":443")
	e.Set("KUBERNETES_PORT_443_TCP", "tcp://"+host+":443")
	e.Set("KUBERNETES_PORT_443_TCP_PROTO", "tcp")
	e.Set("KUBERNETES_PORT_443_TCP_PORT", "443")
	e.Set("KUBERNETES_PORT_443_TCP_ADDR", host)
	return e
}
