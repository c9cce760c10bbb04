package layer2

// The SYN prober: an end-to-end check, from a watcher node, that another node
// (the owner of a LoadBalancer IP) delivers the Service's traffic. See
// SYNProber.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
)

// SYNOutcome is the verdict of one SYN probe.
type SYNOutcome int

// Outcomes of a SYN probe. SYNAnswered and SYNRefused both mean the owner's
// node received the SYN for the VIP.
const (
	SYNAnswered    SYNOutcome = iota // SYN-ACK from VIP:port: delivered to a listener
	SYNRefused                       // RST from VIP:port: delivered, but nothing listens
	SYNTimeout                       // no answer within the timeout: not delivered
	SYNNoInterface                   // the interface is missing or down, or has no address of the VIP's family
	SYNError                         // bad probe, socket or send failure, prober closed; Err says which
	SYNCanceled                      // ctx ended first
)

func (o SYNOutcome) String() string {
	if o < 0 || int(o) >= len(synOutcomeNames) {
		return fmt.Sprintf("SYNOutcome(%d)", int(o))
	}
	return synOutcomeNames[o]
}

var synOutcomeNames = [...]string{"answered", "refused", "timeout", "noInterface", "error", "canceled"}

// SYNProbe is what to probe: the Service at VIP, through the owner at
// OwnerMAC, from this node's Interface.
type SYNProbe struct {
	// Interface is where the SYN leaves and the answer is awaited: the
	// interface this node shares with the owner.
	Interface string
	// OwnerMAC is the owner node's MAC on that segment: the SYN is sent to
	// it whatever this node's neighbour table says for the VIP. It must be
	// another host's: a frame to this node's own MAC leaves on the wire and
	// never reaches this node's own stack.
	OwnerMAC net.HardwareAddr
	// Src is the SYN's source address; the answer must be routed back to it
	// on Interface. Zero: the interface's address of the VIP's family, one
	// whose prefix holds the VIP if there is one.
	Src netip.Addr
	// VIP is the Service's load-balancer IP and port.
	VIP netip.AddrPort
	// Timeout is how long to wait for the answer (default 1 s). One SYN is
	// sent: a lost frame is a timeout, and callers that want more
	// confidence probe again.
	Timeout time.Duration
}

// SYNProbeResult is the verdict of one Probe call.
type SYNProbeResult struct {
	Outcome SYNOutcome
	// Src is the address and port the SYN was sent from (valid once a
	// source was chosen).
	Src netip.AddrPort
	// RTT is the time from sending the SYN to its answer (SYNAnswered,
	// SYNRefused).
	RTT time.Duration
	// Err says why, for SYNError and SYNNoInterface.
	Err error
}

// Why is the outcome for a log line: the outcome, and the error if any.
func (r SYNProbeResult) Why() string {
	if r.Err != nil {
		return r.Outcome.String() + ": " + r.Err.Error()
	}
	return r.Outcome.String()
}

// SYNProberOptions configure a SYNProber. The zero value of every field is a
// sensible default.
type SYNProberOptions struct {
	// LinkMaxAge is how long one lookup of an interface (index, MAC, state,
	// addresses) is reused (default 1 s): looking it up on every probe
	// would cost more than the probe.
	LinkMaxAge time.Duration

	// lookup returns one interface with its addresses; errNoInterface
	// (wrapped) when there is none by that name. Test seam (default:
	// netlink).
	lookup func(name string) (Link, error)
	// listen opens the raw socket probes from src on l are sent and
	// answered on. Test seam (default: AF_PACKET, kernel-filtered to
	// answers to src).
	listen func(l Link, src netip.Addr) (net.PacketConn, error)
}

func (o *SYNProberOptions) defaults() {
	if o.LinkMaxAge <= 0 {
		o.LinkMaxAge = time.Second
	}
	if o.lookup == nil {
		o.lookup = netlinkLink
	}
	if o.listen == nil {
		o.listen = listenSYNReplies
	}
}

// SYNProber checks that another node delivers a LoadBalancer Service's
// traffic. It sends a TCP SYN for VIP:port in an Ethernet frame addressed to
// the owner's MAC, so that the SYN goes through the owner's kube-proxy rules
// (not this node's, and not to whichever MAC this node's neighbour table
// holds for the VIP), from this node's address on the interface and a source
// port in 61000-65535. A SYN-ACK from VIP:port to that address
// and port means delivered; an RST means the owner's node answered but
// nothing listens; no answer within the timeout means not delivered.
//
// On a SYN-ACK the prober at once sends an RST to the owner's MAC, with the
// sequence number the SYN-ACK acknowledges, so that the owner's conntrack
// entry and the backend's half-open connection go away: the backend
// application never sees a connection (the handshake's final ACK is never
// sent, so accept never returns one). This node's own kernel also sees the
// SYN-ACK, for a port it has no socket on, and answers it with an RST of
// its own, routed by its own tables toward the VIP: harmless, and not relied
// on, which is why the prober sends its own.
//
// The source ports are outside Linux's default ephemeral range
// (32768-60999), so they do not collide with this node's own connections,
// and a port is never used by two probes in flight on one socket. Answers are
// matched to probes by (our port, VIP, VIP port) and the acknowledged
// sequence number, so a late answer to an earlier probe that used the same
// port is ignored.
//
// Probe calls may run concurrently. One AF_PACKET socket is opened per
// interface and source address (one per interface and family unless callers
// pass different Src values) on first use and kept until Close; one read
// loop per socket hands answers to the calls waiting. A socket is reopened
// when its interface changes index or MAC, and opening one closes the idle
// sockets of the same interface and family with another source address.
//
// The probe sees only answers arriving on Interface: an owner that routes
// its answer out another way is reported as a timeout.
type SYNProber struct {
	log  logr.Logger
	opts SYNProberOptions

	mu     sync.Mutex
	closed bool
	links  map[string]synLink // by interface name
	socks  map[synSockKey]*synSocket
}

// synLink is one cached interface lookup; err is cached as well, so a
// missing interface is not looked up on every probe either.
type synLink struct {
	link Link
	err  error
	at   time.Time
}

type synSockKey struct {
	iface string
	src   netip.Addr
}

// synSocket is the socket probes from src on one interface use, with the
// probes in flight on it.
type synSocket struct {
	log    logr.Logger
	link   Link // as when opened
	mac    [6]byte
	src    netip.Addr
	conn   net.PacketConn
	closed atomic.Bool
	done   chan struct{} // closed by close
	err    error         // why it was closed; set before done is closed
	wg     sync.WaitGroup

	mu      sync.Mutex
	waiters map[uint16]*synWaiter // by our source port: one per probe in flight
}

// synWaiter is one probe in flight. Fields other than ch are written before
// it is registered and only read afterwards.
type synWaiter struct {
	port  uint16 // our source port
	vip   netip.AddrPort
	isn   uint32 // our initial sequence number
	owner [6]byte
	ch    chan synAnswer // capacity 1: the first answer only
	frame [tcpFrameMax]byte
	dst   packet.Addr
}

type synAnswer struct {
	refused bool
	at      time.Time
}

// Source ports: above Linux's default ip_local_port_range (32768-60999).
const (
	synPortMin   = 61000
	synPortMax   = 65535
	synPortCount = synPortMax - synPortMin + 1
)

var (
	errSYNProberClosed = errors.New("SYN prober closed")
	errNoInterface     = errors.New("no such interface")
)

// NewSYNProber returns a SYNProber; no socket is opened before the first
// Probe.
func NewSYNProber(log logr.Logger, opts SYNProberOptions) *SYNProber {
	opts.defaults()
	return &SYNProber{log: log, opts: opts, links: map[string]synLink{}, socks: map[synSockKey]*synSocket{}}
}

// Probe sends one SYN as described by pr and waits for its answer, at most
// pr.Timeout or until ctx ends.
func (p *SYNProber) Probe(ctx context.Context, pr SYNProbe) SYNProbeResult {
	var res SYNProbeResult
	vip := netip.AddrPortFrom(pr.VIP.Addr().Unmap().WithZone(""), pr.VIP.Port())
	src := pr.Src.Unmap().WithZone("")
	switch {
	case !vip.Addr().IsValid() || vip.Port() == 0:
		res.Err = fmt.Errorf("SYN probe: invalid VIP %s", pr.VIP)
	case len(pr.OwnerMAC) != 6:
		res.Err = fmt.Errorf("SYN probe of %s: owner MAC %q is not a 6-byte Ethernet address", vip, pr.OwnerMAC)
	case pr.Interface == "":
		res.Err = fmt.Errorf("SYN probe of %s: no interface", vip)
	case src.IsValid() && src.Is4() != vip.Addr().Is4():
		res.Err = fmt.Errorf("SYN probe of %s: source %s is of another family", vip, src)
	}
	if res.Err != nil {
		res.Outcome = SYNError
		return res
	}
	if ctx.Err() != nil {
		res.Outcome = SYNCanceled
		return res
	}
	timeout := pr.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	w := &synWaiter{vip: vip, isn: rand.Uint32(), owner: [6]byte(pr.OwnerMAC), ch: make(chan synAnswer, 1)}
	w.dst.HardwareAddr = w.owner[:]
	s, outcome, err := p.register(pr.Interface, src, w)
	if err != nil {
		res.Outcome, res.Err = outcome, err
		return res
	}
	defer s.unregister(w)
	res.Src = netip.AddrPortFrom(s.src, w.port)

	frame := writeTCP(w.frame[:], &tcpSegment{
		ethDst: w.owner, ethSrc: s.mac, src: res.Src, dst: vip,
		seq: w.isn, flags: tcpSYN, window: synWindow, mss: synMSS(vip.Addr()), ipID: uint16(rand.Uint32()),
	})
	start := time.Now()
	if _, err := s.conn.WriteTo(frame, &w.dst); err != nil {
		res.Outcome, res.Err = SYNError, fmt.Errorf("sending SYN for %s on %s: %w", vip, pr.Interface, err)
		return res
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case a := <-w.ch:
		res.Outcome, res.RTT = SYNAnswered, a.at.Sub(start)
		if a.refused {
			res.Outcome = SYNRefused
		}
	case <-timer.C:
		res.Outcome = SYNTimeout
	case <-ctx.Done():
		res.Outcome = SYNCanceled
	case <-s.done:
		res.Outcome, res.Err = SYNError, s.err
	}
	return res
}

// Close closes every socket and waits for the read loops. Probe calls in
// flight return SYNError; later ones too.
func (p *SYNProber) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for k, s := range p.socks {
		s.close(errSYNProberClosed)
		delete(p.socks, k)
	}
	return nil
}

// register finds (or opens) the socket for probes from src (zero: the
// interface's own address) on iface and registers w on it with a free
// source port. Registration happens under p.mu, so a socket found here is not
// closed as idle before w is on it.
func (p *SYNProber) register(iface string, src netip.Addr, w *synWaiter) (*synSocket, SYNOutcome, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, SYNError, errSYNProberClosed
	}
	l, err := p.linkLocked(iface)
	switch {
	case errors.Is(err, errNoInterface):
		return nil, SYNNoInterface, err
	case err != nil:
		return nil, SYNError, err
	case !l.Up:
		return nil, SYNNoInterface, fmt.Errorf("interface %s is down", iface)
	case len(l.MAC) != 6:
		return nil, SYNNoInterface, fmt.Errorf("interface %s has no Ethernet address", iface)
	}
	if !src.IsValid() {
		if src = sourceFor(l.Prefixes, w.vip.Addr()); !src.IsValid() {
			fam := "IPv4"
			if w.vip.Addr().Is6() {
				fam = "IPv6"
			}
			return nil, SYNNoInterface, fmt.Errorf("interface %s has no global %s address to probe %s from", iface, fam, w.vip)
		}
	}
	key := synSockKey{iface, src}
	s := p.socks[key]
	if s != nil && (s.link.Index != l.Index || !slices.Equal(s.link.MAC, l.MAC)) {
		s.close(fmt.Errorf("interface %s changed", iface))
		delete(p.socks, key)
		p.log.V(1).Info("closed SYN probe socket", "interface", iface, "source", src, "reason", "interface changed")
		s = nil
	}
	if s == nil {
		if s, err = p.openLocked(l, src); err != nil {
			return nil, SYNError, err
		}
		p.socks[key] = s
	}
	if err := s.register(w); err != nil {
		return nil, SYNError, err
	}
	return s, SYNAnswered, nil
}

// linkLocked returns iface as looked up at most LinkMaxAge ago.
func (p *SYNProber) linkLocked(iface string) (Link, error) {
	now := time.Now()
	if c, ok := p.links[iface]; ok && now.Sub(c.at) <= p.opts.LinkMaxAge {
		return c.link, c.err
	}
	l, err := p.opts.lookup(iface)
	p.links[iface] = synLink{link: l, err: err, at: now}
	return l, err
}

// openLocked opens the socket for probes from src on l and starts its read
// loop, after closing the idle sockets on l of src's family with another
// source address (the interface's address changed, or a caller's Src did).
func (p *SYNProber) openLocked(l Link, src netip.Addr) (*synSocket, error) {
	for k, s := range p.socks {
		if k.iface == l.Name && k.src.Is4() == src.Is4() && s.idle() {
			s.close(errors.New("SYN probe socket replaced"))
			delete(p.socks, k)
			p.log.V(1).Info("closed SYN probe socket", "interface", k.iface, "source", k.src, "reason", "idle, another source in use")
		}
	}
	c, err := p.opts.listen(l, src)
	if err != nil {
		return nil, fmt.Errorf("opening SYN probe socket on %s for %s: %w", l.Name, src, err)
	}
	s := &synSocket{
		log: p.log.WithValues("interface", l.Name, "source", src), link: l, mac: [6]byte(l.MAC), src: src,
		conn: c, done: make(chan struct{}), waiters: map[uint16]*synWaiter{},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		readFrames(s.log, c, &s.closed, s.handler())
	}()
	p.log.V(1).Info("opened SYN probe socket", "interface", l.Name, "source", src)
	return s, nil
}

// sourceFor returns the address among prefixes (an interface's) to probe vip
// from: the first of vip's family whose prefix holds vip, else the first of
// vip's family; invalid if there is none.
func sourceFor(prefixes []netip.Prefix, vip netip.Addr) netip.Addr {
	var first netip.Addr
	for _, pf := range prefixes {
		a := pf.Addr()
		if a.Is4() != vip.Is4() {
			continue
		}
		if pf.Contains(vip) {
			return a
		}
		if !first.IsValid() {
			first = a
		}
	}
	return first
}

// close closes the socket, wakes the probes in flight on it with err and
// waits for the read loop.
func (s *synSocket) close(err error) {
	if s.closed.Swap(true) {
		return
	}
	s.err = err
	close(s.done)
	_ = s.conn.Close()
	s.wg.Wait()
}

func (s *synSocket) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiters) == 0
}

// register gives w a random source port no probe in flight on s uses.
func (s *synSocket) register(w *synWaiter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiters) >= synPortCount {
		return fmt.Errorf("SYN probe of %s: all %d source ports in use", w.vip, synPortCount)
	}
	i := rand.N(synPortCount)
	for s.waiters[uint16(synPortMin+i)] != nil {
		i = (i + 1) % synPortCount
	}
	w.port = uint16(synPortMin + i)
	s.waiters[w.port] = w
	return nil
}

func (s *synSocket) unregister(w *synWaiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters[w.port] == w {
		delete(s.waiters, w.port)
	}
}

// handler returns the read loop's handler. An answer is a segment from a
// probe's VIP:port to its source address and port with ACK set and
// acknowledging the SYN (ISN+1), and SYN+ACK or RST set; an RST (even with
// SYN) means refused. A SYN-ACK is answered with an RST to the owner's MAC
// before the probe is told, so the RST is on its way when Probe returns.
// Only the RST path allocates (the send's socket address).
func (s *synSocket) handler() func([]byte) {
	var (
		r   synReply
		out [tcpFrameMax]byte
		dst = packet.Addr{HardwareAddr: make(net.HardwareAddr, 6)}
	)
	return func(b []byte) {
		if !parseSYNReply(b, &r) || r.dst.Addr() != s.src || r.flags&tcpACK == 0 {
			return
		}
		refused := r.flags&tcpRST != 0
		if !refused && r.flags&tcpSYN == 0 {
			return
		}
		now := time.Now()
		s.mu.Lock()
		w := s.waiters[r.dst.Port()]
		if w == nil || w.vip != r.src || r.ack != w.isn+1 {
			s.mu.Unlock()
			return
		}
		owner := w.owner
		s.mu.Unlock()
		if !refused {
			frame := writeTCP(out[:], &tcpSegment{
				ethDst: owner, ethSrc: s.mac, src: r.dst, dst: r.src,
				seq: r.ack, flags: tcpRST, ipID: uint16(rand.Uint32()),
			})
			copy(dst.HardwareAddr, owner[:])
			if _, err := s.conn.WriteTo(frame, &dst); err != nil {
				s.log.V(1).Info("sending RST after SYN-ACK failed", "vip", r.src, "port", r.dst.Port(), "error", err.Error())
			}
		}
		select {
		case w.ch <- synAnswer{refused: refused, at: now}:
		default: // already answered (a retransmitted SYN-ACK)
		}
	}
}

// TCP segment layout and the SYN's fixed values.
const (
	etherTypeIPv4 = 0x0800
	ipv4HeaderLen = 20
	protoTCP      = 6
	tcpHeaderLen  = 20
	tcpOptMSSLen  = 4
	// tcpFrameMax is the longest frame writeTCP writes: an IPv6 SYN with
	// the MSS option.
	tcpFrameMax = ethHeaderLen + ipv6HeaderLen + tcpHeaderLen + tcpOptMSSLen

	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10

	synTTL    = 64
	synWindow = 64240
)

// synMSS is the MSS the SYN offers: a 1500-byte MTU less the headers. The
// connection never carries data; the option makes the SYN look like any
// other.
func synMSS(vip netip.Addr) uint16 {
	if vip.Is4() {
		return 1500 - ipv4HeaderLen - tcpHeaderLen
	}
	return 1500 - ipv6HeaderLen - tcpHeaderLen
}

// tcpSegment is one segment writeTCP writes. src and dst are of one family.
type tcpSegment struct {
	ethDst, ethSrc [6]byte
	src, dst       netip.AddrPort
	seq, ack       uint32
	flags          uint8
	window         uint16
	mss            uint16 // 0: no MSS option
	ipID           uint16 // IPv4 identification
}

// writeTCP writes s as an Ethernet frame (IPv4 with DF and TTL 64, or IPv6
// with hop limit 64; no options but MSS) into buf, which must hold
// tcpFrameMax bytes, zero-padded to the 60-byte Ethernet minimum, and
// returns the frame. It does not allocate.
func writeTCP(buf []byte, s *tcpSegment) []byte {
	tcpLen := tcpHeaderLen
	if s.mss != 0 {
		tcpLen += tcpOptMSSLen
	}
	ipLen := ipv6HeaderLen
	if s.src.Addr().Is4() {
		ipLen = ipv4HeaderLen
	}
	n := max(ethHeaderLen+ipLen+tcpLen, minFrameLen)
	b := buf[:n]
	clear(b)
	copy(b[0:6], s.ethDst[:])
	copy(b[6:12], s.ethSrc[:])
	ip := b[ethHeaderLen:]
	tcp := ip[ipLen : ipLen+tcpLen]
	var sum uint64
	if s.src.Addr().Is4() {
		binary.BigEndian.PutUint16(b[12:14], etherTypeIPv4)
		src, dst := s.src.Addr().As4(), s.dst.Addr().As4()
		ip[0] = 4<<4 | ipv4HeaderLen/4
		binary.BigEndian.PutUint16(ip[2:4], uint16(ipLen+tcpLen))
		binary.BigEndian.PutUint16(ip[4:6], s.ipID)
		ip[6] = 0x40 // DF
		ip[8] = synTTL
		ip[9] = protoTCP
		copy(ip[12:16], src[:])
		copy(ip[16:20], dst[:])
		binary.BigEndian.PutUint16(ip[10:12], checksum(sumBytes(0, ip[:ipv4HeaderLen])))
		sum = sumBytes(sumBytes(0, src[:]), dst[:])
	} else {
		binary.BigEndian.PutUint16(b[12:14], etherTypeIPv6)
		src, dst := s.src.Addr().As16(), s.dst.Addr().As16()
		ip[0] = 6 << 4
		binary.BigEndian.PutUint16(ip[4:6], uint16(tcpLen))
		ip[6] = protoTCP
		ip[7] = synTTL
		copy(ip[8:24], src[:])
		copy(ip[24:40], dst[:])
		sum = sumBytes(sumBytes(0, src[:]), dst[:])
	}
	// The rest of the pseudo-header (RFC 793, RFC 8200 8.1): protocol and
	// TCP length, the same ones' complement sum for both families.
	sum += protoTCP + uint64(tcpLen)
	binary.BigEndian.PutUint16(tcp[0:2], s.src.Port())
	binary.BigEndian.PutUint16(tcp[2:4], s.dst.Port())
	binary.BigEndian.PutUint32(tcp[4:8], s.seq)
	binary.BigEndian.PutUint32(tcp[8:12], s.ack)
	tcp[12] = byte(tcpLen/4) << 4
	tcp[13] = s.flags
	binary.BigEndian.PutUint16(tcp[14:16], s.window)
	if s.mss != 0 {
		tcp[20], tcp[21] = 2, 4 // kind MSS, length 4
		binary.BigEndian.PutUint16(tcp[22:24], s.mss)
	}
	binary.BigEndian.PutUint16(tcp[16:18], checksum(sumBytes(sum, tcp)))
	return b
}

// sumBytes adds b, as big-endian 16-bit words (an odd last byte padded with
// zero), to a ones' complement sum kept unfolded (RFC 1071). Frames are far
// too short for the 64-bit sum to overflow.
func sumBytes(sum uint64, b []byte) uint64 {
	for len(b) >= 2 {
		sum += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	return sum
}

// checksum folds a sum to 16 bits and complements it: the value of an
// Internet checksum field.
func checksum(sum uint64) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// synReply is the part of a TCP segment the SYN prober reads.
type synReply struct {
	src, dst netip.AddrPort
	seq, ack uint32
	flags    uint8
}

// parseSYNReply reads an Ethernet frame carrying a TCP segment over IPv4
// (any header length, not a fragment) or IPv6 (TCP directly after the fixed
// header) into r. It returns false for anything else and for frames too
// short for the headers their length fields announce; it never reads past b.
// Checksums are not verified: answers from a veth peer or a local NIC with
// transmit offload arrive with the TCP checksum not yet computed, and a
// corrupted frame that fits a probe's ports, addresses and sequence number
// is vanishingly unlikely.
func parseSYNReply(b []byte, r *synReply) bool {
	if len(b) < ethHeaderLen {
		return false
	}
	ip := b[ethHeaderLen:]
	var tcp []byte
	switch binary.BigEndian.Uint16(b[12:14]) {
	case etherTypeIPv4:
		if len(ip) < ipv4HeaderLen || ip[0]>>4 != 4 || ip[9] != protoTCP {
			return false
		}
		hl, tl := int(ip[0]&0x0f)*4, int(binary.BigEndian.Uint16(ip[2:4]))
		if hl < ipv4HeaderLen || tl < hl+tcpHeaderLen || len(ip) < hl+tcpHeaderLen ||
			binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 { // more fragments, or an offset
			return false
		}
		r.src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), 0)
		r.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), 0)
		tcp = ip[hl:]
	case etherTypeIPv6:
		if len(ip) < ipv6HeaderLen+tcpHeaderLen || ip[0]>>4 != 6 || ip[6] != protoTCP ||
			binary.BigEndian.Uint16(ip[4:6]) < tcpHeaderLen {
			return false
		}
		r.src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])), 0)
		r.dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])), 0)
		tcp = ip[ipv6HeaderLen:]
	default:
		return false
	}
	if tcp[12]>>4 < tcpHeaderLen/4 {
		return false
	}
	r.src = netip.AddrPortFrom(r.src.Addr(), binary.BigEndian.Uint16(tcp[0:2]))
	r.dst = netip.AddrPortFrom(r.dst.Addr(), binary.BigEndian.Uint16(tcp[2:4]))
	r.seq = binary.BigEndian.Uint32(tcp[4:8])
	r.ack = binary.BigEndian.Uint32(tcp[8:12])
	r.flags = tcp[13]
	return true
}

// synReplyFilter accepts only incoming TCP segments to src (over IPv4, not
// fragments; or directly after the IPv6 header) with a destination port in
// the probe range and SYN+ACK or RST set: answers to probes from src. This
// node's own traffic never wakes the read loop, except for the rare segment
// to one of the probe ports. At most 256 bytes of a frame are kept: the
// longest IPv4 and TCP headers and more.
func synReplyFilter(src netip.Addr) ([]bpf.RawInstruction, error) {
	prog := prologue()
	if src.Is4() {
		prog = require(prog, bpf.LoadAbsolute{Off: 12, Size: 2}, etherTypeIPv4)
		prog = require(prog, bpf.LoadAbsolute{Off: ethHeaderLen + 9, Size: 1}, protoTCP)
		prog = append(prog,
			bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 2}, // flags, fragment offset
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x3fff, SkipFalse: 1},
			bpf.RetConstant{Val: 0},
		)
		prog = require(prog, bpf.LoadAbsolute{Off: ethHeaderLen + 16, Size: 4}, v4key(src))
		prog = append(prog, bpf.LoadMemShift{Off: ethHeaderLen}) // X = IPv4 header length
	} else {
		prog = require(prog, bpf.LoadAbsolute{Off: 12, Size: 2}, etherTypeIPv6)
		prog = require(prog, bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 1}, protoTCP)
		a := src.As16()
		for i := 0; i < 16; i += 4 {
			prog = require(prog, bpf.LoadAbsolute{Off: ethHeaderLen + 24 + uint32(i), Size: 4}, binary.BigEndian.Uint32(a[i:]))
		}
		prog = append(prog, bpf.LoadConstant{Dst: bpf.RegX, Val: ipv6HeaderLen})
	}
	prog = append(prog,
		bpf.LoadIndirect{Off: ethHeaderLen + 2, Size: 2}, // TCP destination port
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: synPortMin, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.LoadIndirect{Off: ethHeaderLen + 13, Size: 1}, // TCP flags
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: tcpSYN | tcpACK | tcpRST},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: tcpSYN | tcpACK, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: tcpRST, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 256},
	)
	return assemble("SYN reply", prog)
}

// listenSYNReplies opens the AF_PACKET socket for probes from src on l: the
// EtherType of src's family, kernel-filtered to answers to probes.
func listenSYNReplies(l Link, src netip.Addr) (net.PacketConn, error) {
	et := uint16(etherTypeIPv6)
	if src.Is4() {
		et = etherTypeIPv4
	}
	return listenFiltered(l, et, func() ([]bpf.RawInstruction, error) { return synReplyFilter(src) })
}

// netlinkLink looks up one interface and its global addresses (not
// tentative, not failed DAD), as netlinkLinks does for all of them.
func netlinkLink(name string) (Link, error) {
	nl, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return Link{}, fmt.Errorf("%w: %s", errNoInterface, name)
		}
		return Link{}, fmt.Errorf("looking up interface %s: %w", name, err)
	}
	addrs, err := netlink.AddrList(nl, netlink.FAMILY_ALL)
	if err != nil {
		return Link{}, fmt.Errorf("listing addresses of %s: %w", name, err)
	}
	return linkOf(nl, addrs), nil
}
