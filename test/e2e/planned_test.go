//go:build e2e

package e2e

import (
	"context"
	"fmt"
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
	if k := rep.KeepAlive; k.Broken != 0 {
		t.Errorf("%d breaks of the %d keep-alive connections opened before the move (target 0; %s)", k.Broken, len(k.Conns), breakKinds(k))
	}
	if n := rep.NewConns; n.Failed != 0 {
		t.Errorf("%d of %d new connections failed (target 0): %v", n.Failed, n.Total, n.Failures)
	}
	requireEachConnServed(t, f.name, rep)
}
