//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

// BenchmarkVersusMetalLB runs the same probes on ironlb and on MetalLB v0.16.2 (built from
// its Go module by `make metallb`, hack/metallb) in one lab, one after the other: each is
// installed as its users install it (ironlb: the chart; MetalLB: kubectl apply -f
// config/manifests/metallb-native.yaml), measured, and removed completely (CRDs and the
// metallb-system namespace included: both own the metallb.io CRDs). For each:
//
//   - rolling restart: `kubectl rollout restart` of the speaker DaemonSet while mypc holds
//     4 keep-alive connections and opens a new connection every 20 ms (the hitless tests'
//     traffic); counted: IP moves, keep-alive breaks, failed new connections;
//   - create: E2E_VS_CREATE (default 10) Services created one after the other:
//     create -> IP in status, IP -> first ARP reply at mypc, create -> first good request
//     (BenchmarkServiceToTraffic's probe);
//   - hard kill: E2E_VS_KILLS (default 20) kills of the announcing node, kill -> first
//     request that succeeds (BenchmarkFailover's probe).
//
// The sub-benchmarks ironlb and MetalLB can run alone (-bench 'VersusMetalLB/MetalLB');
// when both ran, a table gives each figure and the ratio MetalLB/ironlb
// (docs/benchmarks-metallb.md).
//
//	sudo make bench-metallb
func BenchmarkVersusMetalLB(b *testing.B) {
	e := benchEnv(b)
	if _, ok := e.Hosts.(NodeKiller); !ok {
		b.Skip("these hosts cannot kill a node (the lab can)")
	}
	mlb := metallbImpl(b, e)
	impls := []*lbImpl{ironlbImpl, mlb}
	kills, creates := getenvInt("E2E_VS_KILLS", 20), getenvInt("E2E_VS_CREATE", 10)
	results := map[string]*versusResult{}
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				results[im.name] = e.versusRun(b, im, impls, kills, creates)
			}
		})
	}
	if !e.Ephemeral && e.Impl != ironlbImpl {
		// Leave a cluster the suite did not bring up as it was found: with ironlb.
		e.switchTo(b, ironlbImpl, impls)
	}
	if ir, ml := results[ironlbImpl.name], results[mlb.name]; ir != nil && ml != nil {
		printVersus(ir, ml)
	}
}

// metallbImpl is MetalLB as its users install it, from the module hack/metallb pins; the lab
// runs its images from bin/metallb-controller and bin/metallb-speaker.
func metallbImpl(b *testing.B, e *Env) *lbImpl {
	for _, c := range []string{"metallb-controller", "metallb-speaker"} {
		if !fileExists(filepath.Join(e.Root, "bin", c)) {
			b.Skipf("no bin/%s: run `make metallb` before the lab comes up (make bench-metallb does)", c)
		}
	}
	out, err := e.run(context.Background(), "go", "-C", "hack/metallb", "list", "-m", "-f", "{{.Dir}}", "go.universe.tf/metallb")
	if err != nil {
		b.Fatalf("locating MetalLB's module: %v\n%s", err, out)
	}
	manifest := filepath.Join(strings.TrimSpace(out), "config", "manifests", "metallb-native.yaml")
	if !fileExists(manifest) {
		b.Fatalf("MetalLB's manifest %s does not exist", manifest)
	}
	return &lbImpl{
		name:       "MetalLB",
		controller: "controller", speaker: "speaker", webhookService: "metallb-webhook-service",
		speakerLabels: map[string]string{"app": "metallb", "component": "speaker"},
		install: func(e *Env, ctx context.Context) error {
			if out, err := e.kubectl(ctx, "", "apply", "-f", manifest); err != nil {
				return fmt.Errorf("installing MetalLB: %w\n%s", err, out)
			}
			return e.waitReady(ctx, 3*time.Minute)
		},
		uninstall: func(e *Env, ctx context.Context) error {
			if out, err := e.kubectl(ctx, "", "delete", "-f", manifest, "--ignore-not-found", "--wait", "--timeout=3m"); err != nil {
				return fmt.Errorf("removing MetalLB: %w\n%s", err, out)
			}
			return nil
		},
	}
}

// versusResult is what versusRun measured for one implementation.
type versusResult struct {
	kills   killStats
	creates createStats
	roll    probe.Report
	moves   moveCount
}

// versusRun installs im alone and runs the three probes on it.
func (e *Env) versusRun(b *testing.B, im *lbImpl, all []*lbImpl, kills, creates int) *versusResult {
	start := time.Now()
	e.switchTo(b, im, all)
	fmt.Fprintf(os.Stderr, "== %s installed alone and ready in %v\n", im.name, time.Since(start).Round(time.Second))
	dumpOnFailure(b, e, nil)
	applyWalkthrough(b, e)
	var r versusResult

	// One fixture (a pool holding one IP, announced by the workers) for the rollout and the kills.
	f := e.newLBFixture(b, "vs-"+strings.ToLower(im.name), "172.18.254.130")
	fmt.Fprintf(os.Stderr, "== %s: rolling restart of the speakers under traffic\n", im.name)
	r.roll, r.moves = e.rollSpeakersUnderTraffic(b, f)
	fmt.Fprintf(os.Stderr, "rolling restart: %d ServiceL2Status moves, %d nodeAssigned moves; keep-alive: %d breaks of %d connections (%s); new connections: %d of %d failed\n  timeline:\n  %s\n",
		r.moves.StatusMoves, r.moves.EventMoves, r.roll.KeepAlive.Broken, len(r.roll.KeepAlive.Conns), breakKinds(r.roll.KeepAlive),
		r.roll.NewConns.Failed, r.roll.NewConns.Total, strings.Join(r.moves.Log, "\n  "))
	b.ReportMetric(float64(r.moves.StatusMoves), "roll-moves")
	b.ReportMetric(float64(r.roll.KeepAlive.Broken), "roll-keepalive-broken")
	b.ReportMetric(float64(r.roll.NewConns.Failed), "roll-new-failed")

	fmt.Fprintf(os.Stderr, "== %s: %d Services created one after the other\n", im.name, creates)
	r.creates = createRuns(b, e, "vs-create", creates)
	r.creates.report(b)

	fmt.Fprintf(os.Stderr, "== %s: %d hard kills of the announcing node\n", im.name, kills)
	r.kills = e.hardKills(b, f, kills)
	r.kills.report(b)
	fmt.Fprintf(os.Stderr, "== %s done in %v\n", im.name, time.Since(start).Round(time.Second))
	return &r
}

// switchTo leaves im the only implementation installed and ready: the walkthrough's
// Services are deleted (the implementation installed releases their IPs), every other
// implementation whose controller Deployment exists is removed completely, then im is
// installed (or, already there, waited for).
func (e *Env) switchTo(t testing.TB, im *lbImpl, all []*lbImpl) {
	t.Helper()
	ctx := ctxT(t)
	if out, err := e.kubectl(ctx, "", "delete", "-f", filepath.Join(e.Root, "examples", "walkthrough", "services.yaml"), "--ignore-not-found", "--wait"); err != nil {
		t.Fatalf("deleting the walkthrough's Services: %v\n%s", err, out)
	}
	for _, other := range all {
		if other == im || !e.deployed(t, other) {
			continue
		}
		start := time.Now()
		e.Impl = other
		if err := other.uninstall(e, ctx); err != nil {
			t.Fatal(err)
		}
		poll(t, 3*time.Minute, "namespace "+Namespace+" gone", func() (bool, string) {
			_, err := e.CS.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		fmt.Fprintf(os.Stderr, "== %s removed in %v\n", other.name, time.Since(start).Round(time.Second))
	}
	e.Impl = im
	if e.deployed(t, im) {
		if err := e.waitReady(ctx, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := im.install(e, ctx); err != nil {
		t.Fatal(err)
	}
}

// deployed reports whether im's controller Deployment exists.
func (e *Env) deployed(t testing.TB, im *lbImpl) bool {
	t.Helper()
	err := e.C.Get(context.Background(), client.ObjectKey{Namespace: Namespace, Name: im.controller}, &appsv1.Deployment{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// printVersus prints each figure for both implementations and the ratio MetalLB/ironlb.
func printVersus(ir, ml *versusResult) {
	tw := tabwriter.NewWriter(os.Stderr, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { _, _ = fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	dur := func(what string, a, b []time.Duration, p int) {
		if len(a) == 0 || len(b) == 0 {
			return
		}
		x, y := pct(a, p), pct(b, p)
		row(fmt.Sprintf("%s, p%d", what, p), x.Round(time.Millisecond).String(), y.Round(time.Millisecond).String(), ratio(y.Seconds(), x.Seconds()))
	}
	count := func(what string, a, b int) {
		row(what, fmt.Sprint(a), fmt.Sprint(b), ratio(float64(b), float64(a)))
	}
	fmt.Fprintln(os.Stderr, "== ironlb and MetalLB v0.16.2, same lab, same probes:")
	row("figure", "ironlb", "MetalLB", "MetalLB/ironlb")
	for _, p := range []int{50, 99} {
		dur(fmt.Sprintf("hard kill -> traffic again (%d kills)", len(ir.kills.gaps)), ir.kills.sorted(), ml.kills.sorted(), p)
	}
	count("hard kill: failed requests (all kills, 50/s)", sum(ir.kills.lost), sum(ml.kills.lost))
	count("rolling restart: IP moves (ServiceL2Status)", ir.moves.StatusMoves, ml.moves.StatusMoves)
	count(fmt.Sprintf("rolling restart: keep-alive breaks (%d conns)", len(ir.roll.KeepAlive.Conns)), ir.roll.KeepAlive.Broken, ml.roll.KeepAlive.Broken)
	in, mn := ir.roll.NewConns, ml.roll.NewConns
	row("rolling restart: new connections failed", fmt.Sprintf("%d of %d", in.Failed, in.Total), fmt.Sprintf("%d of %d", mn.Failed, mn.Total),
		ratio(float64(mn.Failed), float64(in.Failed)))
	for _, p := range []int{50, 99} {
		dur("create -> IP in status", ir.creates.alloc, ml.creates.alloc, p)
		dur("IP in status -> first ARP reply at mypc", ir.creates.arp, ml.creates.arp, p)
		dur("create -> first good request", ir.creates.traffic, ml.creates.traffic, p)
	}
	_ = tw.Flush()
}

// ratio is b/a to two digits, "-" when a is 0 (a count that ironlb keeps at zero).
func ratio(b, a float64) string {
	if a == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", b/a)
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
