//go:build linux

package secondchance

// Real-kernel tests: a client, the IP's new owner (NEW, where the Table
// runs) and its previous owner (OLD) in three network namespaces, plugged
// into a bridge in a fourth, as on one L2 segment. The VIPs are on the
// loopback of both NEW and OLD, each running a TCP server that answers
// every line with its own name. Which node the client reaches is set by
// the client's neighbour entry for the VIP, as an announcement would.
// Sockets are opened from a goroutine locked to an OS thread switched into
// a namespace; the Table is driven the same way in NEW.

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

const (
	serverPort = 80
	askTimeout = 2 * time.Second
)

// requireNetns skips a test that needs root, iproute2 and nft when they are
// missing, and fails it in CI (CI=true), where they must be there.
func requireNetns(t testing.TB) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("needs root to create network namespaces, veths and nftables tables (CI runs as root)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("needs the %s command", tool)
		}
	}
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNetns runs fn on an OS thread switched into namespace ns.
func inNetns(t testing.TB, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = orig.Close() }()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
		}
	}()
	fn()
}

// node is one host of the lab.
type node struct {
	name       string // what its server answers
	ns, ifname string
	mac        net.HardwareAddr
	ip4        string // with prefix length
	ip6        string
}

type lab struct {
	client, new, old *node
	table            *Table // in NEW
}

// newLab builds the segment, starts the servers on vips in NEW and OLD and
// opens the Table of NEW's interface. Everything goes at cleanup.
func newLab(t testing.TB, vips ...netip.Addr) *lab {
	t.Helper()
	requireNetns(t)
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	mk := func(name, suffix string, mac string, host int) *node {
		return &node{name: name, ns: "ilb-sc-" + id + "-" + suffix, ifname: "ilbsc" + id + suffix,
			mac: mustMAC(mac), ip4: fmt.Sprintf("10.98.0.%d/24", host), ip6: fmt.Sprintf("fd00:98::%d/64", host)}
	}
	l := &lab{
		client: mk("client", "c", "02:5c:00:00:00:01", 1),
		new:    mk("new", "n", "02:5c:00:00:00:02", 2),
		old:    mk("old", "o", "02:5c:00:00:00:03", 3),
	}
	sw := "ilb-sc-" + id + "-br"
	for _, ns := range []string{sw, l.client.ns, l.new.ns, l.old.ns} {
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "netns", "add", ns)
		// No DAD: IPv6 addresses are usable at once.
		run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", sw, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", sw, "link", "set", "br0", "up")
	for i, n := range []*node{l.client, l.new, l.old} {
		port := fmt.Sprintf("p%d", i)
		run(t, "ip", "link", "add", n.ifname, "netns", n.ns, "address", n.mac.String(), "type", "veth", "peer", "name", port, "netns", sw)
		run(t, "ip", "-n", sw, "link", "set", port, "master", "br0", "up")
		run(t, "ip", "-n", n.ns, "addr", "add", n.ip4, "dev", n.ifname)
		run(t, "ip", "-n", n.ns, "addr", "add", n.ip6, "dev", n.ifname, "nodad")
		run(t, "ip", "-n", n.ns, "link", "set", n.ifname, "up")
	}
	for _, n := range []*node{l.new, l.old} {
		for _, vip := range vips {
			run(t, "ip", "-n", n.ns, "addr", "add", netip.PrefixFrom(vip, vip.BitLen()).String(), "dev", "lo")
			l.serve(t, n, vip)
		}
	}
	inNetns(t, l.new.ns, func() {
		var err error
		if l.table, err = Open(l.new.ifname); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() {
		inNetns(t, l.new.ns, func() {
			if err := l.table.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	})
	// Runs before the namespaces go (cleanups run last-in first-out).
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range [][]string{
				{"ip", "netns", "exec", l.new.ns, "nft", "list", "ruleset"},
				{"ip", "-n", l.client.ns, "neigh"},
			} {
				out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
				t.Logf("%s (%v):\n%s", strings.Join(c, " "), err, out)
			}
		}
	})
	return l
}

// serve runs n's server on vip: it answers every line with n's name.
func (l *lab) serve(t testing.TB, n *node, vip netip.Addr) {
	t.Helper()
	var ln net.Listener
	inNetns(t, n.ns, func() {
		var err error
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(vip, serverPort).String()); err != nil {
			t.Fatal(err)
		}
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintln(c, n.name); err != nil {
						return
					}
				}
			})
		}
	})
}

// neigh points the client's neighbour entry for vip at n, as n's
// announcement would.
func (l *lab) neigh(t testing.TB, vip netip.Addr, n *node) {
	t.Helper()
	run(t, "ip", "-n", l.client.ns, "neigh", "replace", vip.String(), "lladdr", n.mac.String(), "dev", l.client.ifname, "nud", "permanent")
}

// set applies fwds to NEW's table.
func (l *lab) set(t testing.TB, fwds ...Forward) {
	t.Helper()
	inNetns(t, l.new.ns, func() {
		if err := l.table.Set(fwds); err != nil {
			t.Fatal(err)
		}
	})
}

func (l *lab) stats(t testing.TB) Stats {
	t.Helper()
	var st Stats
	inNetns(t, l.new.ns, func() {
		var err error
		if st, err = l.table.Stats(); err != nil {
			t.Fatal(err)
		}
	})
	return st
}

// tables lists NEW's nftables tables with the nft command.
func (l *lab) tables(t *testing.T) string {
	t.Helper()
	return run(t, "ip", "netns", "exec", l.new.ns, "nft", "list", "tables")
}

// conn is a client connection to a VIP.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func (l *lab) dial(t testing.TB, vip netip.Addr) *conn {
	t.Helper()
	var c net.Conn
	inNetns(t, l.client.ns, func() {
		var err error
		if c, err = net.DialTimeout("tcp", netip.AddrPortFrom(vip, serverPort).String(), askTimeout); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = c.Close() })
	return &conn{c: c, r: bufio.NewReader(c)}
}

// ask sends a line and returns the name in the answer.
func (c *conn) ask() (string, error) {
	if err := c.c.SetDeadline(time.Now().Add(askTimeout)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintln(c.c, "who"); err != nil {
		return "", err
	}
	s, err := c.r.ReadString('\n')
	return strings.TrimSpace(s), err
}

// expect asks n times; every answer must come from want.
func (c *conn) expect(t *testing.T, what string, n int, want *node) {
	t.Helper()
	for i := range n {
		got, err := c.ask()
		if err != nil {
			t.Fatalf("%s: round trip %d: %v", what, i+1, err)
		}
		if got != want.name {
			t.Fatalf("%s: round trip %d answered by %q, want %q", what, i+1, got, want.name)
		}
	}
}

// expectBroken asks once: the connection must fail (a reset from NEW, which
// knows nothing of it, or no answer at all).
func (c *conn) expectBroken(t *testing.T, what string) {
	t.Helper()
	if got, err := c.ask(); err == nil {
		t.Fatalf("%s: the connection still works (answered by %q)", what, got)
	} else {
		t.Logf("%s: %v, as expected", what, err)
	}
}

// TestNetnsSecondChance reproduces a planned move: a connection to OLD
// survives the client switching to NEW only while NEW's table forwards it,
// and a connection that starts at NEW stays at NEW.
func TestNetnsSecondChance(t *testing.T) {
	for _, tc := range []struct {
		name       string
		vip, other netip.Addr
	}{
		{"IPv4", netip.MustParseAddr("10.98.0.100"), netip.MustParseAddr("10.98.0.101")},
		{"IPv6", netip.MustParseAddr("fd00:98::100"), netip.MustParseAddr("fd00:98::101")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t, tc.vip)
			vip := tc.vip

			// Control: without forwarding, the move breaks the connection.
			l.neigh(t, vip, l.old)
			ctl := l.dial(t, vip)
			ctl.expect(t, "control connection before the move", 1, l.old)
			l.neigh(t, vip, l.new)
			ctl.expectBroken(t, "control connection after the move, no forwarding")
			if st := l.stats(t); !reflect.DeepEqual(st, Stats{}) {
				t.Errorf("Stats before any Set = %+v, want zero", st)
			}

			// With forwarding.
			l.neigh(t, vip, l.old)
			a := l.dial(t, vip)
			a.expect(t, "connection A before the move", 1, l.old)
			l.set(t, Forward{VIP: vip, OldMAC: l.old.mac})
			l.neigh(t, vip, l.new)
			a.expect(t, "connection A after the move", 3, l.old)
			b := l.dial(t, vip)
			b.expect(t, "connection B, opened after the move", 3, l.new)
			a.expect(t, "connection A after B opened", 1, l.old)

			st := l.stats(t)
			t.Logf("stats: %+v", st)
			if st.ForwardedPackets == 0 || st.ForwardedFlows < 1 || st.LocalFlows < 1 {
				t.Errorf("Stats = %+v, want forwarded packets > 0, forwarded flows >= 1, local flows >= 1", st)
			}
			if len(st.ForwardedByVIP) != 1 || st.ForwardedByVIP[vip] != st.ForwardedFlows {
				t.Errorf("ForwardedByVIP = %v, want all %d forwarded flows on %s", st.ForwardedByVIP, st.ForwardedFlows, vip)
			}

			// Another forward added: the map changes, the local set stays,
			// so B is still served here (were it forgotten, its packets
			// would go to OLD, which would reset it).
			l.set(t, Forward{VIP: vip, OldMAC: l.old.mac}, Forward{VIP: tc.other, OldMAC: l.old.mac})
			b.expect(t, "connection B after the second Set", 3, l.new)
			a.expect(t, "connection A after the second Set", 2, l.old)
			if st2 := l.stats(t); st2.ForwardedPackets <= st.ForwardedPackets || st2.LocalFlows < 1 {
				t.Errorf("Stats after the second Set = %+v (before: %+v): the counter or the local set was lost", st2, st)
			}

			// No forwards: the table goes, and A breaks, which shows the
			// forwarding was what kept it alive.
			l.set(t)
			if tables := l.tables(t); strings.Contains(tables, l.table.nft.Name) {
				t.Fatalf("after Set(nil) NEW still has the table:\n%s", tables)
			}
			if st := l.stats(t); !reflect.DeepEqual(st, Stats{}) {
				t.Errorf("Stats without a table = %+v, want zero", st)
			}
			a.expectBroken(t, "connection A after Set(nil)")
			b.expect(t, "connection B after Set(nil)", 1, l.new)
		})
	}
}

// TestNetnsOpenRemovesLeftover: a restarted process's Open deletes the
// table its predecessor left.
func TestNetnsOpenRemovesLeftover(t *testing.T) {
	vip := netip.MustParseAddr("10.98.0.100")
	l := newLab(t, vip)
	l.set(t, Forward{VIP: vip, OldMAC: l.old.mac})
	if tables := l.tables(t); !strings.Contains(tables, "netdev "+l.table.nft.Name) {
		t.Fatalf("Set did not create the table:\n%s", tables)
	}
	inNetns(t, l.new.ns, func() {
		if _, err := Open(l.new.ifname); err != nil {
			t.Fatal(err)
		}
	})
	if tables := l.tables(t); strings.Contains(tables, l.table.nft.Name) {
		t.Fatalf("Open left the previous table:\n%s", tables)
	}
	// The first Table lost its table: its next Set (the same forwards)
	// notices and creates it again.
	l.set(t, Forward{VIP: vip, OldMAC: l.old.mac})
	if tables := l.tables(t); !strings.Contains(tables, l.table.nft.Name) {
		t.Fatalf("Set did not recreate the deleted table:\n%s", tables)
	}
}

// TestNetnsMACChange: when NEW's interface changes MAC, the next Set
// rewrites the rules' source MAC, the connections keep being forwarded and
// the local set and counters survive.
func TestNetnsMACChange(t *testing.T) {
	vip := netip.MustParseAddr("fd00:98::100")
	l := newLab(t, vip)
	l.neigh(t, vip, l.old)
	a := l.dial(t, vip)
	a.expect(t, "connection A before the move", 1, l.old)
	l.set(t, Forward{VIP: vip, OldMAC: l.old.mac})
	l.neigh(t, vip, l.new)
	b := l.dial(t, vip)
	b.expect(t, "connection B", 1, l.new)
	a.expect(t, "connection A", 1, l.old)
	before := l.stats(t)

	newMAC := mustMAC("02:5c:00:00:00:22")
	run(t, "ip", "-n", l.new.ns, "link", "set", "dev", l.new.ifname, "address", newMAC.String())
	l.new.mac = newMAC
	l.neigh(t, vip, l.new)
	l.set(t, Forward{VIP: vip, OldMAC: l.old.mac})
	ruleset := run(t, "ip", "netns", "exec", l.new.ns, "nft", "list", "ruleset")
	if !strings.Contains(ruleset, newMAC.String()) || strings.Contains(ruleset, "02:5c:00:00:00:02") {
		t.Fatalf("the rules do not use the new MAC %s:\n%s", newMAC, ruleset)
	}
	a.expect(t, "connection A after NEW's MAC changed", 2, l.old)
	b.expect(t, "connection B after NEW's MAC changed", 2, l.new)
	if after := l.stats(t); after.ForwardedPackets <= before.ForwardedPackets || after.LocalFlows < 1 {
		t.Errorf("Stats after the rules were rewritten = %+v (before: %+v)", after, before)
	}
}

// BenchmarkNetnsForwarding: round trips (a line each way) on a connection
// that OLD serves, direct (the client's neighbour entry points at OLD) and
// forwarded by second chance (it points at NEW, whose table sends the
// client's packets on to OLD; OLD answers the client directly). cpu-us/op is
// the whole machine's busy CPU time per round trip (/proc/stat): the
// namespaces share one kernel, whose softirq work no
// process accounting shows, so the difference between the two is what
// forwarding costs.
//
//	sudo go test ./internal/secondchance -run '^$' -bench NetnsForwarding -benchtime 20000x
func BenchmarkNetnsForwarding(b *testing.B) {
	vip := netip.MustParseAddr("10.98.0.100")
	for _, forwarded := range []bool{false, true} {
		name := "direct"
		if forwarded {
			name = "forwarded"
		}
		b.Run(name, func(b *testing.B) {
			l := newLab(b, vip)
			l.neigh(b, vip, l.old)
			c := l.dial(b, vip)
			if forwarded {
				l.set(b, Forward{VIP: vip, OldMAC: l.old.mac})
				l.neigh(b, vip, l.new)
			}
			before := l.stats(b)
			cpu0 := machineCPU(b)
			b.ResetTimer()
			for i := range b.N {
				if got, err := c.ask(); err != nil || got != l.old.name {
					b.Fatalf("round trip %d: %q, %v; want an answer from %s", i+1, got, err, l.old.name)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((machineCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
			if forwarded {
				st := l.stats(b)
				b.ReportMetric(float64(st.ForwardedPackets-before.ForwardedPackets)/float64(b.N), "forwarded-pkts/op")
			}
		})
	}
}

// machineCPU is the CPU time every CPU of the machine spent busy (the
// first line of /proc/stat, in USER_HZ ticks of 10 ms).
func machineCPU(t testing.TB) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		t.Fatalf("/proc/stat starts with %q", line)
	}
	var ticks int64
	// user, nice, system, irq, softirq (not idle, iowait, steal, nor
	// guest and guest_nice, which user and nice include).
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q: field %d: %v", line, i, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
