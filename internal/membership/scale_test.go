package membership

import (
	"fmt"
	"math"
	"math/rand"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// BenchmarkFailoverAtScale measures failure detection with the default timings
// in clusters of 10, 50 and 100 members: per trial, the time from a hard kill of
// one member until every survivor has declared it dead (it is gone from every
// survivor's Members()). All members run in this one process on real UDP/TCP
// sockets, member i on 127.0.0.i, encrypted; the kill is the fabric's (packets
// blackholed both ways, TCP dials hang, Shutdown without Leave: a crashed or
// powered-off host). Unlike BenchmarkFailover, one cluster serves all trials of
// a size: each victim is replaced by a new member (new name, the victim's IP,
// a new port), so every kill happens at the same size without re-forming a
// 100-member cluster per trial.
//
//	go test ./internal/membership -run '^$' -bench BenchmarkFailoverAtScale -benchtime 1x -v -timeout 30m
//
// IRONLB_SCALE_TRIALS sets the trials per size (default 20),
// IRONLB_SCALE_MEMBERS the sizes (default "10,50,100"; 2 to 254).
func BenchmarkFailoverAtScale(b *testing.B) {
	trials := envInt("IRONLB_SCALE_TRIALS", 20)
	sizes, err := envSizes("IRONLB_SCALE_MEMBERS", []int{10, 50, 100}, maxClusterSize)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			o := DefaultOptions()
			o.SecretKey = []byte("scale-bench")
			detector := newDetectorLog()
			c := &scaleCluster{f: newFabric(), o: o, log: detector.logger(), killed: map[string]bool{}}
			c.live = formCluster(b, c.f, n, o, c.log)
			defer func() { stopAll(c.live) }()
			idle := cpuShare(5 * time.Second)
			loadBefore := loadAverage()

			rnd := rand.New(rand.NewSource(int64(n)))
			var first, last []time.Duration
			for i := 0; i < b.N*trials; i++ {
				f, l := c.trial(b, rnd)
				first, last = append(first, f), append(last, l)
			}
			slices.Sort(first)
			slices.Sort(last)
			suspicions, _, falseDeaths := detector.falseAlarms(c.killed)

			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(pct(last, 50)), "p50-ms")
			b.ReportMetric(ms(pct(last, 99)), "p99-ms")
			b.ReportMetric(ms(last[len(last)-1]), "max-ms")
			b.ReportMetric(ms(pct(first, 50)), "first-p50-ms")
			b.ReportMetric(100*idle, "idle-cpu-%")
			b.ReportMetric(float64(suspicions), "false-suspicions")
			b.ReportMetric(float64(falseDeaths), "false-deaths")
			b.Logf("| %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f%% | %d | %d | %s -> %s |", n, len(last),
				ms(pct(first, 50)), ms(pct(last, 50)), ms(pct(last, 90)), ms(pct(last, 99)), ms(last[len(last)-1]),
				100*idle, suspicions, falseDeaths, loadBefore, loadAverage())
		})
	}
}

// scaleCluster is a cluster that keeps its size across kills: each killed
// member is replaced by a new one.
type scaleCluster struct {
	f        *fabric
	o        Options
	log      logr.Logger
	live     []*member
	killed   map[string]bool // names of the members killed so far
	replaced int
}

// trial kills a random member, returns the time until the first and the last
// survivor declared it dead, and replaces it.
func (c *scaleCluster) trial(tb testing.TB, rnd *rand.Rand) (first, last time.Duration) {
	tb.Helper()
	// Let the previous replacement's gossip die down, then kill at a random
	// point of the probe cycle.
	time.Sleep(time.Second + time.Duration(rnd.Int63n(int64(c.o.ProbeInterval))))
	for _, m := range c.live {
		drain(m)
	}
	vi := rnd.Intn(len(c.live))
	victim := c.live[vi]
	survivors := slices.Delete(slices.Clone(c.live), vi, vi+1)
	c.killed[victim.name] = true
	killed := time.Now()
	victim.kill(c.f)
	first, last = waitDeath(tb, survivors, victim.name, killed, time.Minute)
	for _, m := range survivors {
		if slices.Contains(m.list.Members(), victim.name) {
			tb.Fatalf("%s raised the leave of %s but still lists it in Members()", m.name, victim.name)
		}
	}

	c.replaced++
	ip, _, err := net.SplitHostPort(victim.addr)
	if err != nil {
		tb.Fatalf("victim address %q: %v", victim.addr, err)
	}
	r := startMemberAt(tb, c.f, fmt.Sprintf("r%d", c.replaced), ip, c.o, c.log)
	var seeds []string
	for _, i := range rnd.Perm(len(survivors))[:min(3, len(survivors))] {
		seeds = append(seeds, survivors[i].addr)
	}
	if _, err := r.list.Join(seeds); err != nil {
		tb.Fatalf("replacement %s joining %v: %v", r.name, seeds, err)
	}
	c.live = append(survivors, r)
	waitMembers(tb, c.live, names(c.live), convergeTimeout(len(c.live)))
	// The speaker's peer list follows the speaker Pods: the victim's is gone,
	// the replacement's is new.
	setPeers(c.live)
	return first, last
}

// formCluster starts n members, joins each to one earlier member and lets
// gossip spread the rest, then gives each the addresses of all as its peers (the speaker's
// rejoin loop, which also brings back members declared dead meanwhile) and
// waits until all agree. startCluster's SetPeers of all addresses up front
// makes every member push/pull its whole state with every member it does not
// know yet, one after the other: in one process on 2 cores that takes minutes
// at 100 members.
func formCluster(tb testing.TB, f *fabric, n int, opts Options, logger logr.Logger) []*member {
	tb.Helper()
	ms := startMembers(tb, f, n, opts, logger)
	rnd := rand.New(rand.NewSource(int64(n)))
	for i, m := range ms[1:] {
		// Join one random earlier member; a starved one may not answer the
		// push/pull within the TCP timeout, so try others.
		var err error
		for range 5 {
			if _, err = m.list.Join([]string{ms[rnd.Intn(i+1)].addr}); err == nil {
				break
			}
		}
		if err != nil {
			stopAll(ms)
			tb.Fatalf("%s joining the cluster, 5 attempts: %v", m.name, err)
		}
	}
	want := names(ms)
	for end := time.Now().Add(10 * time.Second); !agree(ms, want) && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	setPeers(ms)
	waitMembers(tb, ms, want, convergeTimeout(n))
	return ms
}

// setPeers gives every member the addresses of all as its peers, all at once
// as on separate hosts: each SetPeers joins, one after the other, the peers
// its member does not see yet, which takes seconds in a starved cluster.
func setPeers(ms []*member) {
	addrs := addrsOf(ms)
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { m.list.SetPeers(addrs) })
	}
	wg.Wait()
}

// envSizes parses a comma-separated list of cluster sizes, 2 to most, from
// the environment.
func envSizes(name string, def []int, most int) ([]int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 || n > most {
			return nil, fmt.Errorf("%s=%q: %q is not a cluster size from 2 to %d", name, v, f, most)
		}
		out = append(out, n)
	}
	return out, nil
}

// convergeTimeout bounds how long a cluster of n members may take to agree on
// its membership (join, or a replacement's join).
func convergeTimeout(n int) time.Duration {
	return 30*time.Second + time.Duration(n)*300*time.Millisecond
}

// stopAll leaves gracefully with every member at once and waits for them.
func stopAll(ms []*member) {
	for _, m := range ms {
		m.cancel()
	}
	for _, m := range ms {
		<-m.list.Done()
	}
}

// cpuShare measures, over d, how many cores this process keeps busy (1 = one
// core): with the members idle, what the failure detector itself costs.
func cpuShare(d time.Duration) float64 {
	before, start := processCPU(), time.Now()
	time.Sleep(d)
	return float64(processCPU()-before) / float64(time.Since(start))
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAverage is the machine's 1-minute load average, to record how shared it
// was during a measurement.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// suspicionBounds is memberlist's suspicion timeout for a cluster of n
// members: a suspect is declared dead min after the suspicion started once k
// other members have confirmed it, and after max without confirmations (k is
// 0 in clusters too small to give k confirmations: then min applies). It
// mirrors memberlist v0.7.0, util.go suspicionTimeout and state.go
// suspectNode; TestSuspicionScalingDocTable pins that version.
func suspicionBounds(o Options, n int) (minTimeout, maxTimeout time.Duration, k int) {
	o = o.withDefaults()
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	minTimeout = time.Duration(o.SuspicionMult) * time.Duration(scale*1000) * o.ProbeInterval / 1000
	k = o.SuspicionMult - 2
	if n-2 < k {
		k = 0
	}
	return minTimeout, time.Duration(o.SuspicionMaxTimeoutMult) * minTimeout, k
}

// suspicionDocHeading starts the table in docs/benchmarks-speaker.md that
// TestSuspicionScalingDocTable keeps in line with suspicionBounds.
const suspicionDocHeading = "### Suspicion timeout by cluster size"

// TestSuspicionScalingDocTable checks the documented suspicion timeouts of the
// default timings against memberlist's formula, so the doc cannot drift from
// the defaults; and pins the memberlist version the formula was copied from.
func TestSuspicionScalingDocTable(t *testing.T) {
	const mlPath, mlVersion = "github.com/hashicorp/memberlist", "v0.7.0"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == mlPath && dep.Version != mlVersion {
				t.Errorf("%s is %s: check suspicionBounds against its util.go suspicionTimeout and state.go suspectNode, then update mlVersion (%s)",
					mlPath, dep.Version, mlVersion)
			}
		}
	}

	doc, err := os.ReadFile("../../docs/benchmarks-speaker.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), suspicionDocHeading)
	if !ok {
		t.Fatalf("docs/benchmarks-speaker.md has no section %q", suspicionDocHeading)
	}
	// Rows: | members | max(1, log10 n) | confirmations k | min ms | max ms | ...
	rows := map[string][]string{}
	inTable := false
	for _, line := range strings.Split(table, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows[cells[0]] = cells
	}
	for _, n := range []int{4, 10, 50, 100, 1000} {
		lo, hi, k := suspicionBounds(DefaultOptions(), n)
		want := []string{
			strconv.Itoa(n),
			fmt.Sprintf("%.2f", math.Max(1, math.Log10(float64(n)))),
			strconv.Itoa(k),
			fmt.Sprintf("%.0f", float64(lo.Microseconds())/1000),
			fmt.Sprintf("%.0f", float64(hi.Microseconds())/1000),
		}
		got, ok := rows[want[0]]
		if !ok {
			t.Errorf("%s: no row for %d members; want one starting %s", suspicionDocHeading, n, strings.Join(want, " | "))
			continue
		}
		if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Errorf("%s, %d members: row starts %v, want %v", suspicionDocHeading, n, got[:min(len(got), len(want))], want)
		}
	}
}
