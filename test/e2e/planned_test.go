//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// The planned-move tests (issue 22) move an IP away from an owner that still
// delivers while keepAliveConns persistent connections (a request every
// 100 ms) and a new connection every 20 ms run from mypc, and require what a
// user would want: the IP moved once, to another node, 0 broken connections
// and 0 failed new ones. The connections opened before the move go on through
// the previous owner (the new owner forwards what it never saw start:
// second chance, internal/secondchance); without it each would reset.

// TestPlannedMoveExcludeLabel: the owner gets the
// exclude-from-external-load-balancers label.
func TestPlannedMoveExcludeLabel(t *testing.T) {
	e := requireEnv(t)
	forEachFamily(t, e, "172.18.254.160", "fc00:f853:ccd:e793:fffe::160", func(t *testing.T, ip string) {
		e.plannedMove(t, "e2e-pm-exclude"+familySuffix(ip), ip, func(t *testing.T, f *lbFixture) {
			e.setExcludeLabel(t, f.owner, true)
			t.Cleanup(func() { e.setExcludeLabel(t, f.owner, false) })
		})
	})
}

// TestPlannedMoveDrain: `kubectl ironlb drain` on the owner, which waits
// until nothing is announced from it; undrain makes it eligible again.
func TestPlannedMoveDrain(t *testing.T) {
	e := requireEnv(t)
	plugin := e.buildPlugin(t)
	e.plannedMove(t, "e2e-pm-drain", "172.18.254.161", func(t *testing.T, f *lbFixture) {
		t.Cleanup(func() {
			if out, err := e.run(context.Background(), plugin, "undrain", f.owner, "--kubeconfig", e.Kubeconfig); err != nil {
				t.Errorf("kubectl ironlb undrain %s: %v\n%s", f.owner, err, out)
			}
		})
		out, err := e.run(ctxT(t), plugin, "drain", f.owner, "--kubeconfig", e.Kubeconfig, "--ironlb-namespace", Namespace, "--timeout", "2m")
		t.Logf("kubectl ironlb drain %s:\n%s", f.owner, out)
		if err != nil {
			t.Fatalf("kubectl ironlb drain %s: %v", f.owner, err)
		}
		var n corev1.Node
		if err := e.C.Get(context.Background(), client.ObjectKey{Name: f.owner}, &n); err != nil {
			t.Fatal(err)
		}
		if !election.Drained(&n) {
			t.Fatalf("%s has no %s annotation after drain: %v", f.owner, election.DrainAnnotation, n.Annotations)
		}
		// The traffic's keep-alive connections, opened before the move,
		// are forwarded to the drained node, and the command says so.
		m := regexp.MustCompile(`(\d+) connections opened before the move are still forwarded to ` + regexp.QuoteMeta(f.owner) + ` `).FindStringSubmatch(out)
		if m == nil || m[1] == "0" {
			t.Fatalf("kubectl ironlb drain did not report the keep-alive connections forwarded to %s", f.owner)
		}
	})
}

// TestPlannedMoveNodeSelector: the Service's L2Advertisement stops selecting
// the owner.
func TestPlannedMoveNodeSelector(t *testing.T) {
	e := requireEnv(t)
	e.plannedMove(t, "e2e-pm-selector", "172.18.254.162", func(t *testing.T, f *lbFixture) {
		var ad v1beta1.L2Advertisement
		if err := e.C.Get(context.Background(), client.ObjectKey{Namespace: Namespace, Name: f.name + "-adv"}, &ad); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(ad.DeepCopy())
		ad.Spec.NodeSelectors = []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: labctl.ControlPlaneRole, Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpNotIn, Values: []string{f.owner}},
		}}}
		if err := e.C.Patch(context.Background(), &ad, patch); err != nil {
			t.Fatal(err)
		}
	})
}

// plannedMove runs one planned move: the fixture, the traffic, move (which
// makes the owner ineligible), the wait for another announcer and for the
// client to reach it, a few seconds more of traffic, and the verdict.
func (e *Env) plannedMove(t *testing.T, name, ip string, move func(t *testing.T, f *lbFixture)) {
	applyWalkthrough(t, e)
	f := e.newLBFixture(t, name, ip)
	dumpOnFailure(t, e, func() []string { return f.workers })
	tr, mv := e.observe(t, f, f.owner)
	start := time.Now()
	move(t, f)
	var next string
	poll(t, 2*time.Minute, fmt.Sprintf("%s announced from a node other than %s", f.name, f.owner), func() (bool, string) {
		nodes, err := e.announcers(context.Background(), "default", f.name)
		if err != nil {
			return false, err.Error()
		}
		if len(nodes) != 1 || nodes[0] == f.owner {
			return false, fmt.Sprintf("announcers %v", nodes)
		}
		next = nodes[0]
		return true, ""
	})
	e.waitNeighbour(t, f.ip, next, f.macs)
	t.Logf("%s moved from %s to %s in %v", f.ip, f.owner, next, time.Since(start).Round(time.Millisecond))
	// The connections opened before the move keep going through the
	// previous owner for a while: several requests each after the move.
	time.Sleep(settle)
	rep := tr.stop(t)
	c := mv.stop(t)
	t.Logf("announcers: %s", c)
	if c.StatusMoves != 1 || c.Last != next || !slices.Contains(f.workers, next) {
		t.Errorf("want exactly one move, to %s: %d ServiceL2Status moves, last to %s", next, c.StatusMoves, c.Last)
	}
	requireUnbroken(t, f.name+" moved from "+f.owner+" to "+next+" (the keep-alive connections opened before the move)", rep)
}

// TestRebalanceAfterRestore: with --rebalance-rate, the IPs a node kill
// moved onto the survivors go back to the restored node by planned moves:
// it takes its share back, and no connection through an IP that moved
// back breaks (the keep-alive connections were opened while the node was
// down, through the survivors, which the new owner forwards them to).
func TestRebalanceAfterRestore(t *testing.T) {
	e := requireEnv(t)
	e.setChartValues(t, "speaker.ownership.rebalanceRate=30")
	e.rebalanceAfterRestore(t, "e2e-rebalance", "172.18.254.168/29", nil)
}

// TestRebalanceOnDemand: the same with the chart's defaults (no automatic
// rebalancing: the restored node takes nothing back by itself) and then
// `kubectl ironlb rebalance`.
func TestRebalanceOnDemand(t *testing.T) {
	e := requireEnv(t)
	plugin := e.buildPlugin(t)
	// The command removes its annotation when done; if it failed half-way,
	// the annotation must not make the next tests' speakers rebalance.
	t.Cleanup(func() {
		var nodes corev1.NodeList
		if err := e.C.List(context.Background(), &nodes); err != nil {
			t.Errorf("listing nodes: %v", err)
			return
		}
		for _, n := range nodes.Items {
			if _, ok := n.Annotations[election.RebalanceAnnotation]; ok {
				t.Errorf("node %s still has the %s annotation after kubectl ironlb rebalance", n.Name, election.RebalanceAnnotation)
				patch := client.MergeFrom(n.DeepCopy())
				delete(n.Annotations, election.RebalanceAnnotation)
				_ = e.C.Patch(context.Background(), &n, patch)
			}
		}
	})
	e.rebalanceAfterRestore(t, "e2e-rebalance-cli", "172.18.254.176/29", func(t *testing.T, victim string, spread func() map[string]int) {
		// Nothing moves back by itself.
		time.Sleep(10 * time.Second)
		if sp := spread(); sp[victim] != 0 {
			t.Fatalf("%s took IPs back without rebalancing asked: spread %v", victim, sp)
		}
		out, err := e.run(ctxT(t), plugin, "rebalance", "--kubeconfig", e.Kubeconfig, "--ironlb-namespace", Namespace, "--timeout", "2m")
		t.Logf("kubectl ironlb rebalance:\n%s", out)
		if err != nil {
			t.Fatalf("kubectl ironlb rebalance: %v", err)
		}
	})
}

// rebalanceAfterRestore creates six Services of a workers-only pool (cidr),
// kills a worker, starts traffic to every IP through the survivors, restores
// the worker, runs ask (nil: nothing, rebalancing is automatic) and waits
// until the worker took its share back; no connection may break.
func (e *Env) rebalanceAfterRestore(t *testing.T, name, cidr string, ask func(t *testing.T, victim string, spread func() map[string]int)) {
	killer, ok := e.Hosts.(NodeKiller)
	if !ok {
		t.Skip("these hosts cannot kill a node (the lab can)")
	}
	applyWalkthrough(t, e)
	tp := e.topology(t)
	workers := without(tp.nodes, tp.controlPlane)
	victim := workers[len(workers)-1]
	survivors := without(workers, victim)
	dumpOnFailure(t, e, func() []string { return workers })

	// Six Services of a workers-only pool, backends on the survivors (so
	// that the kill takes no backend away).
	e.createL2Pool(t, name, name, cidr, true)
	for _, w := range survivors {
		e.create(t, whoamiPod(name+"-"+w, name, w))
	}
	var svcs, ips []string
	for i := range 6 {
		s := fmt.Sprintf("%s-%d", name, i)
		svc := lbService(s, name, "")
		svc.Annotations["metallb.io/address-pool"] = name
		singleStack(svc, corev1.IPv4Protocol)
		e.create(t, svc)
		svcs = append(svcs, s)
	}
	for _, s := range svcs {
		ips = append(ips, e.waitIngressIP(t, "default", s))
		e.waitAnnouncer(t, "default", s, "")
	}
	spread := func() map[string]int {
		out := map[string]int{}
		for _, s := range svcs {
			nodes, err := e.announcers(context.Background(), "default", s)
			if err == nil && len(nodes) == 1 {
				out[nodes[0]]++
			}
		}
		return out
	}
	t.Logf("spread before the kill: %v", spread())

	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = killer.RestoreNode(context.Background(), victim)
		}
	})
	speakerBefore := containerID(e.speakerPodObj(t, victim), "speaker")
	if err := killer.KillNode(ctxT(t), victim); err != nil {
		t.Fatalf("killing %s: %v", victim, err)
	}
	poll(t, 2*time.Minute, "every Service announced from a survivor", func() (bool, string) {
		sp := spread()
		return sp[victim] == 0 && sp[survivors[0]]+sp[survivors[1]] == len(svcs), fmt.Sprintf("spread %v", sp)
	})
	t.Logf("spread with %s down: %v", victim, spread())
	for _, ip := range ips {
		e.waitServing(t, ip)
	}
	// The traffic starts now, through the survivors: what moves back to
	// the victim must be forwarded to them.
	var trs []*traffic
	for _, ip := range ips {
		trs = append(trs, e.startTrafficEvery(t, ip, 100*time.Millisecond))
	}
	if err := killer.RestoreNode(ctxT(t), victim); err != nil {
		t.Fatalf("restoring %s: %v", victim, err)
	}
	restored = true
	e.waitSpeakerRestarted(t, victim, speakerBefore)
	if ask != nil {
		ask(t, victim, spread)
	}
	// The spread is even again: the victim took its share back, and
	// nothing moved for three rebalance periods (every node's load, the
	// walkthrough's IPs included, is what is balanced, so the victim's
	// share of these six is 1 to 3).
	start := time.Now()
	last, stable := "", time.Time{}
	poll(t, 2*time.Minute, "the victim's share back and the spread stable for 6 s", func() (bool, string) {
		sp := spread()
		cur := fmt.Sprint(sp)
		if cur != last {
			last, stable = cur, time.Now()
		}
		return sp[victim] >= 1 && sp[victim]+sp[survivors[0]]+sp[survivors[1]] == len(svcs) && time.Since(stable) >= 6*time.Second,
			"spread " + cur
	})
	t.Logf("spread even again %v after %s's speaker restarted: %v", time.Since(start).Round(100*time.Millisecond), victim, spread())
	for i, tr := range trs {
		requireUnbroken(t, ips[i], tr.stop(t))
	}
}

// setChartValues upgrades the release with --set values for the rest of the
// test, and back to the chart's defaults after it (both roll the speakers,
// which moves nothing).
func (e *Env) setChartValues(t *testing.T, values ...string) {
	t.Helper()
	args := []string{"--kubeconfig", e.Kubeconfig, "upgrade", "--install", Release, filepath.Join(e.Root, "charts", "ironlb"), "-n", Namespace, "--reset-values"}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	if out, err := e.run(ctxT(t), e.Helm, args...); err != nil {
		t.Fatalf("helm upgrade --set %v: %v\n%s", values, err, out)
	}
	t.Cleanup(func() {
		if err := e.install(context.Background()); err != nil {
			t.Errorf("back to the chart's defaults: %v", err)
		}
	})
	if err := e.waitReady(ctxT(t), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// TestFailbackImmediateReturn: with --failback=immediate (MetalLB's
// behaviour), a restored node takes its IP back at once: a planned move
// from the node that took it over, drained, so the connections opened
// while it was down do not break. (The kill itself breaks the connections
// through it once: nobody holds their state any more.)
func TestFailbackImmediateReturn(t *testing.T) {
	e := requireEnv(t)
	killer, ok := e.Hosts.(NodeKiller)
	if !ok {
		t.Skip("these hosts cannot kill a node (the lab can)")
	}
	applyWalkthrough(t, e)
	e.setChartValues(t, "speaker.ownership.failback=immediate")
	f := e.newLBFixture(t, "e2e-pm-failback", "172.18.254.163")
	victim := f.owner
	dumpOnFailure(t, e, func() []string { return f.workers })
	if w := election.Rank(f.ip, f.workers)[0]; w != victim {
		t.Fatalf("with failback=immediate %s should be announced from the hash winner %s, not %s", f.ip, w, victim)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = killer.RestoreNode(context.Background(), victim)
		}
	})
	speakerBefore := containerID(e.speakerPodObj(t, victim), "speaker")
	if err := killer.KillNode(ctxT(t), victim); err != nil {
		t.Fatalf("killing %s: %v", victim, err)
	}
	next := election.Rank(f.ip, without(f.workers, victim))[0]
	e.waitFailedOver(t, f, next)

	// Connections opened through the node that took over, then the return.
	tr, mv := e.observe(t, f, next)
	if err := killer.RestoreNode(ctxT(t), victim); err != nil {
		t.Fatalf("restoring %s: %v", victim, err)
	}
	restored = true
	e.waitSpeakerRestarted(t, victim, speakerBefore)
	e.waitFailedOver(t, f, victim)
	time.Sleep(settle)
	rep, c := tr.stop(t), mv.stop(t)
	t.Logf("announcers: %s", c)
	if c.StatusMoves != 1 || c.Last != victim {
		t.Errorf("want exactly one move, back to %s: %d ServiceL2Status moves, last to %s", victim, c.StatusMoves, c.Last)
	}
	requireUnbroken(t, f.name+" back on "+victim+" (the keep-alive connections opened before the return)", rep)
}
