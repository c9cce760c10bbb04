//go:build linux

package layer2

// Real-socket tests: an Announcer in one network namespace, a client in
// another, joined by a veth pair. The announcer runs in a child process (this
// test binary re-executed through `ip netns exec`, see TestMain) so that every
// thread, netlink subscription and socket lives in its namespace; the test
// drives it with commands on stdin and reads events on stdout. Client-side
// sockets are opened from a goroutine locked to an OS thread switched into
// the client namespace.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"github.com/mdlayher/packet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/ironlb/ironlb/test/procstat"
)

const helperEnv = "ILB_L2_ANNOUNCER_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(announcerHelper())
	}
	os.Exit(m.Run())
}

// announcerHelper runs an Announcer with real sockets in the current network
// namespace, and a Prober once asked to probe. stdin commands: "set NAME
// IP[,IP...]", "del NAME", "proxy NAME IP[,IP...] IFACE=MAC[,IFACE=MAC...]",
// "unproxy NAME", "handover NAME IP[,IP...]", "probe IP", "ifaces"; stdout: "ok", "ifaces NAME...",
// "probe IP reachable IFACE MAC" or "probe IP unreachable REASON",
// "conflict IP MAC IFACE". It exits on stdin EOF or SIGTERM.
func announcerHelper() int {
	verbose := os.Getenv("ILB_L2_VERBOSE") == "1"
	log := funcr.New(func(prefix, args string) {
		if verbose {
			fmt.Fprintln(os.Stderr, prefix, args)
		}
	}, funcr.Options{})
	opts := Options{NodeName: "helper", Registerer: prometheus.NewRegistry(),
		userSpaceFilterOnly: os.Getenv("ILB_L2_USERSPACE_FILTER_ONLY") == "1"}
	// A short conflict grace keeps the tests quick; the default is 3 s.
	opts.ConflictGrace = 300 * time.Millisecond
	if v := os.Getenv("ILB_L2_GARP_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		opts.GratuitousInterval = d
	}
	a := NewAnnouncer(log, opts)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	go func() {
		for c := range a.Conflicts() {
			say("conflict %s %s %s", c.IP, c.MAC, c.Interface)
		}
	}()
	var prober *Prober
	defer func() {
		if prober != nil {
			_ = prober.Close()
		}
	}()
	ips := func(s string) []netip.Addr {
		var out []netip.Addr
		for _, ip := range strings.Split(s, ",") {
			out = append(out, netip.MustParseAddr(ip))
		}
		return out
	}
	go func() {
		defer cancel()
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 4 && f[0] == "proxy":
				macs := map[string]net.HardwareAddr{}
				for _, kv := range strings.Split(f[3], ",") {
					iface, mac, _ := strings.Cut(kv, "=")
					macs[iface] = mustMAC(mac)
				}
				a.SetProxy(f[1], ips(f[2]), macs)
				say("ok")
			case len(f) == 3 && f[0] == "handover":
				a.SetHandover(f[1], ips(f[2]), nil)
				say("ok")
			case len(f) == 2 && f[0] == "unproxy":
				a.DeleteProxy(f[1])
				say("ok")
			case len(f) == 2 && f[0] == "probe":
				if prober == nil {
					// A wide window: the verdict must not depend on how
					// fast a loaded test machine schedules the target.
					prober = NewProber(log, ProberOptions{Interval: 300 * time.Millisecond})
				}
				r := prober.Probe(ctx, netip.MustParseAddr(f[1]))
				if r.Reachable {
					say("probe %s reachable %s %s", r.Addr, r.Interface, r.MAC)
				} else {
					say("probe %s unreachable %s", r.Addr, r.Reason)
				}
			case len(f) == 3 && f[0] == "set":
				a.SetBalancer(f[1], ips(f[2]), nil)
				say("ok")
			case len(f) == 2 && f[0] == "del":
				a.DeleteBalancer(f[1])
				say("ok")
			case len(f) == 1 && f[0] == "ifaces":
				say("ifaces %s", strings.Join(a.Interfaces(), " "))
			default:
				say("error unknown command %q", sc.Text())
			}
		}
	}()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// lab is two namespaces joined by a veth pair.
type lab struct {
	id               string
	nsA, nsC         string // announcer, client
	ifA, ifC         string
	macA, macC       net.HardwareAddr
	ip4A, ip4C, vip4 netip.Addr
	vip6             netip.Addr
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newLab(t testing.TB) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root to create network namespaces and raw sockets (CI runs as root)")
	}
	for _, tool := range []string{"ip", "bridge"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(t, "needs iproute2's "+tool+" command")
		}
	}
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	l := &lab{
		id:  id,
		nsA: "ilb-l2t-" + id + "-a", nsC: "ilb-l2t-" + id + "-c",
		ifA: "ilbl2" + id + "a", ifC: "ilbl2" + id + "c",
		macA: mustMAC("02:1b:00:00:00:0a"), macC: mustMAC("02:1b:00:00:00:0c"),
		ip4A: netip.MustParseAddr("10.251.0.1"), ip4C: netip.MustParseAddr("10.251.0.2"),
		vip4: netip.MustParseAddr("10.251.0.100"), vip6: netip.MustParseAddr("fd00:251::100"),
	}
	addNetns(t, l.nsA)
	addNetns(t, l.nsC)
	run(t, "ip", "link", "add", l.ifA, "netns", l.nsA, "address", l.macA.String(), "type", "veth",
		"peer", "name", l.ifC, "netns", l.nsC, "address", l.macC.String())
	run(t, "ip", "-n", l.nsA, "addr", "add", l.ip4A.String()+"/24", "dev", l.ifA)
	run(t, "ip", "-n", l.nsC, "addr", "add", l.ip4C.String()+"/24", "dev", l.ifC)
	run(t, "ip", "-n", l.nsA, "addr", "add", "fd00:251::1/64", "dev", l.ifA, "nodad")
	run(t, "ip", "-n", l.nsC, "addr", "add", "fd00:251::2/64", "dev", l.ifC, "nodad")
	run(t, "ip", "-n", l.nsA, "link", "set", l.ifA, "up")
	run(t, "ip", "-n", l.nsC, "link", "set", l.ifC, "up")
	return l
}

// skipOrFail skips a test whose prerequisite is missing, except in CI
// (CI=true), where that is a failure: the tests must run there.
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; CI=true, so this is a failure, not a skip", why)
	}
	t.Skip(why)
}

// addNetns creates namespace ns, deleted at cleanup (which deletes the veth
// ends inside it, and their peers).
func addNetns(t testing.TB, ns string) {
	t.Helper()
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "netns", "add", ns)
	// No DAD: link-local and test addresses are usable at once.
	run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
}

// bridgeHost is a namespace with one interface plugged into a bridge port.
type bridgeHost struct {
	ns, ifname string
	mac        net.HardwareAddr
	addrs      []string // with prefix length
	noIPv6     bool     // IPv6 disabled: the host sends nothing unasked
	port       string   // set by bridge
}

// bridge replaces the lab's veth pair by a bridge in a switch namespace and
// plugs each host in (creating its namespace unless it is the lab's A or
// C). It returns the switch namespace and the bridge's name.
func (l *lab) bridge(t *testing.T, hosts []*bridgeHost) (sw, br string) {
	t.Helper()
	sw, br = "ilb-l2t-"+l.id+"-s", "ilbbr"+l.id
	addNetns(t, sw)
	run(t, "ip", "-n", sw, "link", "add", br, "type", "bridge")
	run(t, "ip", "-n", sw, "link", "set", br, "up")
	run(t, "ip", "-n", l.nsA, "link", "del", l.ifA) // and its peer in C
	for i, h := range hosts {
		if h.ns != l.nsA && h.ns != l.nsC {
			addNetns(t, h.ns)
		}
		if h.noIPv6 {
			run(t, "ip", "netns", "exec", h.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		}
		h.port = fmt.Sprintf("ilbp%s%d", l.id, i)
		run(t, "ip", "link", "add", h.ifname, "netns", h.ns, "address", h.mac.String(), "type", "veth", "peer", "name", h.port, "netns", sw)
		run(t, "ip", "-n", sw, "link", "set", h.port, "master", br)
		run(t, "ip", "-n", sw, "link", "set", h.port, "up")
		for _, a := range h.addrs {
			run(t, "ip", "-n", h.ns, "addr", "add", a, "dev", h.ifname)
		}
		run(t, "ip", "-n", h.ns, "link", "set", h.ifname, "up")
	}
	return sw, br
}

// helper is a running announcer process.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	seen  []string // conflict lines read while waiting for a command's answer
	cpu   func() time.Duration
}

func (l *lab) startAnnouncer(t testing.TB, env ...string) *helper {
	t.Helper()
	return startAnnouncerIn(t, l.nsA, l.ifA, env...)
}

// startAnnouncerIn starts an announcer process in namespace ns and waits
// until it has a responder on ifname.
func startAnnouncerIn(t testing.TB, ns, ifname string, env ...string) *helper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"=1"), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, lines: make(chan string, 100)}
	// `ip netns exec` execs the program: the pid is the announcer's.
	h.cpu = func() time.Duration { return procCPU(t, cmd.Process.Pid) }
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		// Closing stdin cancels the announcer's context: Run must return,
		// which needs every goroutine (netlink watch, GARP loop, read loops)
		// to stop.
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("announcer helper exited with %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Logf("killed announcer helper: %v", <-done)
			t.Errorf("announcer did not stop within 10s of its context ending")
		}
	})
	for {
		if got := h.do(t, "ifaces"); got == "ifaces "+ifname {
			return h
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// do sends a command and returns the next non-conflict line.
func (h *helper) do(t testing.TB, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, cmd); err != nil {
		t.Fatalf("announcer helper: %v", err)
	}
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				t.Fatalf("announcer helper exited")
			}
			if strings.HasPrefix(l, "conflict ") {
				h.seen = append(h.seen, l) // for waitConflict
				continue
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("announcer helper did not answer %q", cmd)
		}
	}
}

// procCPU returns the user+system CPU time of a process.
func procCPU(t testing.TB, pid int) time.Duration {
	st, err := procstat.Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.CPU()
}

// inNetns runs fn on an OS thread switched into namespace ns. Sockets opened
// in fn stay in ns after the thread switches back.
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

// clientConn opens a raw ARP socket on the client's interface.
func (l *lab) clientConn(t testing.TB) *packet.Conn {
	t.Helper()
	return clientConnOn(t, l.nsC, l.ifC)
}

// clientConnOn opens a raw ARP socket on interface ifname in namespace ns.
func clientConnOn(t testing.TB, ns, ifname string) *packet.Conn {
	t.Helper()
	var c *packet.Conn
	inNetns(t, ns, func() {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			t.Fatal(err)
		}
		filter, err := arpFilter()
		if err != nil {
			t.Fatal(err)
		}
		c, err = packet.Listen(ifi, packet.Raw, etherTypeARP, &packet.Config{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// resolve sends one ARP request for ip and returns the replier's MAC and the
// round-trip time, or an error after timeout.
func (l *lab) resolve(c *packet.Conn, req []byte, ip netip.Addr, buf []byte, timeout time.Duration) (net.HardwareAddr, time.Duration, error) {
	start := time.Now()
	if _, err := c.WriteTo(req, &packet.Addr{HardwareAddr: net.HardwareAddr(broadcastMAC[:])}); err != nil {
		return nil, 0, err
	}
	_ = c.SetReadDeadline(start.Add(timeout))
	var f arpFrame
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return nil, 0, err
		}
		// A reply to us, unicast: gratuitous replies (broadcast) from a
		// takeover burst do not count.
		if parseARP(buf[:n], &f) && f.op == arpOpReply && f.spa == v4key(ip) && [6]byte(req[6:12]) == f.ethDst {
			return net.HardwareAddr(f.sha[:]), time.Since(start), nil
		}
	}
}

var macRE = regexp.MustCompile(`(?i)([0-9a-f]{2}:){5}[0-9a-f]{2}`)

func TestNetnsARPAndGratuitous(t *testing.T) {
	l := newLab(t)
	h := l.startAnnouncer(t)

	// A stale neighbour entry on the client pointing elsewhere, as after a
	// failover from another node.
	run(t, "ip", "-n", l.nsC, "neigh", "replace", l.vip4.String(), "lladdr", "02:1b:00:00:00:99", "dev", l.ifC, "nud", "stale")
	run(t, "ip", "-n", l.nsC, "-6", "neigh", "replace", l.vip6.String(), "lladdr", "02:1b:00:00:00:99", "dev", l.ifC, "nud", "stale")

	if got := h.do(t, "set test/vip "+l.vip4.String()+","+l.vip6.String()); got != "ok" {
		t.Fatalf("set: %s", got)
	}

	t.Run("gratuitous ARP updates the client's existing entry", func(t *testing.T) {
		waitNeigh(t, l, "-4", l.vip4, l.macA)
	})
	// The client entries were written just now, so the first advertisement
	// may land inside the kernel's 1 s neighbour locktime and be ignored;
	// the burst's second one, 1.1 s later, is not: the reason for the
	// spacing (ARP gratuitous frames bypass the locktime).
	t.Run("unsolicited NA updates the client's existing entry", func(t *testing.T) {
		waitNeigh(t, l, "-6", l.vip6, l.macA)
	})

	t.Run("ARP request answered with the owner's MAC", func(t *testing.T) {
		if _, err := exec.LookPath("arping"); err == nil {
			out := run(t, "ip", "netns", "exec", l.nsC, "arping", "-r", "-c", "1", "-w", "5", "-I", l.ifC, l.vip4.String())
			if got := macRE.FindString(out); !strings.EqualFold(got, l.macA.String()) {
				t.Errorf("arping got %q (%q), want %s", got, out, l.macA)
			}
		}
		c := l.clientConn(t)
		req, err := arpFrameBytesFor(l.macC, l.ip4C, l.vip4)
		if err != nil {
			t.Fatal(err)
		}
		mac, _, err := l.resolve(c, req, l.vip4, make([]byte, 128), 5*time.Second)
		if err != nil || mac.String() != l.macA.String() {
			t.Fatalf("raw ARP resolve: %v %v, want %s", mac, err, l.macA)
		}
		// The same request tagged for VLAN 100, which the announcer's host
		// does not have: the kernel marks it for another host; no answer.
		tagged := append(append(append([]byte(nil), req[:12]...), 0x81, 0x00, 0x00, 100), req[12:]...)
		if mac, _, err := l.resolve(c, tagged, l.vip4, make([]byte, 128), 300*time.Millisecond); err == nil {
			t.Fatalf("VLAN-tagged request answered by %s", mac)
		}
		// Not owned: no answer (the kernel does not own it either).
		req2, _ := arpFrameBytesFor(l.macC, l.ip4C, netip.MustParseAddr("10.251.0.101"))
		if mac, _, err := l.resolve(c, req2, netip.MustParseAddr("10.251.0.101"), make([]byte, 128), 300*time.Millisecond); err == nil {
			t.Fatalf("unowned IP answered by %s", mac)
		}
	})

	t.Run("NS answered with the owner's MAC", func(t *testing.T) {
		if _, err := exec.LookPath("ndisc6"); err != nil {
			t.Skip("ndisc6 not installed (apt-get install ndisc6)")
		}
		out := run(t, "ip", "netns", "exec", l.nsC, "ndisc6", "-q", "-1", "-r", "5", l.vip6.String(), l.ifC)
		if got := macRE.FindString(out); !strings.EqualFold(got, l.macA.String()) {
			t.Errorf("ndisc6 got %q (%q), want %s", got, out, l.macA)
		}
	})

	t.Run("client kernel resolves the IPv6 VIP (multicast NS, then unicast NUD)", func(t *testing.T) {
		run(t, "ip", "-n", l.nsC, "-6", "neigh", "flush", "dev", l.ifC)
		// A UDP datagram to the VIP makes the client kernel resolve it
		// itself (nothing receives the datagram, which is fine).
		sendUDP(t, l.nsC, l.vip6)
		waitNeigh(t, l, "-6", l.vip6, l.macA)
		// Force a unicast NUD probe: the entry must become REACHABLE again.
		run(t, "ip", "-n", l.nsC, "-6", "neigh", "change", l.vip6.String(), "dev", l.ifC, "nud", "probe")
		waitFor(t, "REACHABLE after a unicast NUD probe", func() bool {
			out, _ := exec.Command("ip", "-n", l.nsC, "-6", "neigh", "show", l.vip6.String(), "dev", l.ifC).CombinedOutput()
			return strings.Contains(string(out), "REACHABLE")
		})
	})

	t.Run("stops answering after delete", func(t *testing.T) {
		if got := h.do(t, "del test/vip"); got != "ok" {
			t.Fatalf("del: %s", got)
		}
		c := l.clientConn(t)
		req, _ := arpFrameBytesFor(l.macC, l.ip4C, l.vip4)
		if mac, _, err := l.resolve(c, req, l.vip4, make([]byte, 128), 500*time.Millisecond); err == nil {
			t.Fatalf("deleted IP still answered by %s", mac)
		}
	})

	t.Run("conflict reported", func(t *testing.T) {
		if got := h.do(t, "set test/vip "+l.vip4.String()); got != "ok" {
			t.Fatalf("set: %s", got)
		}
		c := l.clientConn(t)
		frames, err := gratuitousARP(l.macC, l.vip4)
		if err != nil {
			t.Fatal(err)
		}
		// Another host keeps announcing the IP: right after the takeover
		// that is held back (grace), then re-checked and reported. The
		// client's kernel does not answer the re-check probe (the IP is not
		// its own), so it keeps announcing until the report comes.
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				_, _ = c.WriteTo(frames[1], &packet.Addr{HardwareAddr: net.HardwareAddr(broadcastMAC[:])})
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		waitConflict(t, h, fmt.Sprintf("conflict %s %s %s", l.vip4, l.macC, l.ifA))
	})
}

func TestNetnsInterfaceEvents(t *testing.T) {
	l := newLab(t)
	h := l.startAnnouncer(t)
	ifB, ifD := "ilbl2"+l.id+"b", "ilbl2"+l.id+"d"
	run(t, "ip", "link", "add", ifB, "netns", l.nsA, "type", "veth", "peer", "name", ifD, "netns", l.nsC)
	run(t, "ip", "-n", l.nsA, "link", "set", ifB, "up")
	run(t, "ip", "-n", l.nsC, "link", "set", ifD, "up")
	// The periodic rescan is 30 s; seeing the change well before that means
	// the netlink subscription delivered it.
	want := "ifaces " + strings.Join(sortedStrings(l.ifA, ifB), " ")
	waitIfaces(t, h, want, 10*time.Second)
	run(t, "ip", "-n", l.nsA, "link", "del", ifB)
	waitIfaces(t, h, "ifaces "+l.ifA, 10*time.Second)
}

func sortedStrings(s ...string) []string {
	slices.Sort(s)
	return s
}

func waitIfaces(t *testing.T, h *helper, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var got string
	for time.Now().Before(deadline) {
		if got = h.do(t, "ifaces"); got == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("announcer interfaces %q, want %q within %v", got, want, within)
}

func arpFrameBytesFor(mac net.HardwareAddr, ip, target netip.Addr) ([]byte, error) {
	return arpFrameBytes(1, mac, ip, make(net.HardwareAddr, 6), target, net.HardwareAddr(broadcastMAC[:]))
}

// waitNeigh polls the client's neighbour table until ip maps to mac.
func waitNeigh(t *testing.T, l *lab, family string, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	var last string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.Command("ip", "-n", l.nsC, family, "neigh", "show", ip.String(), "dev", l.ifC).CombinedOutput()
		last = string(out)
		if err == nil && strings.Contains(strings.ToLower(last), mac.String()) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("client neighbour entry for %s is %q, want lladdr %s", ip, strings.TrimSpace(last), mac)
}

func TestNetnsKernelARPFindings(t *testing.T) {
	l := newLab(t)
	// The VIP on another local interface, as kube-proxy IPVS puts it on
	// kube-ipvs0 (a dummy; this kernel has no dummy driver, lo serves).
	dummy := "lo"
	run(t, "ip", "-n", l.nsA, "addr", "add", l.vip4.String()+"/32", "dev", dummy)
	run(t, "ip", "netns", "exec", l.nsA, "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=0", "net.ipv4.conf."+l.ifA+".arp_ignore=0")

	// The model matches the kernel: with arp_ignore=0 the client gets an
	// answer for the VIP from the kernel, with no announcer running.
	c := l.clientConn(t)
	req, _ := arpFrameBytesFor(l.macC, l.ip4C, l.vip4)
	if mac, _, err := l.resolve(c, req, l.vip4, make([]byte, 128), 5*time.Second); err != nil || mac.String() != l.macA.String() {
		t.Fatalf("kernel did not answer for the VIP on lo: %v %v", mac, err)
	}

	a := NewAnnouncer(testr.New(t), Options{})
	var got []KernelARPFinding
	check := func() {
		var err error
		inNetns(t, l.nsA, func() { got, err = a.KernelARPFindings([]netip.Addr{l.vip4, netip.MustParseAddr("10.251.0.77")}) })
		if err != nil {
			t.Fatal(err)
		}
	}
	check()
	if len(got) != 1 || got[0].IP != l.vip4 || len(got[0].AnswersOn) != 1 || got[0].AnswersOn[0] != l.ifA ||
		len(got[0].ConfiguredOn) != 1 || got[0].ConfiguredOn[0] != dummy || !strings.Contains(got[0].Message, "strictARP: true") {
		t.Fatalf("findings %+v, want %s configured on %s answered on %s", got, l.vip4, dummy, l.ifA)
	}

	// What strictARP sets: no finding, and indeed no kernel answer.
	run(t, "ip", "netns", "exec", l.nsA, "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1")
	check()
	if len(got) != 0 {
		t.Fatalf("findings with arp_ignore=1: %+v", got)
	}
	if mac, _, err := l.resolve(c, req, l.vip4, make([]byte, 128), 300*time.Millisecond); err == nil {
		t.Fatalf("kernel still answered (%s) with arp_ignore=1", mac)
	}
}

// TestNetnsHandoverAndSplitBrain runs two announcers and a client on one
// bridge: a handover (old owner deletes, new owner sets) moves the client's
// neighbour entry at once, and both owning the IP (split brain) is reported
// by both.
func TestNetnsHandoverAndSplitBrain(t *testing.T) {
	l := newLab(t)
	hosts, a, b := l.twoAnnouncers(t, 1)
	client := hosts[2]
	vip := l.vip4.String()

	if got := a.do(t, "set svc "+vip); got != "ok" {
		t.Fatalf("a set: %s", got)
	}
	// The client's kernel resolves the VIP itself.
	sendUDP(t, l.nsC, l.vip4)
	waitNeighOn(t, l.nsC, client.ifname, "-4", l.vip4, hosts[0].mac)

	// Handover: the old owner lets go, the new one takes over.
	if got := a.do(t, "del svc"); got != "ok" {
		t.Fatalf("a del: %s", got)
	}
	if got := b.do(t, "set svc "+vip); got != "ok" {
		t.Fatalf("b set: %s", got)
	}
	waitNeighOn(t, l.nsC, client.ifname, "-4", l.vip4, hosts[1].mac)

	// Overlapping handover: a takes the IP back while b still holds it for
	// a moment, as when two speakers see a membership change at slightly
	// different times. Within the grace this is not a conflict.
	if got := a.do(t, "set svc "+vip); got != "ok" {
		t.Fatalf("a set: %s", got)
	}
	if got := b.do(t, "del svc"); got != "ok" {
		t.Fatalf("b del: %s", got)
	}
	waitNeighOn(t, l.nsC, client.ifname, "-4", l.vip4, hosts[0].mac)
	// Absence can only be checked by waiting: the grace (300 ms) and the
	// re-check probe, with a wide margin.
	time.Sleep(2 * time.Second)
	for _, h := range []*helper{a, b} {
		for len(h.lines) > 0 {
			if line := <-h.lines; strings.HasPrefix(line, "conflict ") {
				t.Fatalf("overlapping handover reported: %s", line)
			}
		}
		if len(h.seen) > 0 {
			t.Fatalf("overlapping handover reported: %v", h.seen)
		}
	}
	if got := a.do(t, "del svc"); got != "ok" {
		t.Fatalf("a del: %s", got)
	}
	if got := b.do(t, "set svc "+vip); got != "ok" {
		t.Fatalf("b set: %s", got)
	}

	// Split brain: a claims the IP again while b still holds it.
	if got := a.do(t, "set svc "+vip); got != "ok" {
		t.Fatalf("a set: %s", got)
	}
	waitConflict(t, a, fmt.Sprintf("conflict %s %s %s", vip, hosts[1].mac, hosts[0].ifname))
	waitConflict(t, b, fmt.Sprintf("conflict %s %s %s", vip, hosts[0].mac, hosts[1].ifname))
}

// twoAnnouncers bridges announcers a and b (namespace A and a third one) and
// the client (namespace C), with MACs 02:1b:00:00:<macByte>:0a, 0b, 0c;
// its veth is unused. The announcers send their gratuitous bursts 200 ms
// apart.
func (l *lab) twoAnnouncers(t *testing.T, macByte byte) (hosts []*bridgeHost, a, b *helper) {
	t.Helper()
	mac := func(last byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0x1b, 0, 0, macByte, last} }
	hosts = []*bridgeHost{
		{ns: l.nsA, ifname: "ilbl2" + l.id + "x", mac: mac(0x0a), addrs: []string{"10.251.0.1/24"}},
		{ns: "ilb-l2t-" + l.id + "-b", ifname: "ilbl2" + l.id + "y", mac: mac(0x0b), addrs: []string{"10.251.0.3/24"}},
		{ns: l.nsC, ifname: "ilbl2" + l.id + "z", mac: mac(0x0c), addrs: []string{"10.251.0.2/24"}},
	}
	l.bridge(t, hosts)
	a = startAnnouncerIn(t, hosts[0].ns, hosts[0].ifname, "ILB_L2_GARP_INTERVAL=200ms")
	b = startAnnouncerIn(t, hosts[1].ns, hosts[1].ifname, "ILB_L2_GARP_INTERVAL=200ms")
	return hosts, a, b
}

func waitConflict(t *testing.T, h *helper, want string) {
	t.Helper()
	if slices.Contains(h.seen, want) {
		return
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				t.Fatalf("announcer exited before reporting %q", want)
			}
			if line == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q within 10s", want)
		}
	}
}

// waitNeighOn polls a namespace's neighbour table until ip maps to mac.
func waitNeighOn(t *testing.T, ns, ifname, family string, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	var last string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.Command("ip", "-n", ns, family, "neigh", "show", ip.String(), "dev", ifname).CombinedOutput()
		last = string(out)
		if err == nil && strings.Contains(strings.ToLower(last), mac.String()) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("neighbour entry for %s in %s is %q, want lladdr %s", ip, ns, strings.TrimSpace(last), mac)
}
