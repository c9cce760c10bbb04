package speaker

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/arp"
	"github.com/vishvananda/netns"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
)

// The failover benchmark builds, in network namespaces it names ilb-mb-*:
// a switch (bridge ilbmbbr0), three speaker nodes (10.201.0.11-13 on eth0)
// and a client (10.201.0.100). Each node runs this test binary as a child
// process in its namespace (TestNetnsNodeHelper): the real membership
// (memberlist with the default timings, encrypted), the real election and the
// real layer2 announcer on eth0, for one VIP. Only the Kubernetes inputs are
// fixed (one pool, one advertisement, every node eligible), so the numbers
// cover everything but the cache and reconcile path (BenchmarkDecide: tens of
// microseconds per Service).
const (
	mbPrefix = "ilb-mb-"
	mbBridge = "ilbmbbr0"
	mbVIP    = "10.201.0.200"
	mbClient = "10.201.0.100"
)

var mbNodes = []string{"n1", "n2", "n3"}

func mbNodeIP(i int) string { return fmt.Sprintf("10.201.0.%d", 11+i) }

// TestNetnsNodeHelper is one speaker node of BenchmarkFailoverARP, run by it
// as a child process inside the node's namespace.
func TestNetnsNodeHelper(t *testing.T) {
	node := os.Getenv("IRONLB_MB_NODE")
	if node == "" {
		t.Skip("child process of BenchmarkFailoverARP")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// As in Run: the announcer outlives the memberlist leave, so the node
	// keeps answering until its peers have seen it go.
	annCtx, stopAnn := context.WithCancel(context.Background())
	defer stopAnn()
	ann := layer2.NewAnnouncer(logr.Discard(), layer2.Options{NodeName: node})
	go func() { _ = ann.Run(annCtx) }()
	mo := membership.Options{
		NodeName: node, BindAddr: os.Getenv("IRONLB_MB_IP"), BindPort: membership.DefaultPort,
		SecretKey: []byte("bench"), RejoinInterval: time.Second,
	}
	// IRONLB_SUSPICION_MULT compares another suspicion window (0: default).
	if v := os.Getenv("IRONLB_SUSPICION_MULT"); v != "" {
		if _, err := fmt.Sscan(v, &mo.SuspicionMult); err != nil {
			t.Fatalf("IRONLB_SUSPICION_MULT=%q: %v", v, err)
		}
	}
	ml, err := membership.Start(ctx, logr.Discard(), mo)
	if err != nil {
		t.Fatal(err)
	}
	ml.SetPeers(strings.Split(os.Getenv("IRONLB_MB_PEERS"), ","))
	vip := netip.MustParseAddr(mbVIP)
	elect := func() {
		if ctx.Err() != nil {
			return // leaving: keep answering until the announcer stops, as Run does
		}
		if election.Winner(vip.String(), ml.Members()) == node {
			ann.SetBalancer("bench/svc", []netip.Addr{vip}, nil)
		} else {
			ann.DeleteBalancer("bench/svc")
		}
	}
	elect()
	for {
		select {
		case <-ml.Events():
			elect()
		case <-ctx.Done():
			<-ml.Done()
			time.Sleep(500 * time.Millisecond) // Run's LeaveGrace, as set by the command
			stopAnn()
			return
		}
	}
}

func mbRun(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// mbTeardown deletes every namespace this benchmark creates (by name);
// deleting a namespace removes its veth ends and the bridge.
func mbTeardown() {
	for _, ns := range append([]string{"sw", "c"}, mbNodes...) {
		_ = exec.Command("ip", "netns", "del", mbPrefix+ns).Run()
	}
}

func mbSetup(tb testing.TB) {
	tb.Helper()
	mbTeardown()
	sw := mbPrefix + "sw"
	mbRun(tb, "ip", "netns", "add", sw)
	mbRun(tb, "ip", "-n", sw, "link", "add", mbBridge, "type", "bridge")
	mbRun(tb, "ip", "-n", sw, "link", "set", mbBridge, "up")
	attach := func(name, addr string) {
		ns := mbPrefix + name
		mbRun(tb, "ip", "netns", "add", ns)
		mbRun(tb, "ip", "-n", ns, "link", "set", "lo", "up")
		mbRun(tb, "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "ilbmb-"+name, "netns", sw)
		mbRun(tb, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		mbRun(tb, "ip", "-n", ns, "link", "set", "eth0", "up")
		mbRun(tb, "ip", "-n", sw, "link", "set", "ilbmb-"+name, "master", mbBridge, "up")
	}
	for i, n := range mbNodes {
		attach(n, mbNodeIP(i))
	}
	attach("c", mbClient)
}

func mbMAC(tb testing.TB, node string) string {
	tb.Helper()
	out, err := exec.Command("ip", "-n", mbPrefix+node, "-o", "link", "show", "eth0").Output()
	if err != nil {
		tb.Fatalf("mac of %s: %v", node, err)
	}
	f := strings.Fields(string(out))
	i := slices.Index(f, "link/ether")
	if i < 0 || i+1 >= len(f) {
		tb.Fatalf("no MAC in %q", out)
	}
	return f[i+1]
}

// mbStartNode starts the helper for node i inside its namespace.
func mbStartNode(tb testing.TB, i int) *exec.Cmd {
	tb.Helper()
	var peers []string
	for j := range mbNodes {
		if j != i {
			peers = append(peers, mbNodeIP(j))
		}
	}
	cmd := exec.Command("ip", "netns", "exec", mbPrefix+mbNodes[i], os.Args[0], "-test.run=^TestNetnsNodeHelper$")
	cmd.Env = append(os.Environ(), "IRONLB_MB_NODE="+mbNodes[i], "IRONLB_MB_IP="+mbNodeIP(i), "IRONLB_MB_PEERS="+strings.Join(peers, ","))
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", mbNodes[i], err)
	}
	return cmd
}

// arpClient probes the VIP from the client namespace every 20 ms and records
// who answers.
type arpClient struct {
	mu      sync.Mutex
	replies []arpSeen
	sent    []time.Time
	c       *arp.Client
}

type arpSeen struct {
	at  time.Time
	mac string
}

func startARPClient(tb testing.TB, ctx context.Context) *arpClient {
	tb.Helper()
	ac := &arpClient{}
	ready := make(chan error, 1)
	go func() {
		// This goroutine's thread enters the client namespace and never
		// leaves it: the thread is discarded when the goroutine ends locked.
		runtime.LockOSThread()
		h, err := netns.GetFromName(mbPrefix + "c")
		if err != nil {
			ready <- err
			return
		}
		defer func() { _ = h.Close() }()
		if err := netns.Set(h); err != nil {
			ready <- err
			return
		}
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			ready <- err
			return
		}
		c, err := arp.Dial(ifi)
		if err != nil {
			ready <- err
			return
		}
		ac.c = c
		ready <- nil
		vip := netip.MustParseAddr(mbVIP)
		go func() {
			for {
				p, _, err := c.Read()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				if p.SenderIP == vip {
					ac.mu.Lock()
					ac.replies = append(ac.replies, arpSeen{time.Now(), p.SenderHardwareAddr.String()})
					ac.mu.Unlock()
				}
			}
		}()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				_ = c.Close()
				return
			case <-t.C:
				if c.Request(vip) == nil {
					ac.mu.Lock()
					ac.sent = append(ac.sent, time.Now())
					ac.mu.Unlock()
				}
			}
		}
	}()
	if err := <-ready; err != nil {
		tb.Fatalf("ARP client: %v", err)
	}
	return ac
}

// firstFrom returns the time of the first answer from mac after t.
func (ac *arpClient) firstFrom(mac string, after time.Time) (time.Time, bool) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	for _, r := range ac.replies {
		if r.at.After(after) && r.mac == mac {
			return r.at, true
		}
	}
	return time.Time{}, false
}

// onlyFrom reports whether, during the last d, every answer came from mac and
// there was at least one per 100 ms.
func (ac *arpClient) onlyFrom(mac string, d time.Duration) bool {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	since := time.Now().Add(-d)
	n := 0
	for _, r := range ac.replies {
		if r.at.After(since) {
			if r.mac != mac {
				return false
			}
			n++
		}
	}
	return n >= int(d/(100*time.Millisecond))
}

// maxGap returns the longest interval without any answer for the VIP between
// from and to (answers every 20 ms are expected while someone owns it).
func (ac *arpClient) maxGap(from, to time.Time) time.Duration {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	last, gap := from, time.Duration(0)
	for _, r := range ac.replies {
		if r.at.Before(from) || r.at.After(to) {
			continue
		}
		gap = max(gap, r.at.Sub(last))
		last = r.at
	}
	return max(gap, to.Sub(last))
}

// unanswered counts the requests sent between from and to that got no answer
// from anyone within wait.
func (ac *arpClient) unanswered(from, to time.Time, wait time.Duration) int {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	n := 0
	for _, s := range ac.sent {
		if s.Before(from) || s.After(to) {
			continue
		}
		if !slices.ContainsFunc(ac.replies, func(r arpSeen) bool { return !r.at.Before(s) && r.at.Sub(s) <= wait }) {
			n++
		}
	}
	return n
}

// TestNetnsFailoverMovesNeighbour: three speaker processes in three network
// namespaces over memberlist and a client that holds a neighbour entry for
// the VIP but sends nothing: when the owner is killed (SIGKILL, link down),
// and again when it is stopped gracefully (SIGTERM), the new owner's
// gratuitous ARP moves the client's entry to the new owner's MAC. Needs root.
func TestNetnsFailoverMovesNeighbour(t *testing.T) {
	c := startMBCluster(t)
	procs, macs, owner, oi, next := c.procs, c.macs, c.owner, c.ownerIdx, c.runnerUp

	// Until the members have converged every node may announce; probe by ARP
	// until the owner alone answers (the successor has withdrawn and sends
	// no more gratuitous ARP), then stop all client traffic.
	stable := func() {
		t.Helper()
		ctx, stopProbe := context.WithCancel(context.Background())
		defer stopProbe()
		c.waitStable(t, startARPClient(t, ctx))
	}
	stable()

	client := mbPrefix + "c"
	neighIs := func(what, mac string) {
		t.Helper()
		var last string
		end := time.Now().Add(30 * time.Second)
		start := time.Now()
		for time.Now().Before(end) {
			out, _ := exec.Command("ip", "-n", client, "neigh", "show", mbVIP, "dev", "eth0").CombinedOutput()
			if last = strings.TrimSpace(string(out)); strings.Contains(last, "lladdr "+mac) {
				t.Logf("%s: entry moved to %s after %v: %s", what, mac, time.Since(start).Round(time.Millisecond), last)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		table, _ := exec.Command("ip", "-n", client, "neigh", "show").CombinedOutput()
		t.Fatalf("%s: the client's neighbour entry for %s is %q, want lladdr %s; client neighbours:\n%s(MACs: %v)",
			what, mbVIP, last, mac, table, macs)
	}
	// The entry the client would have after talking to the owner; from here
	// on nothing but the speakers' gratuitous ARP can change it.
	pointAtOwner := func() {
		mbRun(t, "ip", "-n", client, "neigh", "replace", mbVIP, "lladdr", macs[owner], "dev", "eth0", "nud", "stale")
	}
	pointAtOwner()

	// Hard kill: process and link gone at once.
	_ = procs[oi].Process.Signal(syscall.SIGKILL)
	mbRun(t, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "down")
	_ = procs[oi].Wait() // exit status: killed
	procs[oi] = nil
	neighIs("after SIGKILL of "+owner, macs[next])

	// The owner returns and takes the VIP back.
	mbRun(t, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "up")
	procs[oi] = mbStartNode(t, oi)
	stable()
	pointAtOwner()

	// Graceful stop: memberlist leave, the successor announces at once.
	_ = procs[oi].Process.Signal(syscall.SIGTERM)
	neighIs("after SIGTERM of "+owner, macs[next])
	if err := procs[oi].Wait(); err != nil {
		t.Errorf("%s after SIGTERM: %v", owner, err)
	}
	procs[oi] = nil
}

// mbCluster is the running topology of the netns test and benchmarks: three
// nodes answering for the VIP, and the client's ARP probe when started.
type mbCluster struct {
	procs    []*exec.Cmd
	macs     map[string]string
	ac       *arpClient // nil until startProbe
	owner    string     // the VIP's elected owner with every node up
	ownerIdx int
	runnerUp string // its successor
}

// startMBCluster builds the namespaces and starts the three nodes; all is
// torn down when tb ends.
func startMBCluster(tb testing.TB) *mbCluster {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for network namespaces (runs in CI as root)")
	}
	mbSetup(tb)
	tb.Cleanup(mbTeardown)
	c := &mbCluster{macs: map[string]string{}, procs: make([]*exec.Cmd, len(mbNodes))}
	for _, n := range mbNodes {
		c.macs[n] = mbMAC(tb, n)
	}
	for i := range mbNodes {
		c.procs[i] = mbStartNode(tb, i)
	}
	tb.Cleanup(func() {
		for _, p := range c.procs {
			if p != nil && p.Process != nil {
				_ = p.Process.Kill()
				_ = p.Wait()
			}
		}
	})
	c.owner = election.Winner(mbVIP, mbNodes)
	c.ownerIdx = slices.Index(mbNodes, c.owner)
	c.runnerUp = election.Rank(mbVIP, mbNodes)[1]
	return c
}

// startProbe starts the client's ARP probe for the rest of tb.
func (c *mbCluster) startProbe(tb testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	c.ac = startARPClient(tb, ctx)
}

// waitStable waits until the owner alone has answered ac for a second.
func (c *mbCluster) waitStable(tb testing.TB, ac *arpClient) {
	tb.Helper()
	end := time.Now().Add(60 * time.Second)
	for !ac.onlyFrom(c.macs[c.owner], time.Second) {
		if time.Now().After(end) {
			tb.Fatalf("%s (%s) never became the only answerer for %s", c.owner, c.macs[c.owner], mbVIP)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkFailoverARP measures the VIP moving when its owner goes away, as a
// client on the segment sees it. The client asks for the VIP every 20 ms
// (gratuitous ARP counts too). "kill": the owner's process is SIGKILLed and
// its link set down; "sigterm": the owner is stopped gracefully (memberlist
// leave, then the announcer stops after the leave grace). Figures: time from
// the kill/SIGTERM to the first answer from the new owner, the longest time
// without any answer, and the probes around the event that nobody answered
// within 50 ms.
// Needs root (network namespaces); trials: IRONLB_FAILOVER_TRIALS (default 20).
//
//	go test ./speaker -run '^$' -bench BenchmarkFailoverARP -benchtime 1x -v
func BenchmarkFailoverARP(b *testing.B) {
	trials := envTrials(b, "IRONLB_FAILOVER_TRIALS", 20)
	c := startMBCluster(b)
	c.startProbe(b)
	procs, macs, ac, owner, ownerIdx, runnerUp := c.procs, c.macs, c.ac, c.owner, c.ownerIdx, c.runnerUp
	waitStable := func() { c.waitStable(b, ac) }

	for _, mode := range []string{"kill", "sigterm"} {
		b.Run(mode, func(b *testing.B) {
			var lat, gaps []time.Duration
			lost := 0
			for i := 0; i < b.N; i++ {
				for trial := 0; trial < trials; trial++ {
					waitStable()
					start := time.Now()
					if mode == "kill" {
						_ = procs[ownerIdx].Process.Signal(syscall.SIGKILL)
						mbRun(b, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "down")
					} else {
						_ = procs[ownerIdx].Process.Signal(syscall.SIGTERM)
					}
					var at time.Time
					end := time.Now().Add(60 * time.Second)
					for {
						if t, ok := ac.firstFrom(macs[runnerUp], start); ok {
							at = t
							break
						}
						if time.Now().After(end) {
							b.Fatalf("trial %d: %s never answered after %s was stopped (%s)", trial, runnerUp, owner, mode)
						}
						time.Sleep(5 * time.Millisecond)
					}
					_ = procs[ownerIdx].Wait()
					procs[ownerIdx] = nil
					lat = append(lat, at.Sub(start))
					gaps = append(gaps, ac.maxGap(start.Add(-100*time.Millisecond), at.Add(100*time.Millisecond)))
					time.Sleep(100 * time.Millisecond) // let the last answers of the window arrive
					lost += ac.unanswered(start.Add(-100*time.Millisecond), at.Add(50*time.Millisecond), 50*time.Millisecond)
					if mode == "kill" {
						mbRun(b, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "up")
					}
					// Bring the owner back; it wins the VIP again.
					procs[ownerIdx] = mbStartNode(b, ownerIdx)
				}
			}
			slices.Sort(lat)
			slices.Sort(gaps)
			pc := func(s []time.Duration, p int) time.Duration { return s[max(0, min(len(s), (p*len(s)+99)/100)-1)] }
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(pc(lat, 50)), "p50-ms")
			b.ReportMetric(ms(pc(lat, 99)), "p99-ms")
			b.ReportMetric(ms(pc(gaps, 50)), "gap-p50-ms")
			b.ReportMetric(ms(gaps[len(gaps)-1]), "gap-max-ms")
			b.ReportMetric(float64(lost), "unanswered-probes")
			b.Logf("| %s, 3 nodes | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %d |", mode, len(lat),
				ms(lat[0]), ms(pc(lat, 50)), ms(pc(lat, 90)), ms(pc(lat, 99)), ms(lat[len(lat)-1]),
				ms(pc(gaps, 50)), ms(gaps[len(gaps)-1]), lost)
		})
	}
}

// envTrials reads a trial count from the environment.
func envTrials(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// BenchmarkStallARP measures how long the owner may freeze without losing
// the VIP: the owner's process is stopped (SIGSTOP: no timers, no packets,
// as a node starved of CPU or a VM paused by its hypervisor) for each of a
// series of durations, then continued (SIGCONT), and the client watches for
// two seconds more whether another node answered for the VIP. A stall up to
// the failure detector's window keeps the owner; a longer one is a failover
// (the owner takes the VIP back once it refutes). Trials per duration:
// IRONLB_STALL_TRIALS (default 5); IRONLB_SUSPICION_MULT compares another
// suspicion multiplier. Needs root.
//
//	go test ./speaker -run '^$' -bench BenchmarkStallARP -benchtime 1x -v
func BenchmarkStallARP(b *testing.B) {
	trials := envTrials(b, "IRONLB_STALL_TRIALS", 5)
	c := startMBCluster(b)
	c.startProbe(b)
	stallsMS := []int{200, 300, 400, 500, 600, 700, 800, 1000, 1500}
	for i := 0; i < b.N; i++ {
		var row []string
		for _, ms := range stallsMS {
			d := time.Duration(ms) * time.Millisecond
			moved := 0
			for range trials {
				c.waitStable(b, c.ac)
				p := c.procs[c.ownerIdx].Process
				start := time.Now()
				if err := p.Signal(syscall.SIGSTOP); err != nil {
					b.Fatal(err)
				}
				time.Sleep(d) // the stall itself is the input being varied
				if err := p.Signal(syscall.SIGCONT); err != nil {
					b.Fatal(err)
				}
				time.Sleep(2 * time.Second) // watch window after the stall
				if c.ac.answeredByOther(c.macs[c.owner], start, time.Now()) {
					moved++
				}
			}
			row = append(row, fmt.Sprintf("%d/%d", moved, trials))
			b.ReportMetric(float64(moved), fmt.Sprintf("moved-%dms", ms))
		}
		mult := os.Getenv("IRONLB_SUSPICION_MULT")
		if mult == "" {
			mult = "default"
		}
		b.Logf("stalls (ms) %v, suspicion mult %s: VIP moved in %s trials", stallsMS, mult, strings.Join(row, " "))
	}
}

// answeredByOther reports whether any MAC but mac answered between from and to.
func (ac *arpClient) answeredByOther(mac string, from, to time.Time) bool {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	return slices.ContainsFunc(ac.replies, func(r arpSeen) bool {
		return r.mac != mac && !r.at.Before(from) && !r.at.After(to)
	})
}
