//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/e2e/nemesis"
	"github.com/ironlb/ironlb/test/e2e/probe"
)

// The nemesis (issue 25, DESIGN.md section 5b): random faults from a seeded
// schedule, one or two at a time, while mypc and mypc2 each watch every
// walkthrough IP (ARP every 100 ms counting the MACs that answer, 4
// keep-alive connections and a new connection every 20 ms per IP); then
// package nemesis judges the records against the schedule's truth of which
// data paths were down.
//
//	E2E_NEMESIS_SEED      replay a schedule (default: TestNemesis nemesisTestSeed, BenchmarkChaos drawn from the clock; printed)
//	E2E_NEMESIS_DURATION  faults and quiet times in all (TestNemesis 3m30s, BenchmarkChaos 30m)
//	E2E_NEMESIS_FAULTS    comma-separated fault kinds (default all; nemesis.AllKinds)
//	E2E_NEMESIS_QUIET     quiet time after each episode (default 8s; e.g. 7m to watch a key
//	                      rotation's phases after one episode)
const (
	// nemesisQuiet is the time after each episode's recovery before the
	// next: the checker's window for convergence and late moves.
	nemesisQuiet = 8 * time.Second
	// nemesisBaseline is watched before the first fault: the IPs must be
	// answered by one MAC each with nothing happening.
	nemesisBaseline = 5 * time.Second
	// arpEvery is the checker's ARP interval (issue 25: 100 ms).
	arpEvery = 100 * time.Millisecond
)

// nemesisTestSeed is TestNemesis's schedule, fixed so that `make test` is
// deterministic (BenchmarkChaos draws a new one every run): it was drawn at
// random and found the restart-mid-rotation bug (a key rotation, a speaker
// restarted while it is in its phases, then a node's outgoing memberlist
// traffic lost), and covers cable pulls, partitions, freezes and kills too.
const nemesisTestSeed = 20261128

// TestNemesis runs a short nemesis scenario and requires issue 25's targets:
// 0 needless moves, no dual-answer interval over 1 s, every IP answered
// again within 1 s under a single fault that leaves a majority up,
// convergence within 2 s of every heal.
func TestNemesis(t *testing.T) {
	var violations []string
	// Registered before anything else, so it runs after the failure dumps:
	// the verdict ends the output, where a reader of CI's tail finds it.
	t.Cleanup(func() {
		if len(violations) > 0 {
			t.Logf("TestNemesis missed %d of issue 25's targets (the report and the dumps are above):\n  %s",
				len(violations), strings.Join(violations, "\n  "))
		}
	})
	e := requireEnv(t)
	rep, _ := e.runNemesis(t, 3*time.Minute+30*time.Second, nemesisTestSeed)
	violations = rep.Violations
	for _, v := range violations {
		t.Error(v)
	}
}

// BenchmarkChaos runs a long nemesis scenario (make bench-chaos) and prints
// the full report; it asserts nothing about timing, only that the faults were
// applied and the checker saw traffic.
//
//	sudo make bench-chaos   # = go test -tags e2e ./test/e2e -run '^$' -bench Chaos -benchtime 1x -v
func BenchmarkChaos(b *testing.B) {
	e := benchEnv(b)
	for i := 0; i < b.N; i++ {
		rep, sched := e.runNemesis(b, 30*time.Minute, 0)
		var needless, dual, faults int
		for _, w := range rep.Windows {
			needless += w.NeedlessMoves
			faults += len(w.Faults)
			for _, d := range w.Dual {
				if d.Duration() > rep.Limits.Overlap {
					dual++
				}
			}
		}
		b.ReportMetric(float64(faults), "faults")
		b.ReportMetric(float64(needless), "needless-moves")
		b.ReportMetric(float64(dual), "dual-answer>1s")
		b.ReportMetric(float64(len(rep.Violations)), "violations")
		fmt.Fprintf(os.Stderr, "chaos: seed %d, %d faults, %d violations of issue 25's targets (replay: E2E_NEMESIS_SEED=%d)\n",
			sched.Seed, faults, len(rep.Violations), sched.Seed)
	}
}

// runNemesis draws the schedule, applies it in the lab while mypc and mypc2 run the
// checker's probes, and returns the checker's report (logged in full).
func (e *Env) runNemesis(t testing.TB, defaultDur time.Duration, defaultSeed uint64) (nemesis.Report, nemesis.Schedule) {
	h, ok := e.Hosts.(nemesisHosts)
	if !ok {
		t.Skip("the nemesis needs hosts that can kill nodes, cut links, signal speakers and stop the API server (the lab)")
	}
	if e.Probe == "" {
		t.Skip("no e2e-probe on the client (E2E_PROBE)")
	}
	dur := defaultDur
	if v := os.Getenv("E2E_NEMESIS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("E2E_NEMESIS_DURATION=%q: want a duration such as 4m", v)
		}
		dur = d
	}
	seed := defaultSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	}
	if v := os.Getenv("E2E_NEMESIS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("E2E_NEMESIS_SEED=%q: want a number", v)
		}
		seed = s
	}
	quiet := nemesisQuiet
	if v := os.Getenv("E2E_NEMESIS_QUIET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("E2E_NEMESIS_QUIET=%q: want a duration such as 30s", v)
		}
		quiet = d
	}
	kinds, err := nemesis.ParseKinds(os.Getenv("E2E_NEMESIS_FAULTS"))
	if err != nil {
		t.Fatalf("E2E_NEMESIS_FAULTS: %v", err)
	}
	ips := applyWalkthrough(t, e)
	tp := e.topology(t)
	workers := without(tp.nodes, tp.controlPlane)
	sched, err := nemesis.Generate(seed, nemesis.Options{Nodes: tp.nodes, Workers: workers, Kinds: kinds, Duration: dur, Quiet: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// The seed and the schedule go out first, so that a run cut short can
	// still be replayed.
	fmt.Fprint(os.Stderr, sched.String())
	t.Log(sched.String())

	ctx := context.Background()
	fe := &faultEnv{e: e, h: h, nodes: tp.nodes, ips: e.nodeIPv4s(t)}
	// Whatever an interrupted run left is swept first, and again at the end.
	sweep := func() {
		for _, n := range tp.nodes {
			if err := fe.clearRules(context.Background(), n, nemesisComment); err != nil {
				t.Errorf("removing the nemesis's iptables rules on %s: %v", n, err)
			}
		}
	}
	sweep()
	t.Cleanup(sweep)
	if slices.Contains(kinds, nemesis.PacketLoss) {
		fe.probeNetem(ctx, workers[0])
		fmt.Fprintf(os.Stderr, "nemesis: %s is applied with %s\n", nemesis.PacketLoss, fe.lossWith)
		t.Logf("%s is applied with %s", nemesis.PacketLoss, fe.lossWith)
	}
	nodeMACs, err := e.nodeMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	macNode := map[string]string{}
	for n, m := range nodeMACs {
		macNode[strings.ToLower(m)] = n
	}
	// Announced, not only served: right after an install mypc's neighbour
	// entries from before still carry requests to a node while nobody
	// answers ARP yet (the speakers place IPs once their watchers judged
	// the nodes), which the checker would count against the baseline.
	for i, name := range walkthroughServices {
		e.waitNeighbour(t, ips[i], e.waitAnnouncer(t, "default", name, ""), nodeMACs)
		e.waitServing(t, ips[i])
	}

	var applied []nemesis.Applied
	dumpOnFailure(t, e, func() []string { return tp.nodes })
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpNemesis(t, sched, applied, tp.nodes)
		}
	})
	owners := e.recordOwners(t, ips)
	chk := e.startChaosProbe(t, ips, checkerHosts...)
	time.Sleep(nemesisBaseline)
	for i, ep := range sched.Episodes {
		fmt.Fprintf(os.Stderr, "nemesis: episode %d of %d: %v\n", i+1, len(sched.Episodes), ep.Faults)
		applied = append(applied, fe.runEpisode(t, i+1, ep)...)
		e.waitRecovered(t, fmt.Sprintf("after episode %d", i+1))
		time.Sleep(sched.Quiet)
	}
	out := chk.stop(t)
	rec := owners.stop(t)

	obs := nemesis.Observations{Nodes: tp.nodes, IPs: ips, ARPInterval: arpEvery, MACNode: macNode, Owners: rec, Faults: applied}
	first := true
	for _, host := range checkerHosts {
		for _, tg := range out[host].Targets {
			if tg.ARPErr != "" {
				t.Fatalf("ARP for %s from %s: %s", tg.IP, host, tg.ARPErr)
			}
			// The checker's 100 ms buckets start half an interval before
			// the first request, so that each answer lands mid-bucket and
			// a request sent a few ms late by a loaded client does not
			// leave a bucket empty; they cover the time every client asked.
			if start := tg.ARPStart.Add(-arpEvery / 2); first || start.After(obs.ARPStart) {
				obs.ARPStart = start
			}
			if first || tg.ARPEnd.Before(obs.ARPEnd) {
				obs.ARPEnd = tg.ARPEnd
			}
			first = false
			for _, a := range tg.ARP {
				obs.ARP = append(obs.ARP, nemesis.ARPSample{At: a.At, IP: tg.IP, MAC: a.MAC.String(), Client: host})
			}
			for _, n := range tg.NewConns {
				obs.NewConns = append(obs.NewConns, nemesis.Event{At: n.Sent, IP: tg.IP, OK: n.OK})
			}
			for _, c := range tg.KeepAlive.Conns {
				// A probe that never got through proves nothing.
				if c.OK == 0 {
					t.Errorf("keep-alive connection %d from %s to %s was never answered: %+v", c.ID, host, tg.IP, c)
				}
				for _, br := range c.Breaks {
					obs.Breaks = append(obs.Breaks, nemesis.Event{At: br.At, IP: tg.IP})
				}
			}
			if len(tg.ARP) == 0 {
				t.Errorf("nobody ever answered ARP for %s at %s: the checker saw nothing", tg.IP, host)
			}
		}
	}
	rep := nemesis.Check(obs, nemesis.Limits{})
	if len(fe.notes) > 0 {
		t.Logf("besides the plan:\n  %s", strings.Join(fe.notes, "\n  "))
	}
	fmt.Fprintf(os.Stderr, "nemesis report (seed %d; replay: E2E_NEMESIS_SEED=%d):\n%s", sched.Seed, sched.Seed, rep)
	t.Logf("nemesis report (seed %d):\n%s", sched.Seed, rep)
	return rep, sched
}

// runEpisode applies an episode's faults, each at its offset and for its
// duration, and heals them; it returns when every fault is healed. A fault
// that cannot be applied or healed fails the run (after every heal ran).
func (fe *faultEnv) runEpisode(t testing.TB, n int, ep nemesis.Episode) []nemesis.Applied {
	t.Helper()
	start := time.Now()
	out := make([]nemesis.Applied, len(ep.Faults))
	errs := make([]error, len(ep.Faults))
	var wg sync.WaitGroup
	for i, f := range ep.Faults {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			time.Sleep(time.Until(start.Add(f.Start)))
			a := nemesis.Applied{Fault: f, Episode: n, Start: time.Now()}
			heal, err := fe.apply(ctx, f)
			if err != nil {
				err = fmt.Errorf("applying %v: %w", f, err)
			} else {
				// The fault itself: it lasts its scheduled time.
				time.Sleep(time.Until(a.Start.Add(f.Duration)))
			}
			if heal != nil {
				if herr := heal(ctx); herr != nil {
					err = errors.Join(err, fmt.Errorf("healing %v: %w", f, herr))
				}
			}
			a.End = time.Now()
			out[i], errs[i] = a, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("episode %d, fault %d: %v", n, i+1, err)
		}
	}
	return out
}

// waitRecovered waits until ironlb, every node and every pod are Ready again
// (a node restored, a speaker restarted, the API server back).
func (e *Env) waitRecovered(t testing.TB, when string) {
	t.Helper()
	poll(t, recoverBound, "ironlb ready "+when, func() (bool, string) {
		why := e.notReady(context.Background())
		return why == "", why
	})
	e.waitClusterReady(t, when)
}

// checkerHosts are the clients the nemesis's checker runs on (issue 25: mypc
// and a second client host on the same segment).
var checkerHosts = []string{ClientHost, SecondClientHost}

// chaosProbe is e2e-probe --chaos running on each checker host.
type chaosProbe struct{ loops map[string]*clientLoop }

// startChaosProbe starts the checker's probes on each host against ips and
// waits until every persistent connection has been answered once.
func (e *Env) startChaosProbe(t testing.TB, ips []string, hosts ...string) *chaosProbe {
	t.Helper()
	p := &chaosProbe{loops: map[string]*clientLoop{}}
	for _, host := range hosts {
		ready := newStopFile() + "-ready"
		l := e.runProbeOn(host, "--chaos", strings.Join(ips, ","), "--arp-interval", arpEvery.String(),
			"--keepalive", strconv.Itoa(keepAliveConns), "--keepalive-interval", "100ms", "--interval", "20ms", "--timeout", "1s", "--ready-file", ready)
		p.loops[host] = l
		t.Cleanup(func() { _ = l.end() }) // after stop: a no-op; before: the test has failed already
		poll(t, 30*time.Second, fmt.Sprintf("%d keep-alive connections from %s to each of %v answered", keepAliveConns, host, ips), func() (bool, string) {
			r, err := e.Hosts.Run(context.Background(), host, "rm", ready)
			if err != nil {
				return false, err.Error()
			}
			return r.Code == 0, "not yet"
		})
	}
	return p
}

// stop ends the probes and returns their records by host.
func (p *chaosProbe) stop(t testing.TB) map[string]probe.ChaosReport {
	t.Helper()
	out := map[string]probe.ChaosReport{}
	for host, l := range p.loops {
		l.finish(t)
		rep, err := probe.ParseChaos(l.res.Stdout)
		if err != nil {
			t.Fatalf("%s: %v\nstderr: %s", host, err, l.res.Stderr)
		}
		out[host] = rep
	}
	return out
}

// ownerRecorder records the announcer ServiceL2Status names for each
// watched IP over time: the speakers' own account of the owner changes,
// beside what the client hears.
type ownerRecorder struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	evs    []nemesis.Event
	down   error
}

// recordOwners starts recording the announcers of the walkthrough Services
// (whose IPs are ips, in walkthroughServices' order).
func (e *Env) recordOwners(t testing.TB, ips []string) *ownerRecorder {
	t.Helper()
	ipOf := map[string]string{}
	for i, s := range walkthroughServices {
		ipOf["default/"+s] = ips[i]
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &ownerRecorder{cancel: cancel}
	// live: per Service, the node of each ServiceL2Status object; an
	// announcer is recorded when one node alone holds them and it is not
	// the last one recorded (a handover's overlap is not a move).
	live := map[string]map[string]string{}
	last := map[string]string{}
	handle := func(ev watch.Event) {
		st, ok := ev.Object.(*v1beta1.ServiceL2Status)
		if !ok {
			return
		}
		svc := st.Status.ServiceNamespace + "/" + st.Status.ServiceName
		ip, ok := ipOf[svc]
		if !ok {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if live[svc] == nil {
			live[svc] = map[string]string{}
		}
		if ev.Type == watch.Deleted || st.DeletionTimestamp != nil || st.Status.Node == "" {
			delete(live[svc], st.Name)
		} else {
			live[svc][st.Name] = st.Status.Node
		}
		nodes := slices.Compact(slices.Sorted(maps.Values(live[svc])))
		if len(nodes) == 1 && nodes[0] != last[svc] {
			last[svc] = nodes[0]
			r.evs = append(r.evs, nemesis.Event{At: time.Now(), IP: ip, Node: nodes[0]})
		}
	}
	var l2 v1beta1.ServiceL2StatusList
	if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err != nil {
		cancel()
		t.Fatal(err)
	}
	for i := range l2.Items {
		handle(watch.Event{Type: watch.Added, Object: &l2.Items[i]})
	}
	r.wg.Go(func() {
		followWatch(ctx, l2.ResourceVersion, func(rv string) (watch.Interface, error) {
			return e.C.Watch(ctx, &v1beta1.ServiceL2StatusList{}, client.InNamespace(Namespace), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, func() (string, []runtime.Object, error) {
			var l v1beta1.ServiceL2StatusList
			rv, objs, err := listed(&l, e.C.List(ctx, &l, client.InNamespace(Namespace)))
			if err == nil {
				// The list replaces what the watch had seen: objects
				// deleted while it was away are gone from it.
				r.mu.Lock()
				clear(live)
				r.mu.Unlock()
			}
			return rv, objs, err
		}, handle, func(err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if ctx.Err() == nil {
				r.down = err
			}
		})
	})
	t.Cleanup(cancel)
	return r
}

// stop ends the recording; the watch must be running at the end.
func (r *ownerRecorder) stop(t testing.TB) []nemesis.Event {
	t.Helper()
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down != nil {
		t.Fatalf("the watch of the ServiceL2Statuses was not running when it stopped: %v", r.down)
	}
	return slices.Clone(r.evs)
}

// dumpNemesis prints what explains a failed nemesis run: the schedule and
// its seed, the faults as applied, every speaker's "owner changed" and
// data-path verdict lines, and the neighbour tables of the checker hosts and the nodes.
func (e *Env) dumpNemesis(t testing.TB, sched nemesis.Schedule, applied []nemesis.Applied, nodes []string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "---- %s", sched)
	fmt.Fprintln(&b, "---- faults as applied")
	for _, a := range applied {
		fmt.Fprintf(&b, "episode %d: %v: %s-%s\n", a.Episode, a.Fault, a.Start.Format("15:04:05.000"), a.End.Format("15:04:05.000"))
	}
	for _, n := range nodes {
		p := findSpeakerPod(e, n)
		if p == nil {
			fmt.Fprintf(&b, "---- %s: no speaker pod\n", n)
			continue
		}
		var lines []string
		for _, line := range strings.Split(e.podLogs(ctx, p.Namespace, p.Name), "\n") {
			if strings.Contains(line, "owner changed") || strings.Contains(line, "data path of node") || strings.Contains(line, "member") {
				lines = append(lines, line)
			}
		}
		fmt.Fprintf(&b, "---- %s (%s): owner changes, data-path verdicts, membership (last 150 of %d lines)\n%s\n", n, p.Name, len(lines),
			strings.Join(lines[max(0, len(lines)-150):], "\n"))
	}
	for _, host := range append(slices.Clone(checkerHosts), nodes...) {
		if r, err := e.Hosts.Run(ctx, host, "ip", "neigh", "show"); err == nil {
			fmt.Fprintf(&b, "---- %s: ip neigh\n%s", host, r.Stdout)
		}
	}
	t.Logf("nemesis failure dump:\n%s", b.String())
}

// nodeIPv4s maps every node to its IPv4 InternalIP (memberlist's address).
func (e *Env) nodeIPv4s(t testing.TB) map[string]string {
	t.Helper()
	var nodes corev1.NodeList
	if err := e.C.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); a.Type == corev1.NodeInternalIP && err == nil && ip.Is4() && out[n.Name] == "" {
				out[n.Name] = a.Address
			}
		}
		if out[n.Name] == "" {
			t.Fatalf("node %s has no IPv4 InternalIP: %v", n.Name, n.Status.Addresses)
		}
	}
	return out
}
