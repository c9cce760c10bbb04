package layer2

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/packet"
)

// ProberOptions configure a Prober. The zero value of every field is a
// sensible default.
type ProberOptions struct {
	// Interval separates the probes of one Probe call (default 50 ms).
	Interval time.Duration
	// Attempts is the number of probes per Probe call (default 3); the
	// verdict comes after Attempts*Interval without an answer.
	Attempts int
	// ExcludeInterfaces are interface name patterns never probed on, as for
	// the Announcer. nil means DefaultExcludeInterfaces.
	ExcludeInterfaces []*regexp.Regexp
	// LinksMaxAge is how long one listing of the interfaces is reused
	// (default 1 s): listing them on every Probe call would cost more than
	// the probe.
	LinksMaxAge time.Duration

	// Links lists the node's interfaces (default: netlink). Test seam.
	Links func() ([]Link, error)
	// ListenARP opens the raw Ethernet socket the probes of IPv4 addresses
	// are sent and answered on (default: AF_PACKET, kernel-filtered to
	// answers to probes). Test seam.
	ListenARP func(Link) (net.PacketConn, error)
	// ListenNDP opens the raw Ethernet socket for IPv6 Neighbor
	// Solicitations and Advertisements (default: AF_PACKET,
	// kernel-filtered to advertisements). Test seam.
	ListenNDP func(Link) (net.PacketConn, error)
}

func (o *ProberOptions) defaults() {
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.ExcludeInterfaces == nil {
		o.ExcludeInterfaces, _ = CompileExcludes(DefaultExcludeInterfaces)
	}
	if o.LinksMaxAge <= 0 {
		o.LinksMaxAge = time.Second
	}
	if o.Links == nil {
		o.Links = netlinkLinks
	}
	if o.ListenARP == nil {
		o.ListenARP = listenProbeARP
	}
	if o.ListenNDP == nil {
		o.ListenNDP = listenProbeNDP
	}
}

// ProbeReason says why a ProbeResult is not Reachable.
type ProbeReason int

// Reasons a ProbeResult is not Reachable; ProbeAnswered for one that is.
const (
	ProbeAnswered    ProbeReason = iota
	ProbeNoInterface             // no eligible interface has addr on-link
	ProbeNoAnswer                // every probe went unanswered
	ProbeSendFailed              // no probe could be sent; Err says why
	ProbeCanceled                // ctx ended first
	ProbeClosed                  // the Prober is closed
)

func (r ProbeReason) String() string {
	return [...]string{"answered", "noInterface", "noAnswer", "sendFailed", "canceled", "closed"}[r]
}

// ProbeResult is the verdict of one Probe call.
type ProbeResult struct {
	Addr      netip.Addr
	Reachable bool
	Interface string           // where it answered
	MAC       net.HardwareAddr // the answering MAC
	// RTT is the time from the first probe of the call to the answer.
	RTT time.Duration
	// Reason says why addr is not reachable (ProbeAnswered when it is);
	// Err is the send error of ProbeSendFailed.
	Reason ProbeReason
	Err    error
}

// Why is the reason for a log line: the reason, and the error if any.
func (r ProbeResult) Why() string {
	if r.Err != nil {
		return r.Reason.String() + ": " + r.Err.Error()
	}
	return r.Reason.String()
}

// Prober asks whether a host's kernel still answers for its own address on
// this node's segment: an ARP request in RFC 5227 probe form (sender IP
// 0.0.0.0, so the target's neighbour table is not touched) for IPv4; a
// Neighbor Solicitation from this interface's link-local address for IPv6
// (to the solicited-node group, or unicast to the known MAC). The first
// probe of an address is broadcast/multicast; once a MAC is known for it,
// probes are unicast to that MAC, so a prober watching many nodes does not
// load every host on the segment. A call that goes unanswered forgets the
// MAC, so a host that changed its MAC is found again by the next call.
//
// Probe calls may run concurrently. The sockets of an interface are opened
// on its first probe and kept until Close or until the interface goes away;
// one read loop per socket hands each answer to the calls waiting for the
// address that answered.
type Prober struct {
	log  logr.Logger
	opts ProberOptions

	mu     sync.Mutex
	closed bool
	listed time.Time // when links was listed; zero: never
	links  []Link
	ifaces map[string]*probeIface // by name, with at least one socket open
}

// probeIface is the probing state of one interface.
type probeIface struct {
	log    logr.Logger
	link   Link
	mac    [6]byte
	arp    net.PacketConn // nil until an IPv4 address is probed here; set under Prober.mu
	ndp    net.PacketConn // likewise for IPv6
	closed atomic.Bool
	wg     sync.WaitGroup

	mu      sync.Mutex
	targets map[netip.Addr]*probeTarget

	sendMu sync.Mutex // guards the ARP send buffer and destination
	arpBuf [minFrameLen]byte
	dst    packet.Addr
}

// probeTarget is one address being probed (or whose MAC is known) on one
// interface; guarded by probeIface.mu.
type probeTarget struct {
	mac     [6]byte // learned from an answer, when known
	known   bool
	waiters []*probeWaiter
	ns      [2][]byte // cached solicitations: multicast, and unicast to mac
}

// probeWaiter is one Probe call waiting for an answer, registered on each
// interface it probes on.
type probeWaiter struct{ ch chan probeAnswer }

type probeAnswer struct {
	iface string
	mac   [6]byte
	at    time.Time
}

// NewProber returns a Prober; no socket is opened before the first Probe.
func NewProber(log logr.Logger, opts ProberOptions) *Prober {
	opts.defaults()
	return &Prober{log: log, opts: opts, ifaces: map[string]*probeIface{}}
}

// Probe probes addr on every eligible interface whose on-link prefixes
// contain addr (see Link.Prefixes) and returns when one answers, after
// Attempts probes went unanswered, or when ctx ends. Only an answer from
// addr itself counts: an ARP reply with sender IP addr, or a solicited
// Neighbor Advertisement with target addr.
func (p *Prober) Probe(ctx context.Context, addr netip.Addr) ProbeResult {
	addr = addr.Unmap().WithZone("")
	res := ProbeResult{Addr: addr}
	ifs, err := p.interfacesFor(addr)
	switch {
	case errors.Is(err, errProberClosed):
		res.Reason = ProbeClosed
		return res
	case len(ifs) == 0 && err != nil:
		res.Reason, res.Err = ProbeSendFailed, err
		return res
	case len(ifs) == 0:
		res.Reason = ProbeNoInterface
		return res
	}
	w := &probeWaiter{ch: make(chan probeAnswer, 1)}
	for _, pi := range ifs {
		pi.register(addr, w)
	}
	answered := false
	defer func() {
		for _, pi := range ifs {
			pi.unregister(addr, w, answered)
		}
	}()

	timer := time.NewTimer(p.opts.Interval)
	defer timer.Stop()
	start := time.Now()
	var sendErr error
	sent := false
	for attempt := range p.opts.Attempts {
		for _, pi := range ifs {
			if err := pi.send(addr); err != nil {
				sendErr = err
			} else {
				sent = true
			}
		}
		if attempt > 0 {
			timer.Reset(p.opts.Interval)
		}
		select {
		case a := <-w.ch:
			answered = true
			res.Reachable, res.Interface, res.RTT = true, a.iface, a.at.Sub(start)
			res.MAC = net.HardwareAddr(slices.Clone(a.mac[:]))
			return res
		case <-timer.C:
		case <-ctx.Done():
			res.Reason = ProbeCanceled
			return res
		}
	}
	if !sent && sendErr != nil {
		res.Reason, res.Err = ProbeSendFailed, sendErr
	} else {
		res.Reason = ProbeNoAnswer
	}
	return res
}

// SurveyAnswer is one host answering for an address (Prober.Survey).
type SurveyAnswer struct {
	Interface string
	MAC       net.HardwareAddr
}

// Survey asks the segment who answers for addr: Attempts probes, Interval
// apart, always broadcast (IPv4) or to the solicited-node group (IPv6),
// never unicast to a MAC learned earlier, so that every host that answers is
// heard; then it collects answers for window more. It returns every distinct
// (interface, MAC) that answered. This node's own responder does not answer
// its own probes, so for an address this node announces any answer is
// another host's. ProbeNoInterface, ProbeSendFailed (with the error),
// ProbeCanceled or ProbeClosed say why nothing could be asked.
func (p *Prober) Survey(ctx context.Context, addr netip.Addr, window time.Duration) ([]SurveyAnswer, ProbeReason, error) {
	addr = addr.Unmap().WithZone("")
	ifs, err := p.interfacesFor(addr)
	switch {
	case errors.Is(err, errProberClosed):
		return nil, ProbeClosed, nil
	case len(ifs) == 0 && err != nil:
		return nil, ProbeSendFailed, err
	case len(ifs) == 0:
		return nil, ProbeNoInterface, nil
	}
	w := &probeWaiter{ch: make(chan probeAnswer, maxSurveyAnswers)}
	for _, pi := range ifs {
		pi.register(addr, w)
	}
	defer func() {
		for _, pi := range ifs {
			pi.unregister(addr, w, true) // keep what was learned
		}
	}()
	var out []SurveyAnswer
	collect := func(a probeAnswer) {
		mac := net.HardwareAddr(a.mac[:])
		if !slices.ContainsFunc(out, func(x SurveyAnswer) bool { return x.Interface == a.iface && x.MAC.String() == mac.String() }) {
			out = append(out, SurveyAnswer{Interface: a.iface, MAC: slices.Clone(mac)})
		}
	}
	var sendErr error
	sent := false
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for attempt := 0; ; attempt++ {
		if attempt < p.opts.Attempts {
			for _, pi := range ifs {
				if err := pi.sendTo(addr, true); err != nil {
					sendErr = err
				} else {
					sent = true
				}
			}
			timer.Reset(p.opts.Interval)
		} else if attempt == p.opts.Attempts {
			timer.Reset(window)
		} else {
			break
		}
	wait:
		for {
			select {
			case a := <-w.ch:
				collect(a)
			case <-timer.C:
				break wait
			case <-ctx.Done():
				return out, ProbeCanceled, nil
			}
		}
	}
	if !sent && sendErr != nil {
		return out, ProbeSendFailed, sendErr
	}
	return out, ProbeAnswered, nil
}

// maxSurveyAnswers bounds the answers a survey queues between reads: a
// segment where more hosts answer for one address is broken anyway.
const maxSurveyAnswers = 16

var errProberClosed = errors.New("prober closed")

// interfacesFor returns the interfaces to probe addr on, opening the socket
// of addr's family where it is not open yet. An interface whose socket
// cannot be opened is skipped; the error is returned with the others.
func (p *Prober) interfacesFor(addr netip.Addr) ([]*probeIface, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errProberClosed
	}
	if now := time.Now(); p.listed.IsZero() || now.Sub(p.listed) > p.opts.LinksMaxAge {
		p.relistLocked(now)
	}
	var (
		out  []*probeIface
		errs []error
	)
	for _, l := range p.links {
		if !onLink(l.Prefixes, addr) {
			continue
		}
		wantARP, wantNDP, _ := eligibility(l, p.opts.ExcludeInterfaces)
		if (addr.Is4() && !wantARP) || (addr.Is6() && !wantNDP) {
			continue
		}
		pi := p.ifaces[l.Name]
		if pi == nil {
			pi = &probeIface{
				log: p.log.WithValues("interface", l.Name), link: l, mac: [6]byte(l.MAC),
				targets: map[netip.Addr]*probeTarget{}, dst: packet.Addr{HardwareAddr: make(net.HardwareAddr, 6)},
			}
		}
		if err := p.openLocked(pi, addr.Is4()); err != nil {
			errs = append(errs, err)
			continue
		}
		p.ifaces[l.Name] = pi
		out = append(out, pi)
	}
	return out, errors.Join(errs...)
}

// onLink reports whether addr is in one of prefixes and is not itself one
// of the addresses (this node probing itself).
func onLink(prefixes []netip.Prefix, addr netip.Addr) bool {
	in := false
	for _, pf := range prefixes {
		if pf.Addr() == addr {
			return false
		}
		in = in || pf.Contains(addr)
	}
	return in
}

// relistLocked lists the interfaces and closes the sockets of those gone or
// changed (index, MAC or link-local address). A failed listing keeps the
// previous one until the next LinksMaxAge.
func (p *Prober) relistLocked(now time.Time) {
	p.listed = now
	links, err := p.opts.Links()
	if err != nil {
		p.log.Error(err, "listing interfaces for probing failed; keeping the previous list")
		return
	}
	p.links = links
	for name, pi := range p.ifaces {
		i := slices.IndexFunc(links, func(l Link) bool { return l.Name == name })
		if i >= 0 && links[i].Index == pi.link.Index && slices.Equal(links[i].MAC, pi.link.MAC) && links[i].LinkLocal == pi.link.LinkLocal {
			continue
		}
		pi.close()
		delete(p.ifaces, name)
		p.log.V(1).Info("closed probe sockets", "interface", name, "reason", "interface changed or removed")
	}
}

// openLocked opens pi's socket for IPv4 (v4) or IPv6 if it is not open yet
// and starts its read loop.
func (p *Prober) openLocked(pi *probeIface, v4 bool) error {
	if v4 && pi.arp == nil {
		c, err := p.opts.ListenARP(pi.link)
		if err != nil {
			return fmt.Errorf("opening ARP probe socket on %s: %w", pi.link.Name, err)
		}
		pi.arp = c
		pi.start(c, pi.handleARP())
	}
	if !v4 && pi.ndp == nil {
		c, err := p.opts.ListenNDP(pi.link)
		if err != nil {
			return fmt.Errorf("opening NDP probe socket on %s: %w", pi.link.Name, err)
		}
		pi.ndp = c
		pi.start(c, pi.handleNDP())
	}
	return nil
}

// Close closes every socket and waits for the read loops. Probe calls in
// flight get no more answers; later ones return ProbeClosed.
func (p *Prober) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for name, pi := range p.ifaces {
		pi.close()
		delete(p.ifaces, name)
	}
	return nil
}

func (pi *probeIface) start(c net.PacketConn, handle func([]byte)) {
	pi.wg.Add(1)
	go func() {
		defer pi.wg.Done()
		readFrames(pi.log, c, &pi.closed, handle)
	}()
}

func (pi *probeIface) close() {
	pi.closed.Store(true)
	for _, c := range []net.PacketConn{pi.arp, pi.ndp} {
		if c != nil {
			_ = c.Close()
		}
	}
	pi.wg.Wait()
}

func (pi *probeIface) register(addr netip.Addr, w *probeWaiter) {
	pi.mu.Lock()
	defer pi.mu.Unlock()
	t := pi.targets[addr]
	if t == nil {
		t = &probeTarget{}
		pi.targets[addr] = t
	}
	t.waiters = append(t.waiters, w)
}

// unregister removes w; a call that went unanswered forgets the MAC (see
// Prober), and a target nobody waits for and with no MAC is dropped.
func (pi *probeIface) unregister(addr netip.Addr, w *probeWaiter, answered bool) {
	pi.mu.Lock()
	defer pi.mu.Unlock()
	t := pi.targets[addr]
	if t == nil {
		return
	}
	t.waiters = slices.DeleteFunc(t.waiters, func(x *probeWaiter) bool { return x == w })
	if !answered {
		t.known, t.ns[1] = false, nil
	}
	if len(t.waiters) == 0 && !t.known {
		delete(pi.targets, addr)
	}
}

// send sends one probe for addr: unicast to its MAC when known, else
// broadcast (IPv4) or to its solicited-node group (IPv6).
func (pi *probeIface) send(addr netip.Addr) error { return pi.sendTo(addr, false) }

// sendTo is send; everyone: broadcast or to the group even when a MAC is
// known (Survey).
func (pi *probeIface) sendTo(addr netip.Addr, everyone bool) error {
	pi.mu.Lock()
	t := pi.targets[addr]
	mac, known := t.mac, t.known && !everyone
	var ns []byte
	if addr.Is6() {
		i := 0
		if known {
			i = 1
		}
		if t.ns[i] == nil {
			dstIP, dstMAC := solicitedNodeGroup(addr), multicastMAC(solicitedNodeGroup(addr))
			if known {
				dstIP, dstMAC = addr, mac
			}
			b, err := buildNS(pi.link.MAC, pi.link.LinkLocal, dstIP, dstMAC, addr)
			if err != nil {
				pi.mu.Unlock()
				return err
			}
			t.ns[i] = b
		}
		ns = t.ns[i]
	}
	pi.mu.Unlock()

	if !known {
		mac = broadcastMAC
		if addr.Is6() {
			mac = [6]byte(ns[0:6])
		}
	}
	pi.sendMu.Lock()
	defer pi.sendMu.Unlock()
	copy(pi.dst.HardwareAddr, mac[:])
	var err error
	if addr.Is4() {
		_, err = pi.arp.WriteTo(appendARPProbe(pi.arpBuf[:], pi.mac, mac, v4key(addr)), &pi.dst)
	} else {
		_, err = pi.ndp.WriteTo(ns, &pi.dst)
	}
	if err != nil {
		return fmt.Errorf("sending probe for %s on %s: %w", addr, pi.link.Name, err)
	}
	return nil
}

// handleARP returns the ARP read loop's handler: an answer to a probe is an
// ARP reply with target IP 0.0.0.0 (the probe's sender IP) to our MAC or
// broadcast (RFC 5227 allows either); its sender IP is the address that
// answered.
func (pi *probeIface) handleARP() func([]byte) {
	var f arpFrame
	return func(b []byte) {
		if !parseARP(b, &f) || f.op != arpOpReply || f.tpa != 0 || (f.ethDst != pi.mac && f.ethDst != broadcastMAC) {
			return
		}
		pi.deliver(v4addr(f.spa), f.sha)
	}
}

// handleNDP returns the NDP read loop's handler: an answer is a solicited
// advertisement to our link-local address and MAC; its target is the
// address that answered, its MAC the target link-layer address option, or
// the Ethernet source when the option is left out (as for answers to
// unicast solicitations).
func (pi *probeIface) handleNDP() func([]byte) {
	var f ndpFrame
	ll := pi.link.LinkLocal.As16()
	return func(b []byte) {
		if !parseNDP(b, &f) || f.typ != icmpTypeNA || f.flags&naFlagSolicited == 0 || f.ethDst != pi.mac || f.dst != ll {
			return
		}
		mac := f.ethSrc
		if f.hasLLA {
			mac = f.lla
		}
		pi.deliver(netip.AddrFrom16(f.target), mac)
	}
}

// naFlagSolicited is the S bit of a Neighbor Advertisement's flags.
const naFlagSolicited = 0x40

// deliver hands an answer from addr at mac to every call waiting for addr
// here and remembers mac for unicast probes. It does not allocate.
func (pi *probeIface) deliver(addr netip.Addr, mac [6]byte) {
	now := time.Now()
	pi.mu.Lock()
	defer pi.mu.Unlock()
	t := pi.targets[addr]
	if t == nil {
		return
	}
	if !t.known || t.mac != mac {
		t.mac, t.known, t.ns[1] = mac, true, nil
	}
	for _, w := range t.waiters {
		select {
		case w.ch <- probeAnswer{iface: pi.link.Name, mac: mac, at: now}:
		default: // already answered
		}
	}
}

// listenProbeARP opens the Prober's ARP socket: only answers to probes pass
// the kernel filter.
func listenProbeARP(l Link) (net.PacketConn, error) {
	return listenFiltered(l, etherTypeARP, probeAnswerFilter)
}

// listenProbeNDP opens the Prober's IPv6 socket: only Neighbor
// Advertisements pass the kernel filter. No multicast group is joined:
// answers come unicast.
func listenProbeNDP(l Link) (net.PacketConn, error) {
	return listenFiltered(l, etherTypeIPv6, naFilter)
}
