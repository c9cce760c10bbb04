package membership

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/hashicorp/memberlist"
)

// fabric is the "network" between test members: real UDP/TCP on loopback (each
// member of a cluster on its own 127.0.0.x address, like one host each), plus a
// switch that makes a member vanish the way a crashed host does. A dead
// member's packets are dropped both ways and TCP dials to it hang until their
// timeout, as SYNs to a powered-off host do (no RST, no ICMP).
type fabric struct {
	mu   sync.Mutex
	dead map[string]bool
}

func newFabric() *fabric { return &fabric{dead: map[string]bool{}} }

func (f *fabric) kill(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dead[addr] = true
}

func (f *fabric) revive(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.dead, addr)
}

func (f *fabric) isDead(addrs ...string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range addrs {
		if f.dead[a] {
			return true
		}
	}
	return false
}

// holeTransport wraps memberlist's real NetTransport with the fabric switch.
type holeTransport struct {
	*memberlist.NetTransport
	f         *fabric
	self      string
	in        chan *memberlist.Packet
	stop      chan struct{}
	once      sync.Once
	closing   atomic.Bool
	closingCh chan struct{}
	closeOnce sync.Once
}

// newHoleTransport binds a NetTransport on ip (a loopback address) and a free
// port.
func newHoleTransport(f *fabric, ip string) (*holeTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{ip},
		BindPort:  0,
		Logger:    log.New(io.Discard, "", 0),
	})
	if err != nil {
		return nil, err
	}
	t := &holeTransport{NetTransport: nt, f: f, in: make(chan *memberlist.Packet, 256), stop: make(chan struct{}), closingCh: make(chan struct{})}
	t.self = net.JoinHostPort(ip, strconv.Itoa(nt.GetAutoBindPort()))
	go func() {
		for {
			select {
			case <-t.stop:
				return
			case p := <-nt.PacketCh():
				if t.closing.Load() || f.isDead(t.self, p.From.String()) {
					continue
				}
				select {
				case t.in <- p:
				case <-t.closingCh: // memberlist may have stopped reading
				case <-t.stop:
					return
				}
			}
		}
	}()
	return t, nil
}

// Shutdown keeps draining the NetTransport while it shuts down: its UDP
// reader may be blocked handing us a packet, and NetTransport.Shutdown waits
// for that reader.
func (t *holeTransport) Shutdown() error {
	t.closing.Store(true)
	t.closeOnce.Do(func() { close(t.closingCh) })
	err := t.NetTransport.Shutdown()
	t.once.Do(func() { close(t.stop) })
	return err
}

func (t *holeTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.f.isDead(t.self, addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteTo(b, addr)
}

// WriteToAddress and DialAddressTimeout must be wrapped too: memberlist
// prefers them over WriteTo and DialTimeout when the transport has them.
func (t *holeTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *holeTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

func (t *holeTransport) PacketCh() <-chan *memberlist.Packet { return t.in }

func (t *holeTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.f.isDead(t.self, addr) {
		time.Sleep(timeout)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	}
	return t.NetTransport.DialTimeout(addr, timeout)
}

// member is one running List in a test cluster.
type member struct {
	name   string
	addr   string
	list   *List
	cancel context.CancelFunc
}

// startMember starts a List on a fresh port of 127.0.0.1 behind the fabric.
func startMember(tb testing.TB, f *fabric, name string, opts Options, logger logr.Logger) *member {
	tb.Helper()
	return startMemberAt(tb, f, name, "127.0.0.1", opts, logger)
}

// startMemberAt starts a List on a fresh port of the loopback address ip behind
// the fabric.
func startMemberAt(tb testing.TB, f *fabric, name, ip string, opts Options, logger logr.Logger) *member {
	tb.Helper()
	tr, err := newHoleTransport(f, ip)
	if err != nil {
		tb.Fatalf("transport for %s: %v", name, err)
	}
	opts.NodeName = name
	opts.BindAddr = ip
	opts.BindPort = tr.GetAutoBindPort()
	opts.transport = tr
	opts.events = newEventRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	l, err := Start(ctx, logger, opts)
	if err != nil {
		cancel()
		tb.Fatalf("start %s: %v", name, err)
	}
	return &member{name: name, addr: tr.self, list: l, cancel: cancel}
}

// kill makes the member vanish like a crashed host: no Leave, packets dropped.
func (m *member) kill(f *fabric) {
	f.kill(m.addr)
	m.list.crashed.Store(true)
	_ = m.list.ml.Shutdown()
	m.cancel()
}

// stop leaves gracefully and waits for it.
func (m *member) stop() {
	m.cancel()
	<-m.list.Done()
}

// maxClusterSize: members of one test cluster get 127.0.0.1 to 127.0.0.254.
const maxClusterSize = 254

// loopbackIP is the address of the i-th member (1 to maxClusterSize) of a
// test cluster. Linux routes all of 127.0.0.0/8 to lo, so no setup is needed.
func loopbackIP(i int) string { return fmt.Sprintf("127.0.0.%d", i) }

// startCluster starts n members and gives each the addresses of all as its
// peers, as the speaker does; SetPeers joins them.
func startCluster(tb testing.TB, f *fabric, n int, opts Options, logger logr.Logger) []*member {
	tb.Helper()
	ms := startMembers(tb, f, n, opts, logger)
	addrs := addrsOf(ms)
	for _, m := range ms {
		m.list.SetPeers(addrs)
	}
	return ms
}

// startMembers starts n members named n1..nN, member i on 127.0.0.i, not
// joined to each other.
func startMembers(tb testing.TB, f *fabric, n int, opts Options, logger logr.Logger) []*member {
	tb.Helper()
	if n > maxClusterSize {
		tb.Fatalf("cluster of %d members: test clusters have at most %d (one 127.0.0.x address each)", n, maxClusterSize)
	}
	var ms []*member
	for i := 1; i <= n; i++ {
		ms = append(ms, startMemberAt(tb, f, fmt.Sprintf("n%d", i), loopbackIP(i), opts, logger))
	}
	return ms
}

func addrsOf(ms []*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.addr)
	}
	return out
}

func names(ms []*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.name)
	}
	slices.Sort(out)
	return out
}

// waitMembers polls until every member in ms sees exactly want, or fails with
// what each one sees.
func waitMembers(tb testing.TB, ms []*member, want []string, deadline time.Duration) {
	tb.Helper()
	end := time.Now().Add(deadline)
	for {
		if agree(ms, want) {
			return
		}
		if time.Now().After(end) {
			for _, m := range ms {
				got := m.list.Members()
				tb.Logf("%s sees %d members; missing %v, extra %v", m.name, len(got), minus(want, got), minus(got, want))
			}
			tb.Fatalf("%d members did not converge on %v within %s", len(ms), want, deadline)
		}
		// Members() copies every node: poll big clusters less often, so the
		// polling does not steal the CPU they need to converge.
		time.Sleep(max(10*time.Millisecond, time.Duration(len(ms))*time.Millisecond))
	}
}

// minus returns the names in a that are not in b.
func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// agree tells whether every member in ms sees exactly want.
func agree(ms []*member, want []string) bool {
	for _, m := range ms {
		if !slices.Equal(m.list.Members(), want) {
			return false
		}
	}
	return true
}

// testLogger logs to t only when -v (go test -json, as CI runs it, is -v),
// so memberlist chatter explains failures without drowning passing runs. It
// stops when the test ends: memberlist's goroutines may still log after the
// members shut down, and t.Log after the test completed panics, killing the
// test binary.
func testLogger(tb testing.TB) logr.Logger {
	if !testing.Verbose() {
		return logr.Discard()
	}
	var mu sync.Mutex
	done := false
	tb.Cleanup(func() { // registered first: runs after every member's cleanup
		mu.Lock()
		done = true
		mu.Unlock()
	})
	return funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			tb.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 0})
}

// drain empties a member's event channel, returning what was in it.
func drain(m *member) []Event {
	var out []Event
	for {
		select {
		case e := <-m.list.Events():
			out = append(out, e)
		default:
			return out
		}
	}
}
