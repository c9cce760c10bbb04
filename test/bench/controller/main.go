// Command controller-bench measures the ironlb controller against a real API server
// (envtest: kube-apiserver + etcd from ./bin), with the controller running as its own
// process (`ironlb controller`), so its memory is measured alone:
//
//  1. create -> IP latency: Services created one at a time; time from the create
//     request to the IP seen in status through a watch (p50, p99, max);
//  2. bulk: N Services created concurrently; time until every one has an IP, and
//     the controller's peak RSS (VmHWM), CPU, and the API server's requests per
//     Service (its apiserver_request_total);
//  3. restart: the controller is stopped and a new one started with the N Services
//     in place; time until it has reconciled them all (its reconcile counter covers
//     every Service and its queue is empty) and how many IPs changed (must be 0).
//
// With -peer metallb the same run then measures MetalLB's controller (bin/metallb-
// controller, `make metallb`) on a fresh, identical API server with MetalLB's CRDs,
// both in backlog mode, and prints the two side by side with their ratio. MetalLB's
// metrics endpoint needs a service-account token, so its restart is not measured.
//
// Run it from the repository root: go run ./test/bench/controller (or make
// bench-controller, make bench-controller-metallb).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// options are the command line's settings, shared by every controller measured.
type options struct {
	latencyN, bulkN, parallel int
	metricsPort               int
	keep, backlog             bool
	controllerArgs            []string
	heapProfile               string
	// cpuProfileDir, when set with backlog, receives CPU profiles of the API server
	// and the controller over the first cpuProfileSeconds of the allocation.
	cpuProfileDir     string
	cpuProfileSeconds int
}

func main() {
	var (
		o           options
		extraArgs   string
		peer        string
		profileSecs int
	)
	flag.IntVar(&o.latencyN, "latency-services", 200, "services created one at a time for the create->IP latency")
	flag.IntVar(&o.bulkN, "services", 10000, "services created concurrently for the bulk and restart phases")
	flag.IntVar(&o.parallel, "create-parallelism", 16, "concurrent create requests in the bulk phase")
	flag.IntVar(&o.metricsPort, "metrics-port", 19120, "metrics port of the controller under test (plain HTTP, loopback); the next port serves pprof")
	flag.BoolVar(&o.keep, "keep-logs", false, "keep the controller logs directory")
	flag.StringVar(&extraArgs, "controller-args", "", "extra flags for `ironlb controller`, space separated (e.g. --service-workers=16)")
	flag.StringVar(&o.heapProfile, "heap-profile", "", "write the restarted ironlb controller's heap profile (after it reconciled everything) to this file")
	flag.StringVar(&o.cpuProfileDir, "cpu-profiles", "", "with -backlog: write CPU profiles of the API server and the controller, taken while the controller allocates, to <controller>-apiserver.prof and <controller>-controller.prof in this directory")
	flag.IntVar(&profileSecs, "cpu-profile-seconds", 15, "length of the -cpu-profiles profiles")
	flag.BoolVar(&o.backlog, "backlog", false, "create the bulk Services while the controller is stopped, then start it: measures the controller's own allocation throughput")
	flag.StringVar(&peer, "peer", "", `"metallb": measure MetalLB's controller after ironlb's in the same run, both with -backlog, and print the ratios`)
	flag.Parse()
	o.controllerArgs = strings.Fields(extraArgs)
	o.cpuProfileSeconds = profileSecs
	if err := run(o, peer); err != nil {
		fmt.Fprintln(os.Stderr, "controller-bench:", err)
		os.Exit(1)
	}
}

func run(o options, peer string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	bin := filepath.Join(root, "bin")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("needs %s (make tools): %w", filepath.Join(bin, b), err)
		}
	}
	work, err := os.MkdirTemp("", "ironlb-bench-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer func() {
			if err := os.RemoveAll(work); err != nil {
				fmt.Fprintln(os.Stderr, "controller-bench: removing the work directory:", err)
			}
		}()
	}

	fmt.Println("# building ironlb")
	ironlbBin := filepath.Join(work, "ironlb")
	if out, err := exec.Command("go", "build", "-o", ironlbBin, "./cmd/ironlb").CombinedOutput(); err != nil {
		return fmt.Errorf("building ironlb: %w\n%s", err, out)
	}
	cuts := []*controllerUnderTest{ironlb(root, ironlbBin, o)}
	switch peer {
	case "":
	case "metallb":
		m, err := metallb(root, o)
		if err != nil {
			return err
		}
		cuts = append(cuts, m)
		o.backlog = true // the comparison is from N pending Services, for both
	default:
		return fmt.Errorf("-peer %q: the only peer is \"metallb\"", peer)
	}

	fmt.Printf("# machine: %d CPUs, %s; load average %s; services: latency %d, bulk %d\n",
		runtime.NumCPU(), kernel(), loadAverage(), o.latencyN, o.bulkN)
	var results []*result
	for _, cut := range cuts {
		fmt.Printf("## %s\n", cut.name)
		r, err := measure(ctx, cut, o, bin, work)
		if err != nil {
			return fmt.Errorf("%s: %w", cut.name, err)
		}
		results = append(results, r)
	}
	if o.keep {
		fmt.Println("# logs in", work)
	}
	if len(results) == 2 {
		printSideBySide(results[0], results[1], o)
	}
	return nil
}

// printSideBySide prints the two controllers' figures as a Markdown table with the
// ratio peer/ironlb (above 1: ironlb is faster or smaller).
func printSideBySide(a, b *result, o options) {
	fmt.Printf("\n## side by side: %d pending Services, one run, load average now %s\n\n", o.bulkN, loadAverage())
	fmt.Printf("| | %s | %s | %s / %s |\n|---|---|---|---|\n", a.name, b.name, b.name, a.name)
	row := func(what, va, vb string, ra, rb float64) {
		ratio := "-"
		if ra > 0 && rb > 0 {
			ratio = fmt.Sprintf("%.2f", rb/ra)
		}
		fmt.Printf("| %s | %s | %s | %s |\n", what, va, vb, ratio)
	}
	secs := func(d time.Duration) float64 { return d.Seconds() }
	row(fmt.Sprintf("all %d have an IP, from the controller's start", o.bulkN),
		fmt.Sprintf("%s (%.0f/s)", a.allocated.Round(100*time.Millisecond), float64(o.bulkN)/secs(a.allocated)),
		fmt.Sprintf("%s (%.0f/s)", b.allocated.Round(100*time.Millisecond), float64(o.bulkN)/secs(b.allocated)),
		secs(a.allocated), secs(b.allocated))
	row("API server requests per Service", a.requestsPerService, b.requestsPerService, a.requestTotal, b.requestTotal)
	perSvc := func(d time.Duration) string { return perService(d, o.bulkN) }
	row("controller CPU per Service (start-up included)", perSvc(a.controllerCPU), perSvc(b.controllerCPU), secs(a.controllerCPU), secs(b.controllerCPU))
	row("kube-apiserver CPU per Service", perSvc(a.apiserverCPU), perSvc(b.apiserverCPU), secs(a.apiserverCPU), secs(b.apiserverCPU))
	row("etcd CPU per Service", perSvc(a.etcdCPU), perSvc(b.etcdCPU), secs(a.etcdCPU), secs(b.etcdCPU))
	row("controller peak RSS (VmHWM)", fmt.Sprintf("%.0f MB", float64(a.peakRSSkB)/1000), fmt.Sprintf("%.0f MB", float64(b.peakRSSkB)/1000),
		float64(a.peakRSSkB), float64(b.peakRSSkB))
	if len(a.latency) > 0 && len(b.latency) > 0 {
		row(fmt.Sprintf("create -> IP p50, %d Services one at a time", len(a.latency)), pct(a.latency, 50).String(), pct(b.latency, 50).String(),
			secs(pct(a.latency, 50)), secs(pct(b.latency, 50)))
		row("create -> IP p99", pct(a.latency, 99).String(), pct(b.latency, 99).String(), secs(pct(a.latency, 99)), secs(pct(b.latency, 99)))
	}
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return "Linux " + strings.TrimSpace(string(b))
}

// loadAverage is the machine's 1, 5 and 15 minute load average: the benchmark shares
// its CPUs with whatever else runs.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

var errNoPeerBinary = errors.New("build it with `make metallb`")
