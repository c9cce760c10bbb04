//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

// BenchmarkFailover measures end-to-end failover in the lab, with kube-proxy in
// the path, as the external client sees it (docs/benchmarks-e2e.md):
//
//   - hard: E2E_FAILOVER_KILLS times (default 20), kill the announcing node
//     (SIGKILL to all its processes, link down) while mypc sends a request every
//     20 ms on a new connection; the figure is the time from the kill to the
//     send time of the first request after it that succeeded. Then the node is
//     restored; the next round kills whichever node announces then. The
//     Service (lbFixture) is announced by the workers only and its backends
//     are kept off the announcer, so a kill never takes a backend or the API
//     server along.
//   - graceful: E2E_GRACEFUL_RUNS times (default 5), delete the announcing
//     speaker pod (SIGTERM, the DaemonSet recreates it) while mypc sends 20
//     requests/s; the figure is the number of failed requests.
//
// E2E_FAILOVER_FAMILY=ipv6 runs both on an IPv6 Service IP (dual-stack lab).
//
// Run it with -benchtime 1x (one pass of all rounds):
//
//	sudo go test -tags e2e ./test/e2e -run '^$' -bench Failover -benchtime 1x -timeout 60m -v
func BenchmarkFailover(b *testing.B) {
	e := benchEnv(b)
	if _, ok := e.Hosts.(NodeKiller); !ok {
		b.Skip("these hosts cannot kill a node (the lab can)")
	}
	kills := getenvInt("E2E_FAILOVER_KILLS", 20)
	graceful := getenvInt("E2E_GRACEFUL_RUNS", 5)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		runFailoverBench(b, e, kills, graceful)
	}
}

// benchIP is the failover benchmark's service IP (a pool of its own): IPv4, or IPv6 with
// E2E_FAILOVER_FAMILY=ipv6 (the client then resolves it by NDP).
func benchIP(b *testing.B, e *Env) string {
	switch f := os.Getenv("E2E_FAILOVER_FAMILY"); f {
	case "", "ipv4":
		return "172.18.254.120"
	case "ipv6":
		e.requireIPv6(b)
		return "fc00:f853:ccd:e793:fffe::120"
	default:
		b.Fatalf("E2E_FAILOVER_FAMILY=%q: want ipv4 or ipv6", f)
		return ""
	}
}

func runFailoverBench(b *testing.B, e *Env, kills, gracefulRuns int) {
	applyWalkthrough(b, e)
	ip := benchIP(b, e)
	f := e.newLBFixture(b, "e2e-bench"+familySuffix(ip), ip)
	hard := e.hardKills(b, f, kills)
	hard.report(b)

	ctx := context.Background()
	var failedGraceful, totalGraceful int
	var perRun []string
	for i := 0; i < gracefulRuns; i++ {
		victim := e.roundOwner(b, f)
		pod := speakerPod(b, e, victim)
		loop := e.startProbe(b, f.ip, 50*time.Millisecond)
		time.Sleep(time.Second)
		at := time.Now()
		if out, err := e.kubectl(ctx, "", "delete", "pod", "-n", Namespace, pod, "--wait=false"); err != nil {
			loop.stopRecords(b)
			b.Fatalf("deleting %s: %v\n%s", pod, err, out)
		}
		poll(b, 3*time.Minute, e.Impl.name+" ready after the speaker restart", func() (bool, string) {
			if p := speakerPodOrEmpty(e, victim); p == "" || p == pod {
				return false, "old speaker pod still there"
			}
			why := e.notReady(ctx)
			return why == "", why
		})
		e.waitAnnouncer(b, "default", f.name, "")
		time.Sleep(3 * time.Second)
		recs := loop.stopRecords(b)
		s := probe.Summarize(recs, at)
		failedGraceful += s.Failed
		totalGraceful += s.Total
		perRun = append(perRun, fmt.Sprint(s.Failed))
		fmt.Fprintf(os.Stderr, "graceful %d: deleted %s on %s: %d of %d requests failed (%.1f req/s)%s\n", i+1, pod, victim, s.Failed, s.Total, s.Rate, failures(recs, at))
	}
	if totalGraceful > 0 {
		b.ReportMetric(float64(failedGraceful), "graceful-failed")
		b.ReportMetric(float64(totalGraceful), "graceful-requests")
		fmt.Fprintf(os.Stderr, "graceful (speaker pod deleted) %d runs: %d of %d requests failed (per run: %s)\n", len(perRun), failedGraceful, totalGraceful, strings.Join(perRun, " "))
	}
}

// roundOwner returns the fixture's announcer once the previous round has settled (ironlb
// does not fail back by default, so its victim changes from round to round; MetalLB takes
// the IP back to the restored node), with the backends moved off it, so that killing it
// leaves them alive.
func (e *Env) roundOwner(t testing.TB, f *lbFixture) string {
	owner := e.settledOwner(t, f)
	e.placeBackends(t, f, owner)
	e.waitServing(t, f.ip)
	return owner
}

// killStats are the rounds of hardKills.
type killStats struct {
	gaps    []time.Duration // kill -> send time of the first request that succeeded after it
	lost    []int           // failed requests per round
	victims []string
}

// hardKills kills the fixture's announcing node kills times while mypc sends a request
// every 20 ms on a new connection, restores it after each round and waits until the
// implementation is ready again (BenchmarkFailover's hard rounds).
func (e *Env) hardKills(b *testing.B, f *lbFixture, kills int) killStats {
	killer := e.Hosts.(NodeKiller)
	ctx := context.Background()
	var k killStats
	for i := 0; i < kills; i++ {
		victim := e.roundOwner(b, f)
		k.victims = append(k.victims, victim)
		loop := e.startProbe(b, f.ip, 20*time.Millisecond)
		time.Sleep(time.Second)
		at := time.Now()
		if err := killer.KillNode(ctx, victim); err != nil {
			loop.stopRecords(b)
			b.Fatal(err)
		}
		// Steady answers, not one: a round where some requests still fail
		// (one backend unreachable from the new owner) must not end on the
		// first lucky one.
		streak := 0
		poll(b, time.Minute, f.ip+" answering 10 requests in a row after the kill", func() (bool, string) {
			if _, ok := e.curlOnce(ctx, f.ip); ok {
				streak++
			} else {
				streak = 0
			}
			return streak >= 10, fmt.Sprintf("%d in a row", streak)
		})
		time.Sleep(1500 * time.Millisecond)
		recs := loop.stopRecords(b)
		s := probe.Summarize(recs, at)
		k.gaps = append(k.gaps, s.Recovery)
		k.lost = append(k.lost, s.Failed)
		newOwner, _ := e.announcers(ctx, "default", f.name)
		after := s.Recovery.Round(time.Millisecond).String()
		if s.Unrecovered {
			after = "more than " + after + " (the last request sent failed)"
		}
		fmt.Fprintf(os.Stderr, "kill %2d: %s killed, traffic again after %s (%d of %d requests failed, failures sent over %v, %.1f req/s); ServiceL2Status nodes now %v\n",
			i+1, victim, after, s.Failed, s.Total, s.FailWindow.Round(time.Millisecond), s.Rate, newOwner)
		if err := killer.RestoreNode(ctx, victim); err != nil {
			b.Fatal(err)
		}
		poll(b, 3*time.Minute, e.Impl.name+" ready after the restore", func() (bool, string) {
			why := e.notReady(ctx)
			return why == "", why
		})
	}
	return k
}

// sorted returns the gaps in increasing order.
func (k killStats) sorted() []time.Duration {
	s := slices.Clone(k.gaps)
	slices.Sort(s)
	return s
}

// report reports the gaps' p50 and p99 as metrics and prints every round.
func (k killStats) report(b *testing.B) {
	if len(k.gaps) == 0 {
		return
	}
	sorted := k.sorted()
	b.ReportMetric(pct(sorted, 50).Seconds(), "hard-p50-s")
	b.ReportMetric(pct(sorted, 99).Seconds(), "hard-p99-s")
	b.ReportMetric(float64(len(sorted)), "hard-kills")
	var ss []string
	for _, g := range k.gaps {
		ss = append(ss, fmt.Sprintf("%.2f", g.Seconds()))
	}
	fmt.Fprintf(os.Stderr, "hard kill of the announcer (%s), %d runs: %s\n  gaps (s): %s\n  failed requests per run: %v\n",
		strings.Join(k.victims, " "), len(sorted), spread(sorted), strings.Join(ss, " "), k.lost)
}

// spread is "min .. p50 .. p90 .. p99 .. max" of sorted durations.
func spread(sorted []time.Duration) string {
	return fmt.Sprintf("min %v p50 %v p90 %v p99 %v max %v", sorted[0].Round(time.Millisecond), pct(sorted, 50).Round(time.Millisecond),
		pct(sorted, 90).Round(time.Millisecond), pct(sorted, 99).Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
}

// failures lists when each failed request was sent, relative to at, and why: what a
// graceful round must explain if it loses anything.
func failures(recs []probe.Record, at time.Time) string {
	var b strings.Builder
	for _, r := range recs {
		if !r.OK {
			fmt.Fprintf(&b, "\n    failed: sent %+v after the delete: %s", r.Sent.Sub(at).Round(time.Millisecond), r.Err)
		}
	}
	return b.String()
}

// settledOwner waits until one node announces the fixture's IP, mypc's
// neighbour entry carries its MAC, and both still hold settle later (an owner
// change, e.g. a failback, may still be under way when the speakers are ready).
func (e *Env) settledOwner(t testing.TB, f *lbFixture) string {
	t.Helper()
	ctx := context.Background()
	var owner string
	var since time.Time
	poll(t, 3*time.Minute, "a settled announcer of "+f.name, func() (bool, string) {
		nodes, err := e.announcers(ctx, "default", f.name)
		if err != nil {
			return false, err.Error()
		}
		e.curlOnce(ctx, f.ip)
		mac, line, err := e.neighMAC(ctx, f.ip)
		if err != nil || len(nodes) != 1 || mac != f.macs[nodes[0]] {
			owner = ""
			return false, fmt.Sprintf("announcers %v, %s's neighbour entry %q (%v)", nodes, ClientHost, line, err)
		}
		if nodes[0] != owner {
			owner, since = nodes[0], time.Now()
		}
		return time.Since(since) >= settle, "announced from " + owner + " since " + since.Format("15:04:05")
	})
	return owner
}

// benchEnv returns the cluster for a benchmark driven by e2e-probe on the
// client, or skips the benchmark saying why there is none.
func benchEnv(b *testing.B) *Env {
	b.Helper()
	if env == nil {
		b.Skip(skipReason)
	}
	if env.Probe == "" {
		b.Skip("no e2e-probe on the client (E2E_PROBE)")
	}
	return env
}

// pct returns the p-th percentile (nearest rank) of sorted.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (p*len(sorted)+99)/100 - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

// findSpeakerPod returns the speaker pod of node that is not being deleted
// (nil if none, or if the pods cannot be listed).
func findSpeakerPod(e *Env, node string) *corev1.Pod {
	var pods corev1.PodList
	if err := e.C.List(context.Background(), &pods, client.InNamespace(Namespace),
		client.MatchingLabels(e.Impl.speakerLabels)); err != nil {
		return nil
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p
		}
	}
	return nil
}

func speakerPodOrEmpty(e *Env, node string) string {
	if p := findSpeakerPod(e, node); p != nil {
		return p.Name
	}
	return ""
}

func speakerPod(t testing.TB, e *Env, node string) string {
	t.Helper()
	p := speakerPodOrEmpty(e, node)
	if p == "" {
		t.Fatalf("no speaker pod on %s", node)
	}
	return p
}

// startProbe runs e2e-probe on the client against ip, one request per interval.
func (e *Env) startProbe(t testing.TB, ip string, interval time.Duration) *clientLoop {
	t.Helper()
	if e.Probe == "" {
		t.Fatal("no e2e-probe on the client")
	}
	return e.runProbe("--url", serviceURL(ip), "--interval", interval.String(), "--timeout", "1s")
}

// stopRecords stops a probe loop and returns its records.
func (l *clientLoop) stopRecords(t testing.TB) []probe.Record {
	t.Helper()
	l.finish(t)
	return probe.Parse(l.res.Stdout)
}

// BenchmarkServiceToTraffic measures, E2E_CREATE_RUNS times (default 10), how
// fast a new LoadBalancer Service (client-go, requested IP) becomes reachable
// from mypc, which from 1 s before the Service exists asks for the IP by ARP
// every 10 ms and sends an HTTP request every 20 ms (new connection each).
// It reports three intervals:
//
//   - create -> IP: until a watch on the Service sees the IP in its status;
//   - IP -> ARP: from then until the first ARP reply from the owner reaches
//     mypc (the speaker's part: election, responder, wire);
//   - create -> first good request: everything, kube-proxy included.
//
// Run it with -benchtime 1x:
//
//	sudo go test -tags e2e ./test/e2e -run '^$' -bench ServiceToTraffic -benchtime 1x -v
func BenchmarkServiceToTraffic(b *testing.B) {
	e := benchEnv(b)
	runs := getenvInt("E2E_CREATE_RUNS", 10)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		applyWalkthrough(b, e)
		createRuns(b, e, "e2e-create", runs).report(b)
	}
}

// createStats are the intervals of createRuns, one per Service created.
type createStats struct{ alloc, arp, traffic []time.Duration }

// createRuns creates runs Services named prefix-NN one after the other (createOnce).
func createRuns(b *testing.B, e *Env, prefix string, runs int) createStats {
	macs, err := e.nodeMACs(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var c createStats
	for r := 0; r < runs; r++ {
		a, p, t := createOnce(b, e, fmt.Sprintf("%s-%02d", prefix, r+1), macs)
		c.alloc, c.arp, c.traffic = append(c.alloc, a), append(c.arp, p), append(c.traffic, t)
	}
	slices.Sort(c.alloc)
	slices.Sort(c.arp)
	slices.Sort(c.traffic)
	return c
}

// report reports each interval's p50 and p99 as metrics and prints its spread.
func (c createStats) report(b *testing.B) {
	for _, m := range []struct {
		what, unit string
		d          []time.Duration
	}{
		{"Service created -> IP in status (watch)", "alloc", c.alloc},
		{"IP in status -> first ARP reply from the owner at mypc", "arp", c.arp},
		{"Service created -> first successful request from mypc", "traffic", c.traffic},
	} {
		if len(m.d) == 0 {
			continue
		}
		b.ReportMetric(pct(m.d, 50).Seconds(), m.unit+"-p50-s")
		b.ReportMetric(pct(m.d, 99).Seconds(), m.unit+"-p99-s")
		fmt.Fprintf(os.Stderr, "%s, %d runs: %s\n", m.what, len(m.d), spread(m.d))
	}
}

// createOnce creates Service name with a free IP of the pool while mypc
// probes that IP, waits until it serves, deletes it again and returns the
// three intervals BenchmarkServiceToTraffic reports.
func createOnce(b *testing.B, e *Env, name string, macs map[string]string) (alloc, arp, traffic time.Duration) {
	ctx := context.Background()
	tp := e.topology(b)
	ip := tp.freeIP(b)
	svc := lbService(name, "webpod", ip)
	w, err := e.CS.CoreV1().Services(svc.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	httpLoop := e.startProbe(b, ip, 20*time.Millisecond)
	arpLoop := e.runProbe("--arp", ip, "--interval", "10ms")
	// Both probes run for a while before the Service exists: the first ARP
	// reply or request that succeeds is then bounded by the probe interval.
	time.Sleep(time.Second)
	at := time.Now()
	if err := e.C.Create(ctx, svc); err != nil {
		httpLoop.stopRecords(b)
		arpLoop.finish(b)
		b.Fatal(err)
	}
	var allocated time.Time
	for ev := range w.ResultChan() {
		if s, ok := ev.Object.(*corev1.Service); ok && len(s.Status.LoadBalancer.Ingress) > 0 {
			allocated = time.Now()
			break
		}
	}
	if allocated.IsZero() {
		b.Fatalf("%s: watch ended before the IP %s appeared in its status", name, ip)
	}
	e.waitServing(b, ip)
	owner := e.waitAnnouncer(b, svc.Namespace, name, "")
	// Let the HTTP probe's request sent just before waitServing's succeed.
	time.Sleep(500 * time.Millisecond)
	recs := httpLoop.stopRecords(b)
	arpLoop.finish(b)
	arps := probe.ParseARP(arpLoop.res.Stdout)

	var firstOK probe.Record
	for _, rec := range recs {
		if rec.OK && rec.Sent.After(at) && (traffic == 0 || rec.Sent.Add(rec.Latency).Sub(at) < traffic) {
			traffic, firstOK = rec.Sent.Add(rec.Latency).Sub(at), rec
		}
	}
	var firstReply, firstAny time.Time
	for _, a := range arps {
		if a.MAC.String() != macs[owner] {
			b.Fatalf("%s (%s): ARP from %s, but the announcer is %s (%s); all ARP seen by mypc:\n%s",
				name, ip, a.MAC, owner, macs[owner], arpLoop.res.Stdout)
		}
		if firstAny.IsZero() {
			firstAny = a.At
		}
		if a.Reply && firstReply.IsZero() {
			firstReply = a.At
		}
	}
	if firstReply.IsZero() {
		b.Fatalf("%s (%s): mypc got no ARP reply although the IP serves; e2e-probe --arp stderr:\n%s", name, ip, arpLoop.res.Stderr)
	}
	alloc, arp = allocated.Sub(at), firstReply.Sub(allocated)
	fmt.Fprintf(os.Stderr, "%s (%s, announcer %s): IP in status +%v, first ARP packet from the owner +%v (reply +%v), first good request completed +%v (sent at +%v)\n",
		name, ip, owner, alloc.Round(time.Millisecond), firstAny.Sub(at).Round(time.Millisecond), firstReply.Sub(at).Round(time.Millisecond),
		traffic.Round(time.Millisecond), firstOK.Sent.Sub(at).Round(time.Millisecond))

	if err := e.C.Delete(ctx, svc); err != nil {
		b.Fatal(err)
	}
	poll(b, time.Minute, name+" withdrawn", func() (bool, string) {
		nodes, err := e.announcers(ctx, "default", name)
		return err == nil && len(nodes) == 0, fmt.Sprint(nodes, err)
	})
	return alloc, arp, traffic
}
