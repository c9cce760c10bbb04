package membership

import (
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// timing is one candidate set of memberlist timings.
type timing struct {
	name string
	o    Options
}

func timings() []timing {
	lan := DefaultOptions()
	// memberlist's DefaultLANConfig, which MetalLB runs with.
	lan.ProbeInterval, lan.ProbeTimeout = time.Second, 500*time.Millisecond
	lan.SuspicionMult, lan.SuspicionMaxTimeoutMult = 4, 6
	lan.GossipInterval = 200 * time.Millisecond

	b := DefaultOptions()
	b.ProbeInterval, b.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	b.SuspicionMult, b.SuspicionMaxTimeoutMult = 3, 3

	c := DefaultOptions()
	c.ProbeInterval, c.ProbeTimeout = 250*time.Millisecond, 150*time.Millisecond
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = 2, 2

	d := DefaultOptions()
	d.ProbeInterval, d.ProbeTimeout = 150*time.Millisecond, 75*time.Millisecond
	d.SuspicionMult, d.SuspicionMaxTimeoutMult = 3, 2

	return []timing{
		{"lan-default", lan},
		{"pi200-sm3", b},
		{"default", DefaultOptions()}, // probe 100ms/50ms, suspicion 4x (max 3x)
		{"pi250-sm2", c},
		{"pi150-sm3-max2", d},
	}
}

func describe(o Options) string {
	return fmt.Sprintf("probe %s/%s, suspicion %dx (max %dx), gossip %s", o.ProbeInterval, o.ProbeTimeout,
		o.SuspicionMult, o.SuspicionMaxTimeoutMult, o.GossipInterval)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkFailover measures, per timing set and cluster size, the time from a
// hard kill of one member (no Leave; its packets blackholed both ways, TCP dials
// to it hang, as for a crashed host) until every survivor has raised the leave
// event. Each trial is a fresh cluster on loopback; the kill happens at a random
// phase of the probe cycle. Trials per cell: IRONLB_FAILOVER_TRIALS (default
// 20); clusters run IRONLB_FAILOVER_PARALLEL at a time (default 4) to bound the
// wall time; members are mostly idle, so they do not compete for CPU.
//
//	go test ./internal/membership -run '^$' -bench BenchmarkFailover -benchtime 1x -v
func BenchmarkFailover(b *testing.B) {
	trials := envInt("IRONLB_FAILOVER_TRIALS", 20)
	parallel := envInt("IRONLB_FAILOVER_PARALLEL", 4)
	only := os.Getenv("IRONLB_FAILOVER_ONLY")
	for _, tm := range timings() {
		if only != "" && !strings.Contains(only, tm.name) {
			continue
		}
		for _, n := range []int{3, 5} {
			b.Run(fmt.Sprintf("%s/members=%d", tm.name, n), func(b *testing.B) {
				var all, first []time.Duration
				for i := 0; i < b.N; i++ {
					l, f := failoverTrials(b, tm.o, n, trials, parallel)
					all, first = append(all, l...), append(first, f...)
				}
				slices.Sort(all)
				slices.Sort(first)
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
				b.ReportMetric(ms(pct(all, 50)), "p50-ms")
				b.ReportMetric(ms(pct(all, 99)), "p99-ms")
				b.ReportMetric(ms(all[len(all)-1]), "max-ms")
				b.ReportMetric(ms(pct(first, 50)), "first-p50-ms")
				b.Logf("| %s | %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f |", tm.name, describe(tm.o), n, len(all),
					ms(pct(first, 50)), ms(pct(all, 50)), ms(pct(all, 90)), ms(pct(all, 99)), ms(all[len(all)-1]))
			})
		}
	}
}

// pct is the nearest-rank percentile of sorted durations.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (p*len(sorted) + 99) / 100
	return sorted[max(0, min(i, len(sorted))-1)]
}

// failoverTrials runs trials clusters, parallel at a time, and returns per
// trial the time until the last and the first survivor saw the victim leave.
func failoverTrials(tb testing.TB, o Options, n, trials, parallel int) (last, first []time.Duration) {
	var mu sync.Mutex
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := 0; i < trials; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(seed int64) {
			defer wg.Done()
			defer func() { <-sem }()
			l, f := oneFailover(tb, o, n, rand.New(rand.NewSource(seed)))
			mu.Lock()
			last, first = append(last, l), append(first, f)
			mu.Unlock()
		}(int64(i + 1))
	}
	wg.Wait()
	return last, first
}

func oneFailover(tb testing.TB, o Options, n int, rnd *rand.Rand) (last, first time.Duration) {
	f := newFabric()
	ms := startCluster(tb, f, n, o, logr.Discard())
	want := names(ms)
	waitMembers(tb, ms, want, 30*time.Second)
	// Let the cluster settle (push/pull done, no pending gossip), then kill at a
	// random point of the probe cycle.
	time.Sleep(time.Second + time.Duration(rnd.Int63n(int64(o.ProbeInterval))))
	for _, m := range ms {
		drain(m)
	}
	vi := rnd.Intn(n)
	victim := ms[vi]
	survivors := slices.Delete(slices.Clone(ms), vi, vi+1)
	for _, m := range survivors {
		m.list.SetPeers(nil) // no rejoin attempts at the victim during the trial
	}
	killed := time.Now()
	victim.kill(f)
	first, last = waitDeath(tb, survivors, victim.name, killed, 2*time.Minute)
	for _, m := range survivors {
		m.stop()
	}
	return last, first
}

// waitDeath waits until every survivor has raised the leave event for victim
// and returns the time from since until the first and the last of them did.
// Events carry the time memberlist marked the victim dead, which is when it
// left that survivor's Members(), so reading them late costs no precision.
func waitDeath(tb testing.TB, survivors []*member, victim string, since time.Time, timeout time.Duration) (first, last time.Duration) {
	tb.Helper()
	deadline := time.After(timeout)
	for _, m := range survivors {
	wait:
		for {
			select {
			case e := <-m.list.Events():
				if e.Type == EventLeave && e.Node == victim {
					d := e.Time.Sub(since)
					if first == 0 || d < first {
						first = d
					}
					last = max(last, d)
					break wait
				}
			case <-deadline:
				tb.Fatalf("%s did not see %s die within %s; it sees %d members", m.name, victim, timeout, len(m.list.Members()))
			}
		}
	}
	return first, last
}

// detectorLog reads the failure detector's decisions from memberlist's log:
// "Suspect X has failed, no acks received" (one member's probe of X failed;
// X becomes suspect) and "Marking X as failed, suspect timeout reached" (one
// member's suspicion timer declared X dead). It counts them per member X.
type detectorLog struct {
	mu        sync.Mutex
	suspected map[string]int
	failed    map[string]int
}

var (
	suspectLine = regexp.MustCompile(`Suspect (\S+) has failed`)
	failedLine  = regexp.MustCompile(`Marking (\S+) as failed`)
)

func newDetectorLog() *detectorLog {
	return &detectorLog{suspected: map[string]int{}, failed: map[string]int{}}
}

// logger is the logr.Logger to start the members with.
func (d *detectorLog) logger() logr.Logger {
	// Both lines are memberlist INFO lines, logged at V(0).
	return funcr.New(func(_, args string) { d.record(args) }, funcr.Options{})
}

func (d *detectorLog) record(line string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := suspectLine.FindStringSubmatch(line); m != nil {
		d.suspected[m[1]]++
	}
	if m := failedLine.FindStringSubmatch(line); m != nil {
		d.failed[m[1]]++
	}
}

// falseAlarms counts the decisions about members not in dead (which really
// died): suspicions raised, failure declarations, and distinct members
// declared failed.
func (d *detectorLog) falseAlarms(dead map[string]bool) (suspicions, failures, members int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, c := range d.suspected {
		if !dead[name] {
			suspicions += c
		}
	}
	for name, c := range d.failed {
		if !dead[name] {
			failures += c
			members++
		}
	}
	return suspicions, failures, members
}

// TestFalsePositivesUnderLoad runs a cluster with the default timings while
// burner processes keep every core busy, and counts members declared dead
// although nobody died (the failover defaults must not buy speed with flapping).
// It runs only when IRONLB_FP_DURATION is set (e.g. 2m, 10m):
//
//	IRONLB_FP_DURATION=2m go test ./internal/membership -run TestFalsePositivesUnderLoad -v -timeout 30m
//
// IRONLB_FP_MEMBERS sets the cluster size (default 5, at most 254: one
// 127.0.0.x address each), IRONLB_FP_BURNERS the
// number of burner processes (default: one per CPU), IRONLB_FP_TIMING a timing
// set of BenchmarkFailover by name (default: DefaultOptions).
func TestFalsePositivesUnderLoad(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("IRONLB_FP_DURATION"))
	if err != nil || dur <= 0 {
		t.Skip("set IRONLB_FP_DURATION (e.g. 2m) to run the CPU-saturation false-positive measurement")
	}
	n := envInt("IRONLB_FP_MEMBERS", 5)
	burners := envInt("IRONLB_FP_BURNERS", runtime.NumCPU())
	detector := newDetectorLog()

	f := newFabric()
	o := DefaultOptions()
	name := "default"
	if want := os.Getenv("IRONLB_FP_TIMING"); want != "" {
		found := false
		for _, tm := range timings() {
			if tm.name == want {
				o, name, found = tm.o, tm.name, true
			}
		}
		if !found {
			t.Fatalf("IRONLB_FP_TIMING=%q: not one of the BenchmarkFailover timing sets", want)
		}
	}
	o.SecretKey = []byte("fp-test")
	ms := formCluster(t, f, n, o, detector.logger())
	defer stopAll(ms)
	for _, m := range ms {
		drain(m)
	}

	// Burners are this test binary re-executed in burn mode; killed by pid.
	var procs []*exec.Cmd
	for i := 0; i < burners; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBurnHelper$")
		cmd.Env = append(os.Environ(), "IRONLB_BURN=1")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start burner: %v", err)
		}
		procs = append(procs, cmd)
	}
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	t.Logf("%d members, %d burner processes (pids %v), %s, timings %s: %s", n, burners, pids(procs), dur, name, describe(o.withDefaults()))

	leaves := 0
	maxHealth := 0
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < dur {
		<-tick.C
		for _, m := range ms {
			for _, e := range drain(m) {
				if e.Type == EventLeave {
					leaves++
					t.Logf("FALSE POSITIVE at %s: %s saw %s leave", time.Since(start).Round(time.Millisecond), m.name, e.Node)
				}
			}
			maxHealth = max(maxHealth, m.list.HealthScore())
		}
	}
	suspicions, failures, failedMembers := detector.falseAlarms(nil)
	t.Logf("result: %d false leave events, %d members declared failed (%d declarations), %d suspicions raised, max Lifeguard health score %d",
		leaves, failedMembers, failures, suspicions, maxHealth)
	if leaves > 0 {
		t.Errorf("%d false positives under CPU load", leaves)
	}
}

// TestBurnHelper is the CPU burner process for TestFalsePositivesUnderLoad.
func TestBurnHelper(t *testing.T) {
	if os.Getenv("IRONLB_BURN") != "1" {
		t.Skip("burner helper, run by TestFalsePositivesUnderLoad")
	}
	x := uint64(1)
	for {
		x = x*6364136223846793005 + 1442695040888963407
		if x == 0 {
			fmt.Println(x)
		}
	}
}

func pids(ps []*exec.Cmd) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.Process.Pid)
	}
	return out
}
