//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// The fault tests (issue 12) take a part of the cluster away while mypc's
// traffic runs (as the hitless tests do) and check that nothing is lost that
// the data path could have carried (0 moves, 0 broken, 0 failed; clients
// resolving the IP afresh get the owner's MAC), and that ironlb recovers.
const (
	// apiDownFor is how long the API server stays stopped: longer than the
	// controller's lease (15 s) and the speakers' hold time (30 s), so that
	// everything that could wrongly depend on the API server has failed.
	apiDownFor = 60 * time.Second
	// etcdDownFor is how long etcd stays killed: a crash and a restart.
	etcdDownFor = 10 * time.Second
	// partitionFor is how long a speaker is cut off from memberlist: well
	// past the failure detector's suspicion, below the hold time.
	partitionFor = 10 * time.Second
	// healWithin bounds how long after a partition ends the speakers find
	// each other again: memberlist gossips to dead members, and the
	// speakers re-join known peers every 5 s (internal/membership's
	// RejoinInterval); a move or a second announcer would follow at once.
	healWithin = 5*time.Second + settle
	// memberlistPort is the speakers' memberlist port (the chart's
	// speaker.memberlist.mlBindPort), UDP and TCP.
	memberlistPort = 7946
	// burstServices are created at once while the leading controller is killed.
	burstServices = 30
	// recoverBound bounds ironlb's recovery after an outage: the controller
	// may have exited (its lease lost) and its restart back-off run up to a
	// minute, then the lease (15 s).
	recoverBound = 3 * time.Minute
)

// daemonStopper returns the Hosts' DaemonStopper or skips the test.
func (e *Env) daemonStopper(t *testing.T) DaemonStopper {
	t.Helper()
	s, ok := e.Hosts.(DaemonStopper)
	if !ok {
		t.Skip("these hosts cannot stop the API server or etcd (the lab can; on kind, move the static pod's manifest out of /etc/kubernetes/manifests and back)")
	}
	return s
}

// TestFaultAPIServerDown kills the API server (SIGKILL: SIGTERM leaves it
// draining for tens of seconds) and keeps it down for apiDownFor while
// traffic runs: the data path carries on (0 moves, 0 broken, 0 failed), a client
// resolving the IP meanwhile gets the owner's MAC; once it is back, a new
// Service gets an IP.
func TestFaultAPIServerDown(t *testing.T) {
	e := requireEnv(t)
	e.controlPlaneOutage(t, labctl.ProcAPIServer, syscall.SIGKILL, apiDownFor, "e2e-fault-api", "172.18.254.106")
}

// TestFaultEtcdRestart kills etcd (SIGKILL) and starts it again etcdDownFor
// later while traffic runs: the same expectations as TestFaultAPIServerDown.
func TestFaultEtcdRestart(t *testing.T) {
	e := requireEnv(t)
	e.controlPlaneOutage(t, labctl.ProcEtcd, syscall.SIGKILL, etcdDownFor, "e2e-fault-etcd", "172.18.254.107")
}

// controlPlaneOutage stops daemon with sig for downFor while traffic runs to
// a fixture (name, ip), then starts it again: nothing moves or breaks, ARP
// is answered with the owner's MAC meanwhile, and afterwards a new Service
// gets a free IP within recoverBound.
func (e *Env) controlPlaneOutage(t *testing.T, daemon string, sig syscall.Signal, downFor time.Duration, name, ip string) {
	stopper := e.daemonStopper(t)
	dumpOnFailure(t, e, nil)
	applyWalkthrough(t, e)
	ctx := ctxT(t)
	f := e.newLBFixture(t, name, ip)
	tr, mv := e.observe(t, f, f.owner)
	started := false
	start := func() error {
		if started {
			return nil
		}
		started = true
		return stopper.StartDaemon(context.Background(), daemon)
	}
	t.Cleanup(func() {
		if err := start(); err != nil {
			t.Errorf("starting %s again: %v", daemon, err)
		}
	})
	if err := stopper.StopDaemon(ctx, daemon, sig); err != nil {
		started = true // it was never stopped
		tr.stop(t)
		t.Fatal(err)
	}
	stopped := time.Now()
	// A real kube-controller-manager runs with leader election: it cannot renew its lease
	// while the API server is away (renew deadline 10 s), exits, and starts afresh once the
	// API server is back, so its node lifecycle controller gives every node a new grace
	// period. The lab's runs without leader election and would otherwise judge the nodes by
	// heartbeats it could not see for a minute, mark them and their pods not Ready, and
	// empty every Service's endpoints: an outage of the lab, not one a cluster has.
	restartKCM := daemon == labctl.ProcAPIServer && downFor > 10*time.Second
	if restartKCM {
		if err := stopper.StopDaemon(ctx, labctl.ProcControllerManager, syscall.SIGTERM); err != nil {
			tr.stop(t)
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stopper.StartDaemon(context.Background(), labctl.ProcControllerManager) })
	}
	// Halfway through, a client resolving the IP afresh asks for it.
	time.Sleep(downFor / 2)
	e.checkARPAnswers(t, f, f.owner, fmt.Sprintf("with %s stopped for %v", daemon, time.Since(stopped).Round(time.Second)))
	time.Sleep(time.Until(stopped.Add(downFor)))
	if err := start(); err != nil {
		tr.stop(t)
		t.Fatalf("starting %s again: %v", daemon, err)
	}
	back := time.Now()
	t.Logf("%s stopped (%v) at %s, serving again %v later", daemon, sig, stopped.Format("15:04:05.000"), back.Sub(stopped).Round(time.Millisecond))
	if restartKCM {
		if err := stopper.StartDaemon(ctx, labctl.ProcControllerManager); err != nil {
			tr.stop(t)
			t.Fatalf("starting %s again: %v", labctl.ProcControllerManager, err)
		}
	}

	// ironlb recovers: a new Service gets an address no other Service holds.
	svc := name + "-after"
	e.create(t, lbService(svc, "webpod", ""))
	var got string
	poll(t, recoverBound, "an ingress IP on "+svc+" after "+daemon+" came back", func() (bool, string) {
		var err error
		got, err = e.ingressIP(context.Background(), "default", svc)
		if err != nil {
			return false, err.Error()
		}
		return got != "", "no ingress IP yet"
	})
	recovered := time.Since(back)
	if holders := e.ipHolders(t, got); len(holders) != 1 {
		t.Errorf("%s got %s, which %v hold", svc, got, holders)
	}
	poll(t, recoverBound, "ironlb ready after "+daemon+" came back", func() (bool, string) {
		why := e.notReady(ctx)
		return why == "", why
	})
	e.waitClusterReady(t, "after "+daemon+" came back")
	time.Sleep(settle)
	what := fmt.Sprintf("%s stopped for %v", daemon, downFor)
	requireHitless(t, what, tr.stop(t), mv.stop(t))
	e.checkAnnouncer(t, f, f.owner)
	t.Logf("%s: a new Service got %s %v after %s served again", what, got, recovered.Round(time.Millisecond), daemon)
}

// waitClusterReady waits until every node and every pod of the test's
// namespaces is Ready: after an outage, Kubernetes' node lifecycle controller
// may mark nodes and their pods not Ready until the nodes' agents report
// again, and the next test must not inherit that.
func (e *Env) waitClusterReady(t testing.TB, when string) {
	t.Helper()
	start := time.Now()
	var seen []string // what was not Ready at some point, for the log
	poll(t, recoverBound, "every node and pod Ready "+when, func() (bool, string) {
		ctx := context.Background()
		var notReady []string
		var nodes corev1.NodeList
		if err := e.C.List(ctx, &nodes); err != nil {
			return false, err.Error()
		}
		for i := range nodes.Items {
			if !labctl.NodeReady(&nodes.Items[i]) {
				notReady = append(notReady, "node/"+nodes.Items[i].Name)
			}
		}
		for _, ns := range []string{"default", Namespace} {
			var pods corev1.PodList
			if err := e.C.List(ctx, &pods, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && !podReady(p) {
					notReady = append(notReady, "pod/"+ns+"/"+p.Name)
				}
			}
		}
		for _, n := range notReady {
			if !slices.Contains(seen, n) {
				seen = append(seen, n)
			}
		}
		return len(notReady) == 0, fmt.Sprintf("not Ready: %v", notReady)
	})
	if len(seen) > 0 {
		t.Logf("%s, these were not Ready for up to %v: %v", when, time.Since(start).Round(time.Second), seen)
	}
}

// ipHolders returns the Services (namespace/name) whose ingress holds ip.
func (e *Env) ipHolders(t *testing.T, ip string) []string {
	t.Helper()
	var svcs corev1.ServiceList
	if err := e.C.List(context.Background(), &svcs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range svcs.Items {
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP == ip {
				out = append(out, s.Namespace+"/"+s.Name)
			}
		}
	}
	return out
}

// TestFaultControllerKillDuringBurst kills the leading controller (SIGKILL,
// as a crash: its lease is not released) while burstServices Services are
// being created at once from a pool of exactly that many addresses: every
// Service ends with exactly one IP, no IP is held by two Services in any
// state observed while it happens, and no other Service's IP changes.
func TestFaultControllerKillDuringBurst(t *testing.T) {
	e := requireEnv(t)
	dumpOnFailure(t, e, nil)
	applyWalkthrough(t, e)
	ctx := ctxT(t)
	pool := &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-burst-pool", Namespace: Namespace},
		Spec: v1beta1.IPAddressPoolSpec{
			Addresses:  []string{fmt.Sprintf("172.18.253.1-172.18.253.%d", burstServices)},
			AutoAssign: ptr(false),
		},
	}
	e.create(t, pool)
	leader, holder := e.controllerLeader(t, "")
	aw := e.watchAllocations(t)

	var names []string
	for i := range burstServices {
		names = append(names, fmt.Sprintf("e2e-burst-%02d", i))
	}
	deleteAll := func() {
		for _, n := range names {
			if err := e.C.Delete(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "default"}}); err != nil && !apierrors.IsNotFound(err) {
				t.Logf("deleting %s: %v", n, err)
			}
		}
	}
	deleteAll() // leftovers of an interrupted run
	t.Cleanup(deleteAll)
	var (
		wg      sync.WaitGroup
		created atomic.Int32
		errMu   sync.Mutex
		errs    []error
	)
	began := time.Now()
	for _, n := range names {
		wg.Go(func() {
			// No backends: the burst exercises the allocator, not the speakers.
			svc := lbService(n, "e2e-burst-none", "")
			svc.Annotations["metallb.io/address-pool"] = pool.Name
			if err := e.C.Create(ctx, svc); err != nil {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("creating %s: %w", n, err))
				errMu.Unlock()
			}
			created.Add(1)
		})
	}
	// Kill the leader a third of the way into the burst.
	for created.Load() < burstServices/3 && time.Since(began) < time.Minute {
		time.Sleep(5 * time.Millisecond)
	}
	killed, createdAtKill := time.Now(), created.Load()
	e.killController(t, leader)
	atKill := aw.allocated(names)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("killed the leading controller %s %v into the burst, %d of %d Services created, %d with an IP",
		leader.Name, killed.Sub(began).Round(time.Millisecond), createdAtKill, burstServices, atKill)

	poll(t, recoverBound, fmt.Sprintf("each of the %d burst Services with exactly one IP", burstServices), func() (bool, string) {
		var missing []string
		for _, n := range names {
			var svc corev1.Service
			if err := e.C.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: n}, &svc); err != nil {
				return false, err.Error()
			}
			if len(svc.Status.LoadBalancer.Ingress) != 1 {
				missing = append(missing, fmt.Sprintf("%s%v", n, svc.Status.LoadBalancer.Ingress))
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d without exactly one IP: %v", len(missing), missing)
	})
	last := aw.lastAllocation(names)
	newLeader, _ := e.controllerLeader(t, holder)
	res := aw.stop(t)
	for _, v := range res.violations {
		t.Error(v)
	}
	t.Logf("controller killed during a burst of %d creates: %d had an IP at the kill, all %d allocated %v after it (new leader %s); %d Service states watched, %d violations",
		burstServices, atKill, burstServices, last.Sub(killed).Round(time.Millisecond), newLeader.Name, res.states, len(res.violations))
	poll(t, recoverBound, "ironlb ready after the controller kill", func() (bool, string) {
		why := e.notReady(ctx)
		return why == "", why
	})
}

// controllerLeader returns the controller pod holding the leader Lease and
// its holder identity, once that identity is not notHolder ("": any; the
// killed leader's identity: a successor, another pod or the same pod's
// restarted process).
func (e *Env) controllerLeader(t *testing.T, notHolder string) (*corev1.Pod, string) {
	t.Helper()
	var (
		leader *corev1.Pod
		holder string
	)
	poll(t, recoverBound, "a controller pod holding the Lease "+controllers.LeaderElectionID, func() (bool, string) {
		ctx := context.Background()
		var lease coordinationv1.Lease
		if err := e.C.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: controllers.LeaderElectionID}, &lease); err != nil {
			return false, err.Error()
		}
		holder = ""
		if lease.Spec.HolderIdentity != nil {
			holder = *lease.Spec.HolderIdentity
		}
		if holder == notHolder {
			return false, "the Lease is still held by " + holder
		}
		var pods corev1.PodList
		if err := e.C.List(ctx, &pods, client.InNamespace(Namespace), client.MatchingLabels{"app.kubernetes.io/component": "controller"}); err != nil {
			return false, err.Error()
		}
		for i := range pods.Items {
			// controller-runtime's identity is the host name (the pod's
			// name) and a random suffix.
			if p := &pods.Items[i]; strings.HasPrefix(holder, p.Name+"_") && p.DeletionTimestamp == nil {
				leader = p
				return true, ""
			}
		}
		return false, fmt.Sprintf("holder %q is no controller pod", holder)
	})
	return leader, holder
}

// killController crashes a controller pod's process: SIGKILL where the
// Hosts can signal it, else a pod delete with grace period 0.
func (e *Env) killController(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if sig, ok := e.Hosts.(ContainerSignaller); ok {
		if err := sig.SignalContainer(ctx, pod, "controller", syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := e.CS.CoreV1().Pods(Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
}

// allocWatch follows every Service while something happens to the
// controller and checks each state it sees: no IP held by two Services
// (unless both allow sharing it under the same key), and no IP of a Service
// that existed before changed.
type allocWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	ips        map[string][]string // namespace/name -> ingress IPs
	shareKey   map[string]string   // namespace/name -> metallb.io/allow-shared-ip
	before     map[string]string   // Services that existed at the start -> their IPs
	firstIP    map[string]time.Time
	states     int
	violations []string
	down       error
}

// allocResult is what an allocWatch saw.
type allocResult struct {
	states     int
	violations []string
}

func (e *Env) watchAllocations(t *testing.T) *allocWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	aw := &allocWatch{cancel: cancel, ips: map[string][]string{}, shareKey: map[string]string{}, before: map[string]string{}, firstIP: map[string]time.Time{}}
	var svcs corev1.ServiceList
	if err := e.C.List(ctx, &svcs); err != nil {
		cancel()
		t.Fatal(err)
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		aw.observe(watch.Added, s)
		aw.before[svcKey(s)] = strings.Join(aw.ips[svcKey(s)], ",")
	}
	aw.wg.Add(1)
	go func() {
		defer aw.wg.Done()
		followWatch(ctx, svcs.ResourceVersion, func(rv string) (watch.Interface, error) {
			return e.C.Watch(ctx, &corev1.ServiceList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, func() (string, []runtime.Object, error) {
			var l corev1.ServiceList
			return listed(&l, e.C.List(ctx, &l))
		}, func(ev watch.Event) {
			if s, ok := ev.Object.(*corev1.Service); ok {
				aw.observe(ev.Type, s)
			}
		}, func(err error) {
			aw.mu.Lock()
			defer aw.mu.Unlock()
			if ctx.Err() == nil {
				aw.down = err
			}
		})
	}()
	t.Cleanup(cancel)
	return aw
}

func svcKey(s *corev1.Service) string { return s.Namespace + "/" + s.Name }

// observe records one state of a Service and checks it against the others.
func (aw *allocWatch) observe(typ watch.EventType, s *corev1.Service) {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	key := svcKey(s)
	aw.states++
	if typ == watch.Deleted {
		delete(aw.ips, key)
		return
	}
	var ips []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	aw.ips[key], aw.shareKey[key] = ips, s.Annotations["metallb.io/allow-shared-ip"]
	if _, ok := aw.firstIP[key]; !ok && len(ips) > 0 {
		aw.firstIP[key] = time.Now()
	}
	at := time.Now().Format("15:04:05.000")
	if was, ok := aw.before[key]; ok && was != strings.Join(ips, ",") {
		aw.violations = append(aw.violations, fmt.Sprintf("%s: %s, which held %q before, now shows %v", at, key, was, ips))
	}
	for other, oips := range aw.ips {
		if other == key || (aw.shareKey[key] != "" && aw.shareKey[key] == aw.shareKey[other]) {
			continue
		}
		for _, ip := range ips {
			if slices.Contains(oips, ip) {
				aw.violations = append(aw.violations, fmt.Sprintf("%s: %s shows %s, which %s holds", at, key, ip, other))
			}
		}
	}
}

// allocated counts the named Services (in default) that show an IP.
func (aw *allocWatch) allocated(names []string) int {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	n := 0
	for _, name := range names {
		if _, ok := aw.firstIP["default/"+name]; ok {
			n++
		}
	}
	return n
}

// lastAllocation is when the last of the named Services first showed an IP.
func (aw *allocWatch) lastAllocation(names []string) time.Time {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	var last time.Time
	for _, name := range names {
		if at := aw.firstIP["default/"+name]; at.After(last) {
			last = at
		}
	}
	return last
}

// stop ends the watch; it fails the test if the watch was not running.
func (aw *allocWatch) stop(t *testing.T) allocResult {
	t.Helper()
	aw.cancel()
	aw.wg.Wait()
	aw.mu.Lock()
	defer aw.mu.Unlock()
	if aw.down != nil {
		t.Fatalf("the watch of the Services was not running when it stopped: %v", aw.down)
	}
	return allocResult{states: aw.states, violations: slices.Clone(aw.violations)}
}

// TestFaultMemberlistPartition cuts one speaker off from memberlist for
// partitionFor (its node drops memberlist's port both ways) while the
// clients' traffic to the IP is untouched: first the owner, then a
// non-owner. The owner keeps the IP (its data path still answers), nothing
// moves or breaks, clients resolving the IP get the owner's MAC, and no
// other node starts answering for it (no AddressConflict, checked by the
// fixture).
func TestFaultMemberlistPartition(t *testing.T) {
	e := requireEnv(t)
	var involved []string
	dumpOnFailure(t, e, func() []string { return involved })
	applyWalkthrough(t, e)
	f := e.newLBFixture(t, "e2e-fault-partition", "172.18.254.108")
	// The non-owner is the owner's successor in name order: the owner's
	// deputy when every node can announce, the one that answers for it.
	nodes := slices.Sorted(slices.Values(e.topology(t).nodes))
	other := nodes[(slices.Index(nodes, f.owner)+1)%len(nodes)]
	for _, victim := range []string{f.owner, other} {
		role := "owner"
		if victim != f.owner {
			role = "non-owner"
		}
		t.Run(role, func(t *testing.T) {
			involved = []string{f.owner, victim}
			e.partitionSpeaker(t, f, victim)
		})
	}
}

// partitionSpeaker cuts victim off from memberlist for partitionFor while
// traffic runs to the fixture and checks the outcome.
func (e *Env) partitionSpeaker(t *testing.T, f *lbFixture, victim string) {
	ctx := ctxT(t)
	tr, mv := e.observe(t, f, f.owner)
	healed := false
	heal := func() {
		if healed {
			return
		}
		healed = true
		if err := e.setMemberlistBlocked(context.Background(), victim, false); err != nil {
			t.Errorf("healing the partition of %s: %v", victim, err)
		}
	}
	t.Cleanup(heal)
	cut := time.Now()
	if err := e.setMemberlistBlocked(ctx, victim, true); err != nil {
		heal()
		tr.stop(t)
		t.Fatal(err)
	}
	// Past memberlist's suspicion, the others hold victim as gone.
	time.Sleep(partitionFor / 2)
	e.checkARPAnswers(t, f, f.owner, fmt.Sprintf("with %s cut off from memberlist for %v", victim, time.Since(cut).Round(time.Second)))
	time.Sleep(time.Until(cut.Add(partitionFor)))
	in, out, err := e.memberlistDropped(ctx, victim)
	heal()
	if err != nil {
		t.Error(err)
	} else if in == 0 || out == 0 {
		t.Errorf("%s dropped %d incoming and %d outgoing memberlist packets: the partition did not cut both ways", victim, in, out)
	}
	time.Sleep(healWithin)
	what := fmt.Sprintf("%s cut off from memberlist for %v", victim, partitionFor)
	requireHitless(t, what, tr.stop(t), mv.stop(t))
	e.checkAnnouncer(t, f, f.owner)
	t.Logf("%s: %d incoming and %d outgoing memberlist packets dropped", what, in, out)
}

// partitionComment marks the rules setMemberlistBlocked adds.
const partitionComment = "ironlb-e2e-partition"

// memberlistRules are the iptables rules that cut a node off from
// memberlist both ways: UDP and TCP from or to memberlistPort, in and out.
func memberlistRules() [][]string {
	var out [][]string
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		for _, proto := range []string{"tcp", "udp"} {
			out = append(out, []string{chain, "-p", proto, "-m", "multiport", "--ports", strconv.Itoa(memberlistPort),
				"-m", "comment", "--comment", partitionComment, "-j", "DROP"})
		}
	}
	return out
}

// setMemberlistBlocked adds (first in their chains) or removes the rules
// that drop node's memberlist traffic, with iptables on the node: its
// speaker runs on the host network, and nothing else uses the port.
func (e *Env) setMemberlistBlocked(ctx context.Context, node string, blocked bool) error {
	for _, rule := range memberlistRules() {
		if blocked {
			if _, err := e.runOK(ctx, node, append([]string{"iptables", "-w", "-I"}, rule...)...); err != nil {
				return err
			}
			continue
		}
		// -D removes one copy; remove every copy a failed run may have left.
		for range 10 {
			r, err := e.Hosts.Run(ctx, node, append([]string{"iptables", "-w", "-D"}, rule...)...)
			if err != nil {
				return fmt.Errorf("%s: iptables -D %s: %w", node, strings.Join(rule, " "), err)
			}
			if r.Code != 0 {
				break
			}
		}
	}
	return nil
}

// memberlistDropped returns the packets the partition rules on node have
// dropped, incoming and outgoing.
func (e *Env) memberlistDropped(ctx context.Context, node string) (in, out int, err error) {
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		r, err := e.runOK(ctx, node, "iptables", "-w", "-L", chain, "-v", "-n", "-x")
		if err != nil {
			return 0, 0, err
		}
		for _, line := range strings.Split(r.Stdout, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.Contains(line, partitionComment) {
				n, _ := strconv.Atoi(f[0])
				if chain == "INPUT" {
					in += n
				} else {
					out += n
				}
			}
		}
	}
	return in, out, nil
}

// runOK runs argv on host; a non-zero exit is an error naming the command.
func (e *Env) runOK(ctx context.Context, host string, argv ...string) (Result, error) {
	r, err := e.Hosts.Run(ctx, host, argv...)
	if err == nil && r.Code != 0 {
		err = fmt.Errorf("%s: %s: exit %d: %s", host, strings.Join(argv, " "), r.Code, strings.TrimSpace(r.Stderr))
	}
	return r, err
}
