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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/mdlayher/arp"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// The netns tests and benchmarks build, in network namespaces named ilb-mb-*:
// a switch with two bridges, the clients' segment (ilbmbbr0: three speaker
// nodes 10.201.0.11-13 on eth0 and a client 10.201.0.100) and a separate
// network for memberlist (ilbmbbr1: the nodes' eth1, 10.202.0.11-13), so
// that a node can lose its link to the clients while memberlist still sees
// it. Each node runs this test binary as a child
// process in its namespace (TestNetnsNodeHelper): the real membership
// (memberlist with the default timings, encrypted), the real election and the
// real layer2 announcer on eth0, for one VIP. Only the Kubernetes inputs are
// fixed (one pool, one advertisement, every node eligible), so the numbers
// cover everything but the cache and reconcile path (BenchmarkDecide: tens of
// microseconds per Service).
const (
	mbPrefix   = "ilb-mb-"
	mbBridge   = "ilbmbbr0"
	mbMLBridge = "ilbmbbr1"
	mbVIP      = "10.201.0.200"
	mbClient   = "10.201.0.100"
)

var mbNodes = []string{"n1", "n2", "n3"}

// mbLogDir receives each node helper's log (node.log); dumped on failure.
var mbLogDir = os.TempDir()

func mbNodeIP(i int) string { return fmt.Sprintf("10.201.0.%d", 11+i) }

// mbMLIP is node i's memberlist address, on the separate network.
func mbMLIP(i int) string { return fmt.Sprintf("10.202.0.%d", 11+i) }

// TestNetnsNodeHelper is one speaker node of the netns tests and benchmarks,
// run as a child process inside the node's namespace: the speaker's node
// machinery as Run builds it (newNode: owners, health with the data-path
// prober, claims gossip over encrypted memberlist, the layer2 announcer, and
// its shutdown order) for one VIP whose Service input is fixed: every node
// eligible. Only the Kubernetes API is absent.
// IRONLB_MB_HOLD sets the hold time (default 30s, the command's).
func TestNetnsNodeHelper(t *testing.T) {
	node := os.Getenv("IRONLB_MB_NODE")
	if node == "" {
		t.Skip("child process of the netns failover tests")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := logr.Discard()
	if dir := mbLogDirEnv(); dir != "" {
		f, err := os.OpenFile(dir+"/"+node+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = f.Close() }()
		var mu sync.Mutex
		log = funcr.New(func(prefix, args string) {
			mu.Lock()
			defer mu.Unlock()
			_, _ = fmt.Fprintf(f, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
		}, funcr.Options{Verbosity: 1})
	}
	hold := 30 * time.Second
	if v := os.Getenv("IRONLB_MB_HOLD"); v != "" {
		var err error
		if hold, err = time.ParseDuration(v); err != nil {
			t.Fatalf("IRONLB_MB_HOLD=%q: %v", v, err)
		}
	}
	// The speaker's own node machinery (newNode, as Run builds it), with
	// fixed answers where Run asks the Kubernetes API.
	mo := membership.Options{BindAddr: os.Getenv("IRONLB_MB_IP"), BindPort: membership.DefaultPort, SecretKey: []byte("bench"), RejoinInterval: time.Second}
	// IRONLB_SUSPICION_MULT compares another suspicion window (0: default).
	if v := os.Getenv("IRONLB_SUSPICION_MULT"); v != "" {
		if _, err := fmt.Sscan(v, &mo.SuspicionMult); err != nil {
			t.Fatalf("IRONLB_SUSPICION_MULT=%q: %v", v, err)
		}
	}
	// IRONLB_MB_HEALTH_PORT: the nodes' kube-proxy health endpoints are
	// checked on this port (TestNetnsUnhealthyOwner), healthy after 1 s.
	healthPort := 0
	if v := os.Getenv("IRONLB_MB_HEALTH_PORT"); v != "" {
		var err error
		if healthPort, err = strconv.Atoi(v); err != nil {
			t.Fatalf("IRONLB_MB_HEALTH_PORT=%q: %v", v, err)
		}
	}
	n, err := newNode(log, nodeOptions{
		Name:                node,
		Ownership:           ownership.Options{Hold: hold, RequireUp: healthPort > 0},
		KubeProxyHealthPort: healthPort,
		HealthyAfter:        time.Second,
		ProbeServices:       healthPort > 0,
		Membership:          mo,
		LeaveGrace:          500 * time.Millisecond, // as the command sets it
		Recorder:            nopRecorder{},
		NodeAddrs: func(_ context.Context, name string) []netip.Addr {
			// The Node's InternalIP: its address on the clients' segment.
			return []netip.Addr{netip.MustParseAddr(mbNodeIP(slices.Index(mbNodes, name)))}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// On SIGTERM: the memberlist leave, the leave grace while still
	// answering, then quiet, as in Run.
	defer n.Stop()
	// Run's peer discovery (the speaker Pods' IPs): fixed here.
	n.ml.SetPeers(strings.Split(os.Getenv("IRONLB_MB_PEERS"), ","))
	own := n.own
	vip := netip.MustParseAddr(mbVIP)
	own.SetService("bench/svc", Input{IPs: []netip.Addr{vip}, Pool: "bench", Eligible: mbNodes, Self: true, AllInterfaces: true, TCPPort: mbServicePort},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "svc"}})
	// IRONLB_MB_SERVICES more Services (VIPs from 10.201.1.0 up), spread over the nodes
	// like any new keys: a failover then moves the probed VIP together with the victim's
	// share of them, as a node owning hundreds of Services would.
	if v := os.Getenv("IRONLB_MB_SERVICES"); v != "" {
		count, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("IRONLB_MB_SERVICES=%q: %v", v, err)
		}
		extra := netip.MustParseAddr("10.201.1.0")
		for i := range count {
			name := fmt.Sprintf("svc%d", i)
			own.SetService("bench/"+name, Input{IPs: []netip.Addr{extra}, Pool: "bench", Eligible: mbNodes, Self: true, AllInterfaces: true},
				&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name}})
			extra = extra.Next()
		}
	}
	// As Run's startOwnership, with the inputs above in place of the cache.
	if !n.health.awaitPoll(ctx) {
		return
	}
	own.Sync(time.Now(), nil)
	if err := os.WriteFile(mbLogDirEnv()+"/"+node+".ready", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
}

// mbLogDirEnv is the log directory a node helper was given.
func mbLogDirEnv() string { return os.Getenv("IRONLB_MB_LOGDIR") }

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
	for _, br := range []string{mbBridge, mbMLBridge} {
		mbRun(tb, "ip", "-n", sw, "link", "add", br, "type", "bridge")
		mbRun(tb, "ip", "-n", sw, "link", "set", br, "up")
	}
	attach := func(name, addr string) {
		ns := mbPrefix + name
		mbRun(tb, "ip", "netns", "add", ns)
		mbRun(tb, "ip", "-n", ns, "link", "set", "lo", "up")
		mbRun(tb, "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "ilbmb-"+name, "netns", sw)
		// A /16, so that IRONLB_MB_SERVICES extra VIPs (10.201.1.0 up) are on-link too.
		mbRun(tb, "ip", "-n", ns, "addr", "add", addr+"/16", "dev", "eth0")
		mbRun(tb, "ip", "-n", ns, "link", "set", "eth0", "up")
		mbRun(tb, "ip", "-n", sw, "link", "set", "ilbmb-"+name, "master", mbBridge, "up")
	}
	for i, n := range mbNodes {
		attach(n, mbNodeIP(i))
		ns := mbPrefix + n
		mbRun(tb, "ip", "-n", ns, "link", "add", "eth1", "type", "veth", "peer", "name", "ilbmm-"+n, "netns", sw)
		mbRun(tb, "ip", "-n", ns, "addr", "add", mbMLIP(i)+"/24", "dev", "eth1")
		mbRun(tb, "ip", "-n", ns, "link", "set", "eth1", "up")
		mbRun(tb, "ip", "-n", sw, "link", "set", "ilbmm-"+n, "master", mbMLBridge, "up")
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

// mbStartNode starts the helper for node i inside its namespace, with env
// added to its environment.
func mbStartNode(tb testing.TB, i int, env ...string) *exec.Cmd {
	tb.Helper()
	var peers []string
	for j := range mbNodes {
		if j != i {
			peers = append(peers, mbMLIP(j))
		}
	}
	ready := mbLogDir + "/" + mbNodes[i] + ".ready"
	_ = os.Remove(ready)
	cmd := exec.Command("ip", "netns", "exec", mbPrefix+mbNodes[i], os.Args[0], "-test.run=^TestNetnsNodeHelper$")
	cmd.Env = append(os.Environ(), "IRONLB_MB_NODE="+mbNodes[i], "IRONLB_MB_IP="+mbMLIP(i), "IRONLB_MB_PEERS="+strings.Join(peers, ","),
		"IRONLB_MB_LOGDIR="+mbLogDir)
	cmd.Env = append(cmd.Env, env...)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", mbNodes[i], err)
	}
	// Wait until it has learned the claims and decides: a speaker killed
	// again before that was never back, and its node's hold keeps running.
	end := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return cmd
		}
		if time.Now().After(end) {
			tb.Fatalf("%s did not sync within 60 s (log in %s)", mbNodes[i], mbLogDir)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// TestNetnsOwnership runs three speaker processes (the real ownership stack)
// in three network namespaces and a client asking for the VIP by ARP every
// 20 ms, and checks what the client sees: a speaker crash, restart or freeze
// on a node whose kernel is alive moves nothing (another speaker answers
// with the owner's MAC meanwhile); a hard kill (process and link gone) moves
// the VIP, and the new owner's gratuitous ARP moves a silent client's
// neighbour entry; the old owner's return moves nothing back; losing the
// link (process alive) moves it too. Needs root.
func TestNetnsOwnership(t *testing.T) {
	c := startMBCluster(t)
	c.startProbe(t)
	c.waitStable(t, c.ac)
	macOf := func(n string) string { return c.macs[n] }
	nothingMoves := func(what, owner string, since time.Time, window time.Duration) {
		t.Helper()
		c.nothingMoves(t, what, owner, since, window)
	}
	restart := func(i int) {
		c.procs[i] = mbStartNode(t, i)
	}
	signal := func(i int, sig syscall.Signal) {
		if err := c.procs[i].Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	waitExit := func(i int) {
		_ = c.procs[i].Wait()
		c.procs[i] = nil
	}
	owner, oi := c.owner, c.ownerIdx

	// 1. kill -9 of the owner's speaker, node alive: held, the deputy
	// answers; the restarted speaker resumes; nothing moves.
	start := time.Now()
	signal(oi, syscall.SIGKILL)
	waitExit(oi)
	nothingMoves("speaker of "+owner+" killed", owner, start, 3*time.Second)
	restart(oi)
	nothingMoves("speaker of "+owner+" restarted", owner, time.Now(), 3*time.Second)

	// 2. Graceful stop (a rolling update) and restart.
	start = time.Now()
	signal(oi, syscall.SIGTERM)
	waitExit(oi)
	nothingMoves("speaker of "+owner+" stopped (SIGTERM)", owner, start, 2*time.Second)
	restart(oi)
	nothingMoves("speaker of "+owner+" back after SIGTERM", owner, time.Now(), 3*time.Second)

	// 3. Frozen for 3 s (far past memberlist's detection), then continued.
	start = time.Now()
	signal(oi, syscall.SIGSTOP)
	nothingMoves("speaker of "+owner+" frozen", owner, start, 3*time.Second)
	signal(oi, syscall.SIGCONT)
	nothingMoves("speaker of "+owner+" continued", owner, time.Now(), 2*time.Second)

	// 4. Hard kill: process and link gone. The VIP moves to the hash winner
	// of the others, and its gratuitous ARP moves a silent client's entry.
	next := election.Rank(mbVIP, without(mbNodes, owner))[0]
	c.pointAt(t, owner)
	start = time.Now()
	signal(oi, syscall.SIGKILL)
	mbRun(t, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "down")
	waitExit(oi)
	c.neighIs(t, "after the hard kill of "+owner, macOf(next))
	if at, ok := c.ac.firstFrom(macOf(next), start); ok {
		t.Logf("hard kill of %s: %s answered %v later", owner, next, at.Sub(start).Round(time.Millisecond))
	}

	// 5. The old owner returns: no failback.
	mbRun(t, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "up")
	restart(oi)
	nothingMoves(owner+" returned", next, time.Now(), 4*time.Second)

	// 6. The new owner loses its link to the clients, its speaker and its
	// memberlist network alive: the VIP moves.
	after := election.Rank(mbVIP, without(mbNodes, next))[0]
	c.pointAt(t, next)
	start = time.Now()
	mbRun(t, "ip", "-n", mbPrefix+next, "link", "set", "eth0", "down")
	c.neighIs(t, "after "+next+" lost its link", macOf(after))
	if at, ok := c.ac.firstFrom(macOf(after), start); ok {
		t.Logf("link loss of %s: %s answered %v later", next, after, at.Sub(start).Round(time.Millisecond))
	}

	// 7. Its link returns: nothing moves back, and it does not answer. It
	// learned the move over memberlist while cut off.
	c.linkBack(t, next, after, "eth0")

	// 8. The owner is cut off entirely (both links down, speaker alive): the
	// VIP moves; when it is back, it holds its answers until it has
	// re-synced, and learns there that its stale claim moved.
	final := election.Rank(mbVIP, without(mbNodes, after))[0]
	c.pointAt(t, after)
	for _, l := range []string{"eth0", "eth1"} {
		mbRun(t, "ip", "-n", mbPrefix+after, "link", "set", l, "down")
	}
	c.neighIs(t, "after "+after+" was cut off", macOf(final))
	c.linkBack(t, after, final, "eth1", "eth0")
}

// linkBack sets node's links up again and checks that, after at most a
// bounded overlap (the node answering for the VIP it owned when it was cut
// nothingMoves watches for window after an action: no MAC but owner's
// answers, and answers keep coming (after the speaker died they can only
// come from its deputy, with the owner's MAC).
func (c *mbCluster) nothingMoves(t *testing.T, what, owner string, since time.Time, window time.Duration) {
	t.Helper()
	end := since.Add(window)
	for time.Now().Before(end) {
		if c.ac.answeredByOther(c.macs[owner], since, time.Now()) {
			c.fail(t, "%s: another MAC answered for %s (owner %s, %s)", what, mbVIP, owner, c.macs[owner])
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok := c.ac.firstFrom(c.macs[owner], end.Add(-time.Second)); !ok {
		c.fail(t, "%s: nobody answered for %s in the last second of the window", what, mbVIP)
	}
	if g := c.ac.maxGap(since, end); g > 1500*time.Millisecond {
		c.fail(t, "%s: no answer for %s during %v", what, mbVIP, g)
	}
	t.Logf("%s: only %s (%s) answered for %v; longest gap %v", what, owner, c.macs[owner], window,
		c.ac.maxGap(since, end).Round(time.Millisecond))
}

// partitionHold is the nodes' hold time in TestNetnsPartitions: short, so
// that cuts longer than it fit a unit test.
const partitionHold = 4 * time.Second

// TestNetnsPartitions: partial failures that leave every data path up move
// nothing (issue 25). One node's bad view of the cluster (its cable pulled,
// its memberlist cut off longer than the hold time) must not move IPs it does
// not own, and a cut-off owner whose kernel still answers keeps its IPs: its
// peers hold them and its deputy answers with its MAC. Nothing moves on heal.
func TestNetnsPartitions(t *testing.T) {
	t.Setenv("IRONLB_MB_HOLD", partitionHold.String())
	c := startMBCluster(t)
	c.startProbe(t)
	c.waitStable(t, c.ac)
	owner := c.owner
	var bystander string
	for _, n := range mbNodes {
		if n != owner && n != c.runnerUp {
			bystander = n
		}
	}
	cut := func(node, link string, d time.Duration) {
		mbRun(t, "ip", "-n", mbPrefix+node, "link", "set", link, "down")
		time.Sleep(d) // the fault itself
		mbRun(t, "ip", "-n", mbPrefix+node, "link", "set", link, "up")
	}

	// 1. A cable pull of 2 s on each node that owns nothing: its probes of
	// the owner go unanswered, but it distrusts itself (no carrier) and the
	// owner's other watcher still hears the owner.
	for _, n := range []string{c.runnerUp, bystander} {
		start := time.Now()
		cut(n, "eth0", 2*time.Second)
		c.nothingMoves(t, "cable of "+n+" pulled for 2 s", owner, start, 5*time.Second)
	}

	// 2. A non-owner cut off from memberlist for longer than the hold: it
	// sees nobody, so it has no quorum and places or moves nothing; the
	// others see it gone, and it owns nothing.
	start := time.Now()
	cut(c.runnerUp, "eth1", 3*partitionHold)
	c.nothingMoves(t, "memberlist of "+c.runnerUp+" cut for "+(3*partitionHold).String(), owner, start, 3*partitionHold+5*time.Second)

	// 3. The owner cut off from memberlist for longer than the hold, its
	// kernel answering on the segment: its watchers see its data path up,
	// so its hold does not run out; the deputy answers for it with its MAC.
	start = time.Now()
	cut(owner, "eth1", 3*partitionHold)
	c.nothingMoves(t, "memberlist of the owner "+owner+" cut for "+(3*partitionHold).String(), owner, start, 3*partitionHold+5*time.Second)
}

// off), only owner answers: the node was cut off long enough for its IP to
// move, so it holds every answer until it has re-synced with its peers, and
// then has nothing left to answer for (issue 25: a returning node must not
// send clients back to it, not even for a moment).
func (c *mbCluster) linkBack(t *testing.T, node, owner string, links ...string) {
	t.Helper()
	back := time.Now()
	for _, l := range links {
		mbRun(t, "ip", "-n", mbPrefix+node, "link", "set", l, "up")
	}
	time.Sleep(3 * time.Second) // observation window: nothing may move back
	if last, ok := c.ac.lastFrom(c.macs[node], back); ok {
		c.fail(t, "%s answered for %s %v after its links came back; it owns it no more", node, mbVIP, last.Sub(back).Round(time.Millisecond))
	}
	if c.ac.answeredByOther(c.macs[owner], back, time.Now()) {
		c.fail(t, "%s's links back: another MAC than %s's answered for %s", node, owner, mbVIP)
	}
	if _, ok := c.ac.firstFrom(c.macs[owner], time.Now().Add(-time.Second)); !ok {
		c.fail(t, "%s's links back: nobody answered for %s in the last second", node, mbVIP)
	}
	t.Logf("%s's links back: only %s answered for %s", node, owner, mbVIP)
}

// lastFrom returns the time of the last answer from mac after t.
func (ac *arpClient) lastFrom(mac string, after time.Time) (time.Time, bool) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	for i := len(ac.replies) - 1; i >= 0; i-- {
		if r := ac.replies[i]; r.at.After(after) && r.mac == mac {
			return r.at, true
		}
	}
	return time.Time{}, false
}

func without(s []string, drop string) []string {
	return slices.DeleteFunc(slices.Clone(s), func(x string) bool { return x == drop })
}

// pointAt gives the client the neighbour entry it would have after talking
// to node; from then on only gratuitous ARP changes it (the probe's own
// requests are answered to its packet socket, not to its kernel).
func (c *mbCluster) pointAt(t *testing.T, node string) {
	t.Helper()
	mbRun(t, "ip", "-n", mbPrefix+"c", "neigh", "replace", mbVIP, "lladdr", c.macs[node], "dev", "eth0", "nud", "stale")
}

// neighIs waits until the client's neighbour entry for the VIP is mac.
func (c *mbCluster) neighIs(t *testing.T, what, mac string) {
	t.Helper()
	var last string
	end := time.Now().Add(30 * time.Second)
	start := time.Now()
	for time.Now().Before(end) {
		out, _ := exec.Command("ip", "-n", mbPrefix+"c", "neigh", "show", mbVIP, "dev", "eth0").CombinedOutput()
		if last = strings.TrimSpace(string(out)); strings.Contains(last, "lladdr "+mac) {
			t.Logf("%s: entry moved to %s after %v: %s", what, mac, time.Since(start).Round(time.Millisecond), last)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	table, _ := exec.Command("ip", "-n", mbPrefix+"c", "neigh", "show").CombinedOutput()
	c.fail(t, "%s: the client's neighbour entry for %s is %q, want lladdr %s; client neighbours:\n%s(MACs: %v)",
		what, mbVIP, last, mac, table, c.macs)
}

// fail dumps every node's log, then fails the test.
func (c *mbCluster) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	for _, n := range mbNodes {
		if b, err := os.ReadFile(mbLogDir + "/" + n + ".log"); err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("--- %s log (last 60 lines)\n%s", n, strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	}
	t.Fatalf(format, args...)
}

// mbCluster is the running topology of the netns test and benchmarks: three
// nodes answering for the VIP, and the client's ARP probe when started.
type mbCluster struct {
	procs    []*exec.Cmd
	macs     map[string]string
	ac       *arpClient // nil until startProbe
	owner    string     // the VIP's owner, as waitStable last saw it
	ownerIdx int
	runnerUp string // where the VIP goes if the owner dies: the hash winner of the others
}

// startMBCluster builds the namespaces and starts the three nodes (with env
// added to their environment); all is torn down when tb ends.
func startMBCluster(tb testing.TB, env ...string) *mbCluster {
	c := newMBCluster(tb)
	c.startNodes(tb, env...)
	return c
}

// newMBCluster builds the namespaces, starting no node; all is torn down
// when tb ends.
func newMBCluster(tb testing.TB) *mbCluster {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for network namespaces (runs in CI as root)")
	}
	mbSetup(tb)
	tb.Cleanup(mbTeardown)
	mbLogDir = tb.TempDir()
	c := &mbCluster{macs: map[string]string{}, procs: make([]*exec.Cmd, len(mbNodes))}
	for _, n := range mbNodes {
		c.macs[n] = mbMAC(tb, n)
	}
	tb.Cleanup(func() {
		for _, p := range c.procs {
			if p != nil && p.Process != nil {
				_ = p.Process.Kill()
				_ = p.Wait()
			}
		}
	})
	return c
}

// startNodes starts every node's speaker (with env added to its
// environment) and waits until each decides.
func (c *mbCluster) startNodes(tb testing.TB, env ...string) {
	for i := range mbNodes {
		c.procs[i] = mbStartNode(tb, i, env...)
	}
}

// startProbe starts the client's ARP probe for the rest of tb.
func (c *mbCluster) startProbe(tb testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	c.ac = startARPClient(tb, ctx)
}

// waitStable waits until one node alone has answered ac for a second, and
// makes it c.owner (placement is observed, not predicted: the first speaker
// to start may place the VIP before the others have joined).
func (c *mbCluster) waitStable(tb testing.TB, ac *arpClient) {
	tb.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		for i, n := range mbNodes {
			if ac.onlyFrom(c.macs[n], time.Second) {
				c.owner, c.ownerIdx = n, i
				c.runnerUp = election.Rank(mbVIP, without(mbNodes, n))[0]
				return
			}
		}
		if time.Now().After(end) {
			tb.Fatalf("no single node became the only answerer for %s (MACs %v)", mbVIP, c.macs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkFailoverARP measures, as a client on the segment sees it (an ARP
// request for the VIP every 20 ms; gratuitous ARP counts too):
//   - "node-kill": the owner's speaker is SIGKILLed and its link set down (a
//     dead node). Figures: time from the kill to the first answer from the
//     new owner (the hash winner of the others), the longest time without
//     any answer, and the probes around the event nobody answered within
//     50 ms. The old owner then returns (and takes nothing back).
//   - "speaker-kill" and "speaker-sigterm": only the owner's speaker is
//     stopped (crash, rolling update); its kernel still answers, so the VIP
//     must not move: figures are the longest gap in answers over 3 s (the
//     deputy takes over answering with the owner's MAC) and the number of
//     trials in which another MAC answered (must be 0). The speaker is then
//     restarted.
//
// Needs root (network namespaces); trials: IRONLB_FAILOVER_TRIALS (default 20);
// IRONLB_MB_SERVICES=1500 gives the nodes 1,500 more Services (about 500 per node), so a
// node kill moves hundreds of IPs at once (issue 10).
//
//	go test ./speaker -run '^$' -bench BenchmarkFailoverARP -benchtime 1x -v
//	IRONLB_MB_SERVICES=1500 go test ./speaker -run '^$' -bench 'BenchmarkFailoverARP/node-kill' -benchtime 1x -v
func BenchmarkFailoverARP(b *testing.B) {
	trials := envTrials(b, "IRONLB_FAILOVER_TRIALS", 20)
	c := startMBCluster(b)
	c.startProbe(b)
	ac := c.ac
	pc := func(s []time.Duration, p int) time.Duration { return s[max(0, min(len(s), (p*len(s)+99)/100)-1)] }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

	for _, mode := range []string{"node-kill", "speaker-kill", "speaker-sigterm"} {
		b.Run(mode, func(b *testing.B) {
			var lat, gaps []time.Duration
			lost, moved := 0, 0
			for i := 0; i < b.N; i++ {
				for trial := 0; trial < trials; trial++ {
					c.waitStable(b, ac)
					owner, oi, next := c.owner, c.ownerIdx, c.runnerUp
					start := time.Now()
					switch mode {
					case "node-kill":
						_ = c.procs[oi].Process.Signal(syscall.SIGKILL)
						mbRun(b, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "down")
					case "speaker-kill":
						_ = c.procs[oi].Process.Signal(syscall.SIGKILL)
					default:
						_ = c.procs[oi].Process.Signal(syscall.SIGTERM)
					}
					_ = c.procs[oi].Wait()
					c.procs[oi] = nil
					if mode != "node-kill" {
						time.Sleep(3 * time.Second) // the observation window: nothing may move in it
						end := time.Now()
						gaps = append(gaps, ac.maxGap(start, end))
						if ac.answeredByOther(c.macs[owner], start, end) {
							moved++
						}
						lost += ac.unanswered(start, end.Add(-100*time.Millisecond), 50*time.Millisecond)
						c.procs[oi] = mbStartNode(b, oi)
						continue
					}
					var at time.Time
					end := time.Now().Add(60 * time.Second)
					for {
						if t, ok := ac.firstFrom(c.macs[next], start); ok {
							at = t
							break
						}
						if time.Now().After(end) {
							b.Fatalf("trial %d: %s never answered after %s was killed", trial, next, owner)
						}
						time.Sleep(5 * time.Millisecond)
					}
					lat = append(lat, at.Sub(start))
					gaps = append(gaps, ac.maxGap(start.Add(-100*time.Millisecond), at.Add(100*time.Millisecond)))
					time.Sleep(100 * time.Millisecond) // let the last answers of the window arrive
					lost += ac.unanswered(start.Add(-100*time.Millisecond), at.Add(50*time.Millisecond), 50*time.Millisecond)
					mbRun(b, "ip", "-n", mbPrefix+owner, "link", "set", "eth0", "up")
					c.procs[oi] = mbStartNode(b, oi)
				}
			}
			slices.Sort(lat)
			slices.Sort(gaps)
			b.ReportMetric(ms(pc(gaps, 50)), "gap-p50-ms")
			b.ReportMetric(ms(gaps[len(gaps)-1]), "gap-max-ms")
			b.ReportMetric(float64(lost), "unanswered-probes")
			if mode != "node-kill" {
				b.ReportMetric(float64(moved), "moved")
				b.Logf("| %s, 3 nodes | %d | moved in %d | gap p50 %.0f ms, max %.0f ms | %d unanswered |", mode, len(gaps), moved,
					ms(pc(gaps, 50)), ms(gaps[len(gaps)-1]), lost)
				return
			}
			b.ReportMetric(ms(pc(lat, 50)), "p50-ms")
			b.ReportMetric(ms(pc(lat, 99)), "p99-ms")
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
// two seconds more whether another node answered for the VIP. The node's
// kernel keeps answering, so no stall shorter than the hold time (30 s)
// moves the VIP: memberlist declaring the frozen member dead after ~500 ms
// only makes its deputy answer for it. Trials per duration:
// IRONLB_STALL_TRIALS (default 5); IRONLB_SUSPICION_MULT compares another
// suspicion multiplier. Needs root.
//
//	go test ./speaker -run '^$' -bench BenchmarkStallARP -benchtime 1x -v
func BenchmarkStallARP(b *testing.B) {
	trials := envTrials(b, "IRONLB_STALL_TRIALS", 5)
	c := startMBCluster(b)
	c.startProbe(b)
	stallsMS := []int{200, 500, 1000, 2000, 5000}
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
