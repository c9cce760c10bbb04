//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/e2e/probe"
)

// BenchmarkSaturation checks that the speakers' failure detector does not buy
// its fast failover with flapping: with every CPU of the machine saturated by
// busy loops for E2E_SATURATION (default 10m), it counts owner changes of the
// walkthrough's Services, seen two ways: any change of a ServiceL2Status
// snapshot taken every second, and nodeAssigned events (one per owner change,
// even if it flips back between snapshots). mypc sends 20 requests/s to one
// service IP the whole time; failed requests are reported too.
//
//	sudo go test -tags e2e ./test/e2e -run '^$' -bench Saturation -benchtime 1x -timeout 30m -v
func BenchmarkSaturation(b *testing.B) {
	e := benchEnv(b)
	dur := 10 * time.Minute
	if v := os.Getenv("E2E_SATURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("E2E_SATURATION=%q: want a duration such as 10m", v)
		}
		dur = d
	}
	var owners map[string]string
	dumpOnFailure(b, e, func() []string { return slices.Sorted(maps.Values(owners)) })
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ips := applyWalkthrough(b, e)
		ctx := context.Background()
		before, err := e.ownerSnapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		owners = before
		start := metav1.Now()
		loop := e.startProbe(b, ips[0], 50*time.Millisecond)
		stopBurners := burnCPUs(b, runtime.NumCPU())
		fmt.Fprintf(os.Stderr, "saturation: %d busy loops for %v, owners %v; mypc probes %s at 20 req/s\n", runtime.NumCPU(), dur, before, ips[0])

		changes := 0
		prev := before
		for t0, n := time.Now(), 1; time.Since(t0) < dur; n++ {
			time.Sleep(time.Second)
			now, err := e.ownerSnapshot(ctx)
			if err != nil {
				// The API server is starved too; a failed read is not a change.
				fmt.Fprintf(os.Stderr, "  %v: reading ServiceL2Status: %v\n", time.Since(t0).Round(time.Second), err)
				continue
			}
			if !maps.Equal(now, prev) {
				changes++
				fmt.Fprintf(os.Stderr, "  %v: OWNER CHANGE %v -> %v\n", time.Since(t0).Round(time.Second), prev, now)
				prev = now
			}
			if n%60 == 0 {
				fmt.Fprintf(os.Stderr, "  %v of %v: %d owner changes so far\n", time.Since(t0).Round(time.Second), dur, changes)
			}
		}
		stopBurners()
		recs := loop.stopRecords(b)
		assigned, err := e.nodeAssignedSince(ctx, start.Time)
		if err != nil {
			b.Fatal(err)
		}
		s := probe.Summarize(recs, start.Time)
		b.ReportMetric(float64(changes), "owner-changes")
		b.ReportMetric(float64(len(assigned)), "nodeAssigned-events")
		b.ReportMetric(float64(s.Failed), "failed-requests")
		fmt.Fprintf(os.Stderr, "saturation %v: %d ServiceL2Status changes, %d nodeAssigned events %v, %d of %d requests failed (%.1f req/s)\n",
			dur, changes, len(assigned), assigned, s.Failed, s.Total, s.Rate)
		if changes > 0 || len(assigned) > 0 {
			b.Errorf("%d spurious owner changes (%d nodeAssigned events) under CPU saturation; want 0", changes, len(assigned))
		}
	}
}

// ownerSnapshot maps "namespace/name" of every announced Service to the
// nodes announcing it.
func (e *Env) ownerSnapshot(ctx context.Context) (map[string]string, error) {
	var l2 v1beta1.ServiceL2StatusList
	if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	nodes := map[string][]string{}
	for _, s := range l2.Items {
		k := s.Status.ServiceNamespace + "/" + s.Status.ServiceName
		nodes[k] = append(nodes[k], s.Status.Node)
	}
	out := map[string]string{}
	for k, ns := range nodes {
		slices.Sort(ns)
		out[k] = strings.Join(ns, ",")
	}
	return out, nil
}

// nodeAssignedSince lists nodeAssigned events on Services last seen after t,
// as "service: message".
func (e *Env) nodeAssignedSince(ctx context.Context, t time.Time) ([]string, error) {
	evs, err := e.CS.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=nodeAssigned"})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ev := range evs.Items {
		last := ev.LastTimestamp.Time
		if ev.Series != nil {
			last = ev.Series.LastObservedTime.Time
		}
		if last.IsZero() {
			last = ev.EventTime.Time
		}
		if last.After(t) {
			out = append(out, fmt.Sprintf("%s/%s: %s", ev.InvolvedObject.Namespace, ev.InvolvedObject.Name, ev.Message))
		}
	}
	return out, nil
}

// burnCPUs starts n busy-loop processes and returns the function that kills
// them (by pid).
func burnCPUs(b *testing.B, n int) (stop func()) {
	var procs []*exec.Cmd
	stop = func() {
		for _, p := range procs {
			_ = p.Process.Kill() // gone already is fine
			_ = p.Wait()         // reaps it; the error is the kill's signal
		}
		procs = nil
	}
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			stop()
			b.Fatalf("starting a CPU burner: %v", err)
		}
		procs = append(procs, cmd)
	}
	b.Cleanup(stop)
	return stop
}
