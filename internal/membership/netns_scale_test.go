package membership

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/ironlb/ironlb/test/procstat"
)

// The netns scale harness runs ONE MEMBER PER PROCESS, each in its own
// network namespace plugged into one bridge, so a member's failure detector
// gets its own Go scheduler and its own sockets as on separate hosts (the
// in-process BenchmarkFailoverAtScale starves all members at once when its
// one process lacks CPU). Namespaces are named ilbms-*: the switch ilbms-sw
// with bridge ilbmsbr0, member i (1-based) in ilbms-mNNN with eth0 at
// 10.213.x.y and its bridge port ilbms-mNNN in the switch. Nothing is routed
// to or from the root namespace; everything is deleted by name at the end.
const (
	nsmPrefix = "ilbms-"
	nsmSwitch = nsmPrefix + "sw"
	nsmBridge = "ilbmsbr0"
)

func nsmName(i int) string { return fmt.Sprintf("m%03d", i) }

// nsmNS is member i's namespace, and also its bridge port's name in the
// switch (at most 15 characters).
func nsmNS(i int) string { return nsmPrefix + nsmName(i) }

// nsmIP is member i's address: 10.213.0.0/16 leaves room for any size.
func nsmIP(i int) string { return fmt.Sprintf("10.213.%d.%d", i/250, 1+i%250) }

func nsmAddr(i int) string { return nsmIP(i) + ":" + strconv.Itoa(DefaultPort) }

// TestNetnsMemberHelper is one member of BenchmarkNetnsMembership, run as a
// child process inside its namespace: membership.Start with DefaultOptions and
// encryption, on DefaultPort of its eth0 address. It reports on stdout, one
// line each, that it is up, every membership event with its time and the size
// of its member list, and memberlist's failure-detector decisions ("Suspect X
// has failed", "Marking X as failed"). Each line "peers a,b,..." on stdin
// becomes SetPeers, as the speaker's peer list from the speaker Pods does
// (it joins those not yet members, and retries them every RejoinInterval);
// stdin closing or SIGTERM makes it leave gracefully.
func TestNetnsMemberHelper(t *testing.T) {
	name := os.Getenv("IRONLB_NSM_NAME")
	if name == "" {
		t.Skip("child process of BenchmarkNetnsMembership")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var outMu sync.Mutex
	emit := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...) + "\n"
		outMu.Lock()
		defer outMu.Unlock()
		_, _ = io.WriteString(os.Stdout, line)
	}
	logger := funcr.New(func(_, args string) {
		if m := suspectLine.FindStringSubmatch(args); m != nil {
			emit("det %d S %s", time.Now().UnixNano(), m[1])
		}
		if m := failedLine.FindStringSubmatch(args); m != nil {
			emit("det %d F %s", time.Now().UnixNano(), m[1])
		}
	}, funcr.Options{})
	o := DefaultOptions()
	o.NodeName, o.BindAddr, o.SecretKey = name, os.Getenv("IRONLB_NSM_IP"), []byte("netns-scale")
	o.events = newEventRecorder()
	l, err := Start(ctx, logger, o)
	if err != nil {
		t.Fatal(err)
	}
	emit("up %d", time.Now().UnixNano())
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-l.Events():
				emit("ev %d %s %s %d", e.Time.UnixNano(), e.Type, e.Node, len(l.Members()))
			}
		}
	}()
	go func() {
		defer stop() // stdin closed: the benchmark is done with us
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if peers, ok := strings.CutPrefix(sc.Text(), "peers "); ok {
				l.SetPeers(strings.Split(peers, ","))
			}
		}
	}()
	<-ctx.Done()
	<-l.Done()
}

// nsmRecord is something a member reported, with the member's clock (the
// same host clock as the benchmark's).
type nsmRecord struct {
	at       time.Time
	observer string
	kind     string // "join", "leave", "update" (events); "S", "F" (detector)
	node     string // the member the record is about
}

// nsmMember is one running member process.
type nsmMember struct {
	i     int
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when its stdout reader ended
}

// nsmCluster is the running harness for one cluster size.
type nsmCluster struct {
	n       int
	members []*nsmMember // index i-1 is member i

	mu      sync.Mutex
	records []nsmRecord
	up      map[string]bool      // member -> its process reported it is up
	count   map[string]int       // member -> size of its member list
	changed map[string]time.Time // member -> time its list last changed
}

// BenchmarkNetnsMembership measures membership at 50 and 100 members with
// one member per process, each in its own network namespace on a bridge,
// real memberlist UDP/TCP transports, encryption on and DefaultOptions
// timings. Per size it reports:
//
//   - formation: with every process up, from giving the members their peers
//     until every member lists all n. Each gets all addresses at once, as
//     speakers do from their Pod list; with IRONLB_NSM_BATCH=k the members
//     are given peers k at a time (the k new ones all addresses so far, once
//     the previous ones agree), as in a DaemonSet rolled out in steps;
//   - idle false alarms: suspicions raised and members declared dead during
//     IRONLB_NSM_IDLE (default 2m) with nobody killed, the children's CPU
//     and their RSS;
//   - hard kill: per trial (IRONLB_NSM_TRIALS, default 10) a random member's
//     bridge port goes down and its process gets SIGKILL (nothing answers:
//     no RST, no ICMP), and the time until every survivor's member list has
//     dropped it (their leave events) is taken; the member then restarts
//     (same name and address: a rebooted node) and the cluster re-forms.
//     False suspicions and deaths over the trials are those about members
//     that were not down.
//
// Members run with GOMAXPROCS=1 (IRONLB_NSM_GOGC sets their GOGC). Needs root.
//
//	go test ./internal/membership -run '^$' -bench BenchmarkNetnsMembership -benchtime 1x -v -timeout 60m
//
// IRONLB_NSM_MEMBERS sets the sizes (default "50,100"; 2 to 1000).
func BenchmarkNetnsMembership(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for network namespaces (run as root)")
	}
	sizes, err := envSizes("IRONLB_NSM_MEMBERS", []int{50, 100}, 1000)
	if err != nil {
		b.Fatal(err)
	}
	trials := envInt("IRONLB_NSM_TRIALS", 10)
	batch := envInt("IRONLB_NSM_BATCH", 1000)
	idle := 2 * time.Minute
	if v := os.Getenv("IRONLB_NSM_IDLE"); v != "" {
		if idle, err = time.ParseDuration(v); err != nil {
			b.Fatalf("IRONLB_NSM_IDLE=%q: %v", v, err)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			for range b.N {
				nsmRun(b, n, batch, trials, idle)
			}
		})
	}
}

func nsmRun(b *testing.B, n, batch, trials int, idle time.Duration) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	loadStart := loadAverage()
	nsmSetup(b, n)
	b.Cleanup(func() { nsmTeardown(n) })
	c := &nsmCluster{n: n, up: map[string]bool{}, count: map[string]int{}, changed: map[string]time.Time{}}
	b.Cleanup(c.killAll)
	rnd := rand.New(rand.NewSource(int64(n)))

	// Formation: every process up, then the members get their peers (all
	// addresses at once, or batch by batch).
	spawnStart := time.Now()
	for i := 1; i <= n; i++ {
		c.members = append(c.members, c.start(b, i))
	}
	c.waitUp(b, time.Now().Add(2*time.Minute))
	spawned := time.Since(spawnStart)
	start := time.Now()
	var formed time.Duration
	for k := min(batch, n); ; k = min(k+batch, n) {
		c.setPeers(b, k, c.members[k-min(batch, k):k]...)
		formed = c.waitAll(b, k, time.Now().Add(5*time.Minute)).Sub(start)
		if k == n {
			break
		}
	}
	c.setPeers(b, n, c.members...) // the whole Pod list: no-op joins
	progress("%d members: processes up after %v; all list all %d %v after the first got its peers (batches of %d)",
		n, spawned.Round(time.Millisecond), n, formed.Round(time.Millisecond), batch)

	// Idle: nobody dies.
	time.Sleep(5 * time.Second) // peers set: the rejoin of nobody settles
	idleFrom := time.Now()
	cpu0, steal0 := c.cpu(), stealTime()
	time.Sleep(idle)
	steal := stealTime() - steal0
	idleCPU := float64(c.cpu()-cpu0) / float64(time.Since(idleFrom))
	idleTo := time.Now()
	rssSum, rssMax := c.rss()
	ia := c.falseAlarms(idleFrom, idleTo, nil)
	progress("idle %v (load %s at the end, VM steal %v): %d suspicions, %d failure declarations, %d false leave events; declared failed: %s; CPU of all members %.1f%% of a core (%.2f%% each); RSS %d MiB in all, %d MiB max",
		idle, loadAverage(), steal, ia.suspicions, ia.failures, ia.leaves, ia.episodes(), 100*idleCPU, 100*idleCPU/float64(n), rssSum>>20, rssMax>>20)

	// Hard kills.
	var first, last []time.Duration
	var windows []nsmWindow
	trialsFrom := time.Now()
	for k := 0; k < trials; k++ {
		time.Sleep(2*time.Second + time.Duration(rnd.Int63n(int64(100*time.Millisecond))))
		vi := 1 + rnd.Intn(n)
		victim := c.members[vi-1]
		killed := time.Now()
		// Port down first, then the process: a closed socket behind a live
		// link would answer with RST and ICMP, which a dead host does not.
		ipCmd(b, "-n", nsmSwitch, "link", "set", nsmNS(vi), "down")
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		_ = victim.cmd.Wait()
		<-victim.done
		f, l := c.waitLeave(b, victim.name, killed, time.Now().Add(time.Minute))
		first, last = append(first, f), append(last, l)
		progress("trial %d: %s killed; first survivor %v, last %v", k+1, victim.name, f.Round(time.Millisecond), l.Round(time.Millisecond))

		// The node reboots: same name, same address, all peers at once.
		ipCmd(b, "-n", nsmSwitch, "link", "set", nsmNS(vi), "up")
		c.members[vi-1] = c.start(b, vi)
		c.setPeers(b, n, c.members[vi-1])
		back := c.waitAll(b, n, time.Now().Add(3*time.Minute))
		windows = append(windows, nsmWindow{victim.name, killed, back})
	}
	trialsTo := time.Now()
	ta := c.falseAlarms(trialsFrom, trialsTo, windows)
	progress("trials: %d false suspicions, %d failure declarations, %d false leave events; declared failed: %s", ta.suspicions, ta.failures, ta.leaves, ta.episodes())
	slices.Sort(first)
	slices.Sort(last)
	loadEnd := loadAverage()

	lo, hi, k := suspicionBounds(DefaultOptions(), n)
	b.ReportMetric(ms(formed), "formation-ms")
	b.ReportMetric(float64(ia.suspicions), "idle-false-suspicions")
	b.ReportMetric(float64(len(ia.declared)), "idle-false-deaths")
	b.ReportMetric(100*idleCPU/float64(n), "idle-cpu-%-per-member")
	b.ReportMetric(float64(rssSum)/float64(n)/(1<<20), "rss-MiB-per-member")
	if len(last) > 0 {
		b.ReportMetric(ms(pct(last, 50)), "p50-ms")
		b.ReportMetric(ms(last[len(last)-1]), "max-ms")
		b.ReportMetric(ms(pct(first, 50)), "first-p50-ms")
		b.ReportMetric(float64(ta.suspicions), "trial-false-suspicions")
		b.ReportMetric(float64(len(ta.declared)), "trial-false-deaths")
		// The doc's row: members, trials, first p50, last p50 / p90 / max,
		// formation, idle and trial false suspicions / members declared dead.
		b.Logf("| %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %d / %d | %d / %d |", n, len(last),
			ms(pct(first, 50)), ms(pct(last, 50)), ms(pct(last, 90)), ms(last[len(last)-1]), ms(formed),
			ia.suspicions, len(ia.declared), ta.suspicions, len(ta.declared))
	}
	b.Logf("suspicion window at %d members: min %v (with %d confirmations), max %v", n, lo, k, hi)
	b.Logf("load average %s at the start, %s at the end", loadStart, loadEnd)
}

// nsmWindow is a trial: victim was down from killed until every member
// listed it again at back.
type nsmWindow struct {
	victim       string
	killed, back time.Time
}

// nsmAlarms are the failure detector's decisions about members that were
// up.
type nsmAlarms struct {
	suspicions, failures, leaves int
	// declared is when each member declared failed was first declared so
	// (since the start of the period).
	declared map[string]time.Duration
}

// episodes lists the members declared failed in the order it happened,
// e.g. "m012 at 1m3.2s, m040 at 1m3.4s".
func (a nsmAlarms) episodes() string {
	names := slices.SortedFunc(maps.Keys(a.declared), func(x, y string) int { return cmp.Compare(a.declared[x], a.declared[y]) })
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s at %v", n, a.declared[n].Round(100*time.Millisecond)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// falseAlarms counts, among the records between from and to, suspicions
// raised, failure declarations, and leave events about members that were not
// down at that time (windows; a few seconds after a victim's return are
// included, for gossip about it still in flight).
func (c *nsmCluster) falseAlarms(from, to time.Time, windows []nsmWindow) nsmAlarms {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := nsmAlarms{declared: map[string]time.Duration{}}
	for _, r := range c.records {
		if r.at.Before(from) || r.at.After(to) {
			continue
		}
		if slices.ContainsFunc(windows, func(w nsmWindow) bool {
			return w.victim == r.node && !r.at.Before(w.killed) && r.at.Before(w.back.Add(5*time.Second))
		}) {
			continue
		}
		switch r.kind {
		case "S":
			a.suspicions++
		case "F":
			a.failures++
			if _, ok := a.declared[r.node]; !ok {
				a.declared[r.node] = r.at.Sub(from)
			}
		case "leave":
			a.leaves++
		}
	}
	return a
}

// stealTime is the CPU time the hypervisor gave to others while this VM
// wanted to run, summed over its CPUs (/proc/stat).
func stealTime() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	ticks, _ := strconv.ParseInt(f[8], 10, 64)
	return time.Duration(ticks) * 10 * time.Millisecond
}

// start runs member i's process in its namespace.
func (c *nsmCluster) start(b *testing.B, i int) *nsmMember {
	b.Helper()
	m := &nsmMember{i: i, name: nsmName(i), done: make(chan struct{})}
	cmd := exec.Command("ip", "netns", "exec", nsmNS(i), os.Args[0], "-test.run=^TestNetnsMemberHelper$")
	cmd.Env = append(os.Environ(), "IRONLB_NSM_NAME="+m.name, "IRONLB_NSM_IP="+nsmIP(i),
		"GOMAXPROCS=1", "GOGC="+envOr("IRONLB_NSM_GOGC", "100"))
	cmd.Stderr = os.Stderr
	// Members die with the benchmark, even when it is interrupted.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if m.stdin, err = cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", m.name, err)
	}
	m.cmd = cmd
	c.mu.Lock()
	c.count[m.name] = 0
	delete(c.up, m.name)
	c.mu.Unlock()
	go c.read(m, out)
	return m
}

// read records a member's report lines until its stdout closes.
func (c *nsmCluster) read(m *nsmMember, out io.Reader) {
	defer close(m.done)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, ns)
		c.mu.Lock()
		switch {
		case f[0] == "up":
			c.up[m.name] = true
		case f[0] == "ev" && len(f) == 5:
			c.records = append(c.records, nsmRecord{at: at, observer: m.name, kind: f[2], node: f[3]})
			if cnt, err := strconv.Atoi(f[4]); err == nil {
				c.count[m.name], c.changed[m.name] = cnt, at
			}
		case f[0] == "det" && len(f) == 4:
			c.records = append(c.records, nsmRecord{at: at, observer: m.name, kind: f[2], node: f[3]})
		}
		c.mu.Unlock()
	}
}

// waitUp waits until every member process is up.
func (c *nsmCluster) waitUp(b *testing.B, deadline time.Time) {
	b.Helper()
	for {
		c.mu.Lock()
		up := len(c.up)
		c.mu.Unlock()
		if up == c.n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d member processes came up", up, c.n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitAll waits until the first k members (all running) each list exactly
// those k, and returns when the last of them reached that. On timeout it
// fails with what each one sees.
func (c *nsmCluster) waitAll(b *testing.B, k int, deadline time.Time) time.Time {
	b.Helper()
	lastLog := time.Now()
	for {
		c.mu.Lock()
		all, latest := true, time.Time{}
		for _, m := range c.members[:k] {
			if c.count[m.name] != k {
				all = false
				break
			}
			if t := c.changed[m.name]; t.After(latest) {
				latest = t
			}
		}
		c.mu.Unlock()
		if all {
			return latest
		}
		if time.Since(lastLog) >= 15*time.Second {
			lastLog = time.Now()
			progress("waiting for %d members to list %d: %s", k, k, c.countsSummary())
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d members did not all list %d members: %s", k, k, c.countsSummary())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// countsSummary says how many members list how many members, e.g.
// "100 members: 97, 99 members: 3", and how many processes are up.
func (c *nsmCluster) countsSummary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	hist := map[int]int{}
	for _, m := range c.members {
		hist[c.count[m.name]]++
	}
	sizes := slices.Sorted(maps.Keys(hist))
	slices.Reverse(sizes)
	var parts []string
	for _, size := range sizes {
		parts = append(parts, fmt.Sprintf("%d list %d", hist[size], size))
	}
	return fmt.Sprintf("%d processes up; %s", len(c.up), strings.Join(parts, ", "))
}

// waitLeave waits until every member but victim reported victim's leave
// after killed, and returns the time from killed until the first and the
// last of them.
func (c *nsmCluster) waitLeave(b *testing.B, victim string, killed, deadline time.Time) (first, last time.Duration) {
	b.Helper()
	for {
		seen := map[string]time.Duration{}
		c.mu.Lock()
		for _, r := range c.records {
			if r.kind == "leave" && r.node == victim && r.at.After(killed) {
				if _, ok := seen[r.observer]; !ok {
					seen[r.observer] = r.at.Sub(killed)
				}
			}
		}
		c.mu.Unlock()
		if len(seen) >= c.n-1 {
			for _, d := range seen {
				if first == 0 || d < first {
					first = d
				}
				last = max(last, d)
			}
			return first, last
		}
		if time.Now().After(deadline) {
			var missing []string
			for _, m := range c.members {
				if _, ok := seen[m.name]; !ok && m.name != victim {
					missing = append(missing, m.name)
				}
			}
			b.Fatalf("%s killed %v ago; these members still list it: %v", victim, time.Since(killed).Round(time.Millisecond), missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// setPeers gives members the addresses of the first k members as their
// peers.
func (c *nsmCluster) setPeers(b *testing.B, k int, ms ...*nsmMember) {
	b.Helper()
	var addrs []string
	for i := 1; i <= k; i++ {
		addrs = append(addrs, nsmAddr(i))
	}
	line := "peers " + strings.Join(addrs, ",") + "\n"
	for _, m := range ms {
		if _, err := io.WriteString(m.stdin, line); err != nil {
			b.Fatalf("peers to %s: %v", m.name, err)
		}
	}
}

// cpu is the CPU time the running members used so far.
func (c *nsmCluster) cpu() time.Duration {
	var total time.Duration
	for _, m := range c.members {
		if st, err := procstat.Read(m.cmd.Process.Pid); err == nil {
			total += st.CPU()
		}
	}
	return total
}

// rss is the resident memory of the running members: the sum and the
// largest.
func (c *nsmCluster) rss() (sum, largest int64) {
	for _, m := range c.members {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				sum += kb << 10
				largest = max(largest, kb<<10)
			}
		}
	}
	return sum, largest
}

// killAll kills every member process by pid.
func (c *nsmCluster) killAll() {
	for _, m := range c.members {
		if m.cmd.ProcessState == nil {
			_ = m.cmd.Process.Kill()
			_ = m.cmd.Wait()
		}
	}
}

func ipCmd(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// nsmSetup builds the switch and n member namespaces. Each member knows the
// others' MAC addresses from permanent neighbour entries: the kernel's
// neighbour table is one for all namespaces, and 100 members resolving 99
// peers each by ARP overflow its default limit (gc_thresh3, 1024 entries;
// "neighbor table overflow" in dmesg) and lose packets, which separate hosts,
// each with its own table, never do. Permanent entries do not count towards
// the limit. IPv6 is off in the members: memberlist here runs on IPv4.
func nsmSetup(tb testing.TB, n int) {
	tb.Helper()
	nsmTeardown(n)
	ipCmd(tb, "netns", "add", nsmSwitch)
	ipCmd(tb, "-n", nsmSwitch, "link", "add", nsmBridge, "type", "bridge")
	ipCmd(tb, "-n", nsmSwitch, "link", "set", nsmBridge, "up")
	for i := 1; i <= n; i++ {
		ns := nsmNS(i)
		ipCmd(tb, "netns", "add", ns)
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw",
			"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1").CombinedOutput(); err != nil {
			tb.Fatalf("disable IPv6 in %s: %v: %s", ns, err, out)
		}
		ipCmd(tb, "-n", ns, "link", "set", "lo", "up")
		ipCmd(tb, "-n", ns, "link", "add", "eth0", "address", nsmMAC(i), "type", "veth", "peer", "name", ns, "netns", nsmSwitch)
		ipCmd(tb, "-n", ns, "addr", "add", nsmIP(i)+"/16", "dev", "eth0")
		ipCmd(tb, "-n", ns, "link", "set", "eth0", "up")
		ipCmd(tb, "-n", nsmSwitch, "link", "set", ns, "master", nsmBridge, "up")
	}
	batch := filepath.Join(tb.TempDir(), "neigh")
	for i := 1; i <= n; i++ {
		var b strings.Builder
		for j := 1; j <= n; j++ {
			if j != i {
				fmt.Fprintf(&b, "neigh replace %s lladdr %s dev eth0 nud permanent\n", nsmIP(j), nsmMAC(j))
			}
		}
		if err := os.WriteFile(batch, []byte(b.String()), 0o644); err != nil {
			tb.Fatal(err)
		}
		ipCmd(tb, "-n", nsmNS(i), "-batch", batch)
	}
}

// nsmMAC is member i's MAC address (locally administered).
func nsmMAC(i int) string { return fmt.Sprintf("02:00:0a:d5:%02x:%02x", i>>8, i&255) }

// nsmTeardown deletes the namespaces of a cluster of up to n members by name
// (deleting a namespace deletes its veth end and the peer).
func nsmTeardown(n int) {
	for i := 1; i <= n; i++ {
		_ = exec.Command("ip", "netns", "del", nsmNS(i)).Run()
	}
	_ = exec.Command("ip", "netns", "del", nsmSwitch).Run()
}

// progress prints at once what a long benchmark is doing (b.Logf output
// appears only when the benchmark ends).
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
