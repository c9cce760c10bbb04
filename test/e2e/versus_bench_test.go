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
//   - rolling restart, E2E_VS_ROLLS (default 3) times: `kubectl rollout restart` of the
//     speaker DaemonSet while mypc holds 4 keep-alive connections and opens a new connection
//     every 20 ms (the hitless tests' traffic); counted: IP moves, keep-alive breaks, failed
//     new connections;
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
	n := versusCounts{rolls: getenvInt("E2E_VS_ROLLS", 3), creates: getenvInt("E2E_VS_CREATE", 10), kills: getenvInt("E2E_VS_KILLS", 20)}
	results := map[string]*versusResult{}
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				results[im.name] = e.versusRun(b, im, impls, n)
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

// metallbImpl is MetalLB as its users install it from its manifest, from the module
// hack/metallb pins; the lab runs its images from bin/metallb-controller and
// bin/metallb-speaker.
func metallbImpl(b testing.TB, e *Env) *lbImpl {
	manifest := filepath.Join(metallbModule(b, e), "config", "manifests", "metallb-native.yaml")
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

// metallbModule returns the directory of MetalLB's module (hack/metallb), after checking
// that `make metallb` built its commands; without them it skips (fails in CI, where make
// test-e2e builds them).
func metallbModule(b testing.TB, e *Env) string {
	skip := b.Skipf
	if os.Getenv("CI") == "true" {
		skip = b.Fatalf
	}
	for _, c := range []string{"metallb-controller", "metallb-speaker"} {
		if !fileExists(filepath.Join(e.Root, "bin", c)) {
			skip("no bin/%s: run `make metallb` before the lab comes up (make test-e2e and make bench-metallb do)", c)
		}
	}
	out, err := e.run(context.Background(), "go", "-C", "hack/metallb", "list", "-m", "-f", "{{.Dir}}", "go.universe.tf/metallb")
	if err != nil {
		b.Fatalf("locating MetalLB's module: %v\n%s", err, out)
	}
	return strings.TrimSpace(out)
}

// versusCounts is how many times versusRun runs each probe.
type versusCounts struct{ rolls, creates, kills int }

// versusResult is what versusRun measured for one implementation.
type versusResult struct {
	kills   killStats
	creates createStats
	rolls   rollStats
}

// rollStats add up rolling restarts under traffic: IP moves seen in ServiceL2Status objects
// and in nodeAssigned events (a speaker may announce without writing the status),
// keep-alive breaks (of conns connections) and failed new connections (of sent).
type rollStats struct{ rolls, moves, eventMoves, broken, conns, failed, sent int }

func (s *rollStats) add(rep probe.Report, mv moveCount) {
	s.rolls++
	s.moves += mv.StatusMoves
	s.eventMoves += mv.EventMoves
	s.broken += rep.KeepAlive.Broken
	s.conns += len(rep.KeepAlive.Conns)
	s.failed += rep.NewConns.Failed
	s.sent += rep.NewConns.Total
}

// versusRun installs im alone and runs the three probes on it.
func (e *Env) versusRun(b *testing.B, im *lbImpl, all []*lbImpl, n versusCounts) *versusResult {
	start := time.Now()
	e.switchTo(b, im, all)
	fmt.Fprintf(os.Stderr, "== %s installed alone and ready in %v\n", im.name, time.Since(start).Round(time.Second))
	dumpOnFailure(b, e, nil)
	applyWalkthrough(b, e)
	var r versusResult

	// One fixture (a pool holding one IP, announced by the workers) for the rollouts and the kills.
	f := e.newLBFixture(b, "vs-"+strings.ToLower(im.name), "172.18.254.130")
	for i := 0; i < n.rolls; i++ {
		fmt.Fprintf(os.Stderr, "== %s: rolling restart %d of the speakers under traffic\n", im.name, i+1)
		f.owner = e.settledOwner(b, f)
		rep, mv := e.rollSpeakersUnderTraffic(b, f)
		r.rolls.add(rep, mv)
		fmt.Fprintf(os.Stderr, "rolling restart %d: IP moves: %d (ServiceL2Status), %d (nodeAssigned); keep-alive: %d breaks of %d connections (%s); new connections: %d of %d failed\n",
			i+1, mv.StatusMoves, mv.EventMoves, rep.KeepAlive.Broken, len(rep.KeepAlive.Conns), breakKinds(rep.KeepAlive), rep.NewConns.Failed, rep.NewConns.Total)
	}
	b.ReportMetric(float64(r.rolls.moves), "roll-moves")
	b.ReportMetric(float64(r.rolls.eventMoves), "roll-event-moves")
	b.ReportMetric(float64(r.rolls.broken), "roll-keepalive-broken")
	b.ReportMetric(float64(r.rolls.failed), "roll-new-failed")

	fmt.Fprintf(os.Stderr, "== %s: %d Services created one after the other\n", im.name, n.creates)
	r.creates = createRuns(b, e, "vs-create", n.creates)
	r.creates.report(b)

	fmt.Fprintf(os.Stderr, "== %s: %d hard kills of the announcing node\n", im.name, n.kills)
	r.kills = e.hardKills(b, f, n.kills)
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
	ir2, ml2 := ir.rolls, ml.rolls
	rolls := fmt.Sprintf("%d rolling restarts", ir2.rolls)
	count(rolls+": IP moves (ServiceL2Status)", ir2.moves, ml2.moves)
	count(rolls+": IP moves (nodeAssigned events)", ir2.eventMoves, ml2.eventMoves)
	count(fmt.Sprintf("%s: keep-alive breaks (%d conns)", rolls, ir2.conns), ir2.broken, ml2.broken)
	row(rolls+": new connections failed", fmt.Sprintf("%d of %d", ir2.failed, ir2.sent), fmt.Sprintf("%d of %d", ml2.failed, ml2.sent),
		ratio(float64(ml2.failed), float64(ir2.failed)))
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
