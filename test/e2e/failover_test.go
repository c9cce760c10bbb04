//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/test/e2e/probe"
)

// TestFailoverHardKill kills the announcing node hard (processes SIGKILLed,
// link down): traffic from mypc resumes through another node, mypc's
// neighbour entry and ServiceL2Status follow; then the node comes back.
func TestFailoverHardKill(t *testing.T) {
	e := requireEnv(t)
	killer, ok := e.Hosts.(NodeKiller)
	if !ok {
		t.Skip("these hosts cannot kill a node (the lab can)")
	}
	applyWalkthrough(t, e)
	tp := e.topology(t)
	// An announcer that is neither a backend's node nor the control plane, so
	// killing it leaves the backends and the API server alive.
	ip, rank := tp.pickIP(t, tp.nodes, func(rank []string) bool {
		return !slices.Contains(tp.backends, rank[0]) && rank[0] != tp.controlPlane
	})
	victim := rank[0]
	next := election.Winner(ip, without(tp.nodes, victim))
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	watch = []string{victim, next}

	e.create(t, lbService("e2e-failover", "webpod", ip))
	if got := e.waitIngressIP(t, "default", "e2e-failover"); got != ip {
		t.Fatalf("e2e-failover got %s, requested %s", got, ip)
	}
	e.waitAnnouncer(t, "default", "e2e-failover", victim)
	e.waitServing(t, ip)
	macs, err := e.nodeMACs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.waitNeighbour(t, ip, victim, macs)

	ctx := ctxT(t)
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		if err := killer.RestoreNode(context.Background(), victim); err != nil {
			t.Errorf("restoring %s: %v", victim, err)
		}
	}
	t.Cleanup(restore)
	killed := time.Now()
	if err := killer.KillNode(ctx, victim); err != nil {
		t.Fatalf("killing %s: %v", victim, err)
	}
	var recovered time.Duration
	poll(t, time.Minute, fmt.Sprintf("%s answering again after killing %s", ip, victim), func() (bool, string) {
		_, ok := e.curlOnce(ctx, ip)
		if ok {
			recovered = time.Since(killed)
		}
		return ok, "curl failed"
	})
	t.Logf("killed %s (announcer of %s): traffic from %s flows again after %s (polled with 1 s curls; see the bench for precise figures); new announcer should be %s",
		victim, ip, ClientHost, recovered.Round(10*time.Millisecond), next)
	e.waitNeighbour(t, ip, next, macs)
	poll(t, time.Minute, "a ServiceL2Status for e2e-failover on "+next, func() (bool, string) {
		nodes, err := e.announcers(ctx, "default", "e2e-failover")
		if err != nil {
			return false, err.Error()
		}
		return slices.Contains(nodes, next), fmt.Sprintf("announcers %v", nodes)
	})

	// Back to normal: the node returns, rejoins and wins its IP back.
	restore()
	poll(t, 3*time.Minute, "ironlb ready after restoring "+victim, func() (bool, string) {
		why := e.notReady(ctx)
		return why == "", why
	})
	e.waitAnnouncer(t, "default", "e2e-failover", victim)
	e.waitNeighbour(t, ip, victim, macs)
	e.waitServing(t, ip)
}

// clientLoop sends a request from the client every interval until stopped and
// returns the number of requests and the failures (with their times).
type clientLoop struct {
	e        *Env
	stopFile string
	wg       sync.WaitGroup
	res      Result
	err      error
	probe    bool // e2e-probe (else a curl loop)
}

// startClientLoop starts a curl loop on the client against ip: one request
// (new connection, 1 s timeout) then sleep interval.
func (e *Env) startClientLoop(t testing.TB, ip string, interval time.Duration) *clientLoop {
	t.Helper()
	if e.Probe != "" {
		return e.runProbe("--url", "http://"+ip+"/", "--interval", interval.String(), "--timeout", "1s")
	}
	l := &clientLoop{e: e, stopFile: newStopFile()}
	// Each request runs in the background so that a slow or timed-out one does
	// not lower the rate; the script prints one ok/fail line per request.
	script := fmt.Sprintf(`rm -f %[1]s; echo "start $(date +%%s.%%N)"; while [ ! -e %[1]s ]; do (if curl -s -m 1 -o /dev/null http://%[2]s/; then echo "ok $(date +%%s.%%N)"; else echo "fail $(date +%%s.%%N)"; fi) & sleep %[3]s; done; wait; echo "end $(date +%%s.%%N)"; rm -f %[1]s`,
		l.stopFile, ip, fmt.Sprintf("%.3f", interval.Seconds()))
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.res, l.err = e.client(context.Background(), script)
	}()
	return l
}

// runProbe starts e2e-probe on the client with args, stopped by finish.
func (e *Env) runProbe(args ...string) *clientLoop {
	l := &clientLoop{e: e, stopFile: newStopFile(), probe: true}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.res, l.err = e.Hosts.Run(context.Background(), ClientHost, append(append([]string{e.Probe}, args...), "--stop-file", l.stopFile)...)
	}()
	return l
}

func newStopFile() string { return fmt.Sprintf("/tmp/ironlb-e2e-stop-%d", time.Now().UnixNano()) }

// finish tells the client loop to stop and waits for its output in l.res.
func (l *clientLoop) finish(t testing.TB) {
	t.Helper()
	if _, err := l.e.Hosts.Run(context.Background(), ClientHost, "touch", l.stopFile); err != nil {
		t.Fatalf("stopping the client loop: %v", err)
	}
	l.wg.Wait()
	if l.err != nil {
		t.Fatalf("client loop: %v", l.err)
	}
}

// stop ends the loop and returns total requests, failures and the failed
// requests' lines.
func (l *clientLoop) stop(t testing.TB) (total int, failures []string, rate float64) {
	t.Helper()
	l.finish(t)
	if l.probe {
		recs := probe.Parse(l.res.Stdout)
		sum := probe.Summarize(recs, time.Now())
		for _, r := range recs {
			if !r.OK {
				failures = append(failures, r.Sent.Format("15:04:05.000")+" "+r.Err)
			}
		}
		return sum.Total, failures, sum.Rate
	}
	var start, end float64
	for _, line := range strings.Split(strings.TrimSpace(l.res.Stdout), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case "start", "end":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("probe loop printed %q: %v", line, err)
			}
			if f[0] == "start" {
				start = v
			} else {
				end = v
			}
		case "ok":
			total++
		default:
			total++
			failures = append(failures, line)
		}
	}
	if end > start {
		rate = float64(total) / (end - start)
	}
	return total, failures, rate
}

// TestSpeakerRollingRestart restarts the speaker DaemonSet (rolling update)
// while mypc sends ~20 requests/s to a walkthrough IP: every request should
// succeed (the speakers leave memberlist on SIGTERM and hand over at once).
func TestSpeakerRollingRestart(t *testing.T) {
	e := requireEnv(t)
	ips := applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	e.waitServing(t, ips[0])
	loop := e.startClientLoop(t, ips[0], 50*time.Millisecond)
	time.Sleep(2 * time.Second)
	if out, err := e.kubectl(ctx, "", "rollout", "restart", "daemonset/"+Release+"-speaker", "-n", Namespace); err != nil {
		loop.stop(t)
		t.Fatalf("rollout restart: %v\n%s", err, out)
	}
	if out, err := e.kubectl(ctx, "", "rollout", "status", "daemonset/"+Release+"-speaker", "-n", Namespace, "--timeout=4m"); err != nil {
		loop.stop(t)
		t.Fatalf("rollout status: %v\n%s", err, out)
	}
	time.Sleep(3 * time.Second)
	total, failures, rate := loop.stop(t)
	t.Logf("speaker rolling restart: %d requests at %.1f req/s to %s, %d failed", total, rate, ips[0], len(failures))
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed during the speaker rolling restart (target 0): %v", len(failures), total, failures)
	}
}
