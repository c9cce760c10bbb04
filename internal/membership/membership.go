// Package membership tells a speaker which speakers are alive, fast.
//
// It wraps hashicorp/memberlist (SWIM gossip with Lifeguard) behind a small API:
// Start, Join, Members, States, and a graceful Leave when the context ends.
// memberlist itself is a failure detector; the speaker's state (its ownership
// claims) only rides on its push/pull exchanges and broadcasts (Options.State).
// Its timings are ironlb's main failover lever: the defaults in DefaultOptions
// were chosen by the measurements in docs/benchmarks-speaker.md
// (BenchmarkFailover and TestFalsePositivesUnderLoad in this package).
package membership

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/memberlist"
)

// Options configure the memberlist. Zero durations and counts take the
// DefaultOptions value.
type Options struct {
	// NodeName is this member's name: the Kubernetes node name, so that member
	// names and Node objects line up in the election.
	NodeName string
	// BindAddr and BindPort: where to listen (UDP and TCP). Default 0.0.0.0:7946.
	BindAddr string
	BindPort int
	// AdvertiseAddr is the address peers use to reach us (the host IP); empty
	// lets memberlist pick the bind address or a private interface address.
	AdvertiseAddr string
	// SecretKey encrypts and authenticates all memberlist traffic. Any length:
	// it is stretched to an AES-256 key with SecretKeyFromSecret. Peers with
	// another key cannot talk to us and are never members. Empty disables
	// encryption (not recommended; Start logs it).
	SecretKey []byte

	// ProbeInterval: how often each member probes one other member.
	ProbeInterval time.Duration
	// ProbeTimeout: how long to wait for a direct ack before asking others to
	// probe indirectly. Must be well below ProbeInterval.
	ProbeTimeout time.Duration
	// SuspicionMult scales the time a suspect has to refute before it is
	// declared dead: SuspicionMult * max(1, log10(members)) * ProbeInterval.
	SuspicionMult int
	// SuspicionMaxTimeoutMult: the suspicion timer starts at this multiple of
	// the minimum and shrinks towards it as other members confirm the suspicion.
	SuspicionMaxTimeoutMult int
	// IndirectChecks: members asked to probe a member that missed a direct ack.
	IndirectChecks int
	// GossipInterval and GossipNodes: how often, and to how many members,
	// queued messages (suspect, dead, alive) are gossiped.
	GossipInterval time.Duration
	GossipNodes    int
	// RetransmitMult: each message is retransmitted RetransmitMult *
	// ceil(log10(members+1)) times.
	RetransmitMult int
	// PushPullInterval: full state exchange with one random member.
	PushPullInterval time.Duration
	// AwarenessMaxMultiplier bounds how far Lifeguard stretches probe timeouts
	// when this member itself is slow (CPU starved): the false-positive guard.
	AwarenessMaxMultiplier int
	// TCPTimeout bounds TCP fallback probes, joins and push/pull.
	TCPTimeout time.Duration
	// RejoinInterval: how often known peers that are not members are joined
	// again, which heals partitions. Default 5s.
	RejoinInterval time.Duration
	// LeaveTimeout: how long a graceful Leave waits for its broadcast to go out.
	LeaveTimeout time.Duration

	// State, when set, is replicated through memberlist: its LocalState is
	// exchanged in every push/pull (at join and every PushPullInterval) and
	// its messages are broadcast with List.Broadcast. The speaker replicates
	// its ownership claims this way.
	State StateDelegate

	// transport replaces the UDP/TCP transport; tests use it to blackhole a
	// member as a dead host would.
	transport memberlist.Transport
	// Meta is what this member says of itself from the start (SetMeta
	// changes it); it needs State.
	Meta []byte
	// events receives memberlist's join, leave and update callbacks; tests
	// use it to time failure detection (events_test.go). The speaker reads
	// Members and States instead, when it needs them.
	events memberlist.EventDelegate
}

// StateDelegate is the application state replicated over memberlist. Its
// methods are called from memberlist's goroutines and must not block long.
type StateDelegate interface {
	// LocalState is this member's full state, sent to a peer in a push/pull
	// exchange (join is true during a join).
	LocalState(join bool) []byte
	// MergeRemoteState receives a peer's LocalState.
	MergeRemoteState(buf []byte, join bool)
	// NotifyMsg receives a message another member broadcast.
	NotifyMsg(msg []byte)
}

// DefaultPort is memberlist's (and MetalLB's) port.
const DefaultPort = 7946

// DefaultOptions returns the tuned defaults. Failover target: a hard-killed
// member is seen dead by every survivor within p50 <= 1 s, p99 <= 2 s; and no
// live member is declared dead with both cores saturated. See
// docs/benchmarks-speaker.md for the measurements behind each number.
func DefaultOptions() Options {
	return Options{
		BindAddr: "0.0.0.0",
		BindPort: DefaultPort,
		// Measured with BenchmarkFailover (failure detection time) and
		// TestFalsePositivesUnderLoad (no false death with every core
		// saturated); the figures are in docs/benchmarks-speaker.md. The
		// price: a member frozen for more than a few probe rounds is
		// declared dead (speaker BenchmarkStallARP, same document);
		// SuspicionMult moves both by one ProbeInterval a step.
		ProbeInterval:           100 * time.Millisecond,
		ProbeTimeout:            50 * time.Millisecond,
		SuspicionMult:           4,
		SuspicionMaxTimeoutMult: 3,
		IndirectChecks:          3,
		GossipInterval:          50 * time.Millisecond,
		GossipNodes:             3,
		RetransmitMult:          4,
		PushPullInterval:        15 * time.Second,
		AwarenessMaxMultiplier:  8,
		TCPTimeout:              2 * time.Second,
		RejoinInterval:          5 * time.Second,
		LeaveTimeout:            time.Second,
	}
}

// withDefaults fills zero fields from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	setDur := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	setInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	if o.BindAddr == "" {
		o.BindAddr = d.BindAddr
	}
	if o.BindPort == 0 {
		o.BindPort = d.BindPort
	}
	setDur(&o.ProbeInterval, d.ProbeInterval)
	setDur(&o.ProbeTimeout, d.ProbeTimeout)
	setInt(&o.SuspicionMult, d.SuspicionMult)
	setInt(&o.SuspicionMaxTimeoutMult, d.SuspicionMaxTimeoutMult)
	setInt(&o.IndirectChecks, d.IndirectChecks)
	setDur(&o.GossipInterval, d.GossipInterval)
	setInt(&o.GossipNodes, d.GossipNodes)
	setInt(&o.RetransmitMult, d.RetransmitMult)
	setDur(&o.PushPullInterval, d.PushPullInterval)
	setInt(&o.AwarenessMaxMultiplier, d.AwarenessMaxMultiplier)
	setDur(&o.TCPTimeout, d.TCPTimeout)
	setDur(&o.RejoinInterval, d.RejoinInterval)
	setDur(&o.LeaveTimeout, d.LeaveTimeout)
	return o
}

// Validate reports options that cannot work, naming the option and value.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.NodeName == "" {
		errs = append(errs, errors.New("node name is empty"))
	}
	if o.BindPort < 0 || o.BindPort > 65535 {
		errs = append(errs, fmt.Errorf("bind port %d is not a port number", o.BindPort))
	}
	if o.ProbeTimeout >= o.ProbeInterval {
		errs = append(errs, fmt.Errorf("probe timeout %s must be shorter than probe interval %s", o.ProbeTimeout, o.ProbeInterval))
	}
	if o.SuspicionMaxTimeoutMult < 1 {
		errs = append(errs, fmt.Errorf("suspicion max timeout multiplier %d must be >= 1", o.SuspicionMaxTimeoutMult))
	}
	return errors.Join(errs...)
}

// SecretKeyFromSecret turns the memberlist Secret's secretkey data (any length,
// MetalLB's controller writes a long random string) into an AES-256 key. Every
// speaker derives the same key from the same Secret.
func SecretKeyFromSecret(data []byte) []byte {
	if len(data) == 0 {
		return nil
	}
	sum := sha256.Sum256(data)
	return sum[:]
}

// List is a running memberlist.
type List struct {
	log  logr.Logger
	opts Options
	ml   *memberlist.Memberlist
	done chan struct{}

	keyring *memberlist.Keyring
	queue   *memberlist.TransmitLimitedQueue

	mu    sync.Mutex
	peers []string // known peer addresses host:port, for rejoin

	// crashed is set when the memberlist was shut down without leaving (tests
	// simulating a crash); Leave would panic after Shutdown.
	crashed atomic.Bool
	// meta is what this member says of itself (SetMeta).
	meta atomic.Pointer[[]byte]
}

// Start creates the memberlist, bound and alive, and starts the rejoin loop.
// When ctx ends, it leaves gracefully (peers see the departure at once rather
// than after the suspicion timeout), shuts down, and closes Done.
func Start(ctx context.Context, logger logr.Logger, opts Options) (*List, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("memberlist options: %w", err)
	}
	opts = opts.withDefaults()
	l := &List{
		log:  logger,
		opts: opts,
		done: make(chan struct{}),
	}

	if opts.Meta != nil {
		m := slices.Clone(opts.Meta)
		l.meta.Store(&m)
	}
	cfg := memberlist.DefaultLANConfig()
	cfg.Name = opts.NodeName
	cfg.BindAddr = opts.BindAddr
	cfg.BindPort = opts.BindPort
	cfg.AdvertisePort = opts.BindPort
	if opts.AdvertiseAddr != "" {
		cfg.AdvertiseAddr = opts.AdvertiseAddr
	}
	cfg.ProbeInterval = opts.ProbeInterval
	cfg.ProbeTimeout = opts.ProbeTimeout
	cfg.SuspicionMult = opts.SuspicionMult
	cfg.SuspicionMaxTimeoutMult = opts.SuspicionMaxTimeoutMult
	cfg.IndirectChecks = opts.IndirectChecks
	cfg.GossipInterval = opts.GossipInterval
	cfg.GossipNodes = opts.GossipNodes
	cfg.RetransmitMult = opts.RetransmitMult
	cfg.PushPullInterval = opts.PushPullInterval
	cfg.AwarenessMaxMultiplier = opts.AwarenessMaxMultiplier
	cfg.TCPTimeout = opts.TCPTimeout
	// A dead member's name may come back at once (a restarted speaker on the
	// same node with a new address, e.g. after a host IP change).
	cfg.DeadNodeReclaimTime = time.Second
	if opts.events != nil {
		cfg.Events = opts.events
	}
	if opts.State != nil {
		l.queue = &memberlist.TransmitLimitedQueue{
			NumNodes:       func() int { return l.ml.NumMembers() },
			RetransmitMult: opts.RetransmitMult,
		}
		cfg.Delegate = stateDelegate{state: opts.State, queue: l.queue, l: l}
	}
	cfg.Logger = log.New(&logWriter{log: logger.WithName("memberlist")}, "", 0)
	if opts.transport != nil {
		cfg.Transport = opts.transport
	}
	if len(opts.SecretKey) > 0 {
		kr, err := memberlist.NewKeyring(nil, SecretKeyFromSecret(opts.SecretKey))
		if err != nil {
			return nil, fmt.Errorf("memberlist secret key: %w", err)
		}
		l.keyring = kr
		cfg.Keyring = kr
		cfg.GossipVerifyIncoming = true
		cfg.GossipVerifyOutgoing = true
	} else {
		logger.Info("memberlist traffic is NOT encrypted: no secret key given")
	}

	ml, err := memberlist.Create(cfg)
	if err != nil {
		return nil, fmt.Errorf("start memberlist on %s:%d as %q: %w", opts.BindAddr, opts.BindPort, opts.NodeName, err)
	}
	l.ml = ml
	logger.Info("memberlist started", "node", opts.NodeName, "bindAddr", opts.BindAddr, "bindPort", opts.BindPort,
		"probeInterval", opts.ProbeInterval, "probeTimeout", opts.ProbeTimeout, "suspicionMult", opts.SuspicionMult)
	go l.run(ctx)
	return l, nil
}

// Done is closed once the member has left and shut down after ctx ended.
func (l *List) Done() <-chan struct{} { return l.done }

// Members returns the names of the members not dead or left (suspects are
// included, as in MetalLB: a suspect usually refutes), sorted.
func (l *List) Members() []string {
	nodes := l.ml.Members()
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

// PrimaryKey returns the key that encrypts outgoing traffic (nil without
// encryption), to verify a rotation took effect.
func (l *List) PrimaryKey() []byte {
	if l.keyring == nil {
		return nil
	}
	return l.keyring.GetPrimaryKey()
}

// State is a member's liveness as this member sees it.
type State int

const (
	// StateAlive: acknowledging probes.
	StateAlive State = iota
	// StateSuspect: missed probes; declared dead unless it refutes in time.
	StateSuspect
)

// MemberState is one member that is not dead or left.
type MemberState struct {
	Name  string
	Addr  string // ip:port
	State State
	// Meta is what the member says of itself (SetMeta).
	Meta []byte
	// Keys are the fingerprints of the memberlist keys the member accepts,
	// the one it sends with first; nil when it does not say (no
	// encryption, no Options.State, or a previous release).
	Keys []Fingerprint
}

// States returns every member that is not dead or left, with its state,
// sorted by name. A suspect is a member that missed its probes: the speaker
// checks its data path at once instead of waiting for the suspicion timeout.
func (l *List) States() []MemberState {
	nodes := l.ml.Members()
	out := make([]MemberState, 0, len(nodes))
	for _, n := range nodes {
		st := StateAlive
		if n.State == memberlist.StateSuspect {
			st = StateSuspect
		}
		app, keys := decodeMeta(n.Meta)
		out = append(out, MemberState{Name: n.Name, Addr: n.Address(), State: st, Meta: app, Keys: keys})
	}
	slices.SortFunc(out, func(a, b MemberState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Broadcast gossips msg to every member (StateDelegate.NotifyMsg), piggybacked
// on memberlist's probes and retransmitted like its own messages. A later
// broadcast with the same key replaces one not yet sent; with an empty key
// the message replaces nothing and nothing replaces it. msg should be at most
// MaxBroadcast bytes; one larger than a packet's room is never sent.
func (l *List) Broadcast(key string, msg []byte) {
	if l.queue == nil {
		return
	}
	if key == "" {
		l.queue.QueueBroadcast(&uniqueBroadcast{msg: msg})
		return
	}
	l.queue.QueueBroadcast(&namedBroadcast{key: key, msg: msg})
}

// MaxBroadcast is the size of the largest message Broadcast is sure to send
// promptly: two fit in one encrypted gossip packet (memberlist's 1,400-byte
// UDP buffer, less its headers and the encryption's) or ride on one probe,
// with room left for memberlist's own messages, which go first.
const MaxBroadcast = 600

// SendToAll sends msg to every other live member at once (memberlist's
// encrypted packet transport, best effort: no retransmission), for messages
// that cannot wait for gossip. Returns how many sends failed.
func (l *List) SendToAll(msg []byte) int {
	failed := 0
	self := l.ml.LocalNode().Name
	for _, m := range l.ml.Members() {
		if m.Name == self {
			continue
		}
		if err := l.ml.SendBestEffort(m, msg); err != nil {
			failed++
		}
	}
	return failed
}

// Sync exchanges full state (push/pull) with up to n members at once, as a
// join does: live members first, then known peers (SetPeers) that are not
// live members. A member that was frozen or partitioned calls it to learn
// what changed meanwhile instead of waiting for the periodic push/pull or
// the rejoin loop: one whose link was down has usually declared every peer
// dead by then, and must reach them at once all the same, or it keeps
// answering for IPs that moved while it was cut off.
func (l *List) Sync(n int) int {
	self := l.LocalAddr()
	var addrs []string
	for _, m := range l.ml.Members() {
		if a := m.Address(); a != self && m.State == memberlist.StateAlive {
			addrs = append(addrs, a)
		}
	}
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	if len(addrs) < n {
		absent := l.absentPeers()
		rand.Shuffle(len(absent), func(i, j int) { absent[i], absent[j] = absent[j], absent[i] })
		addrs = append(addrs, absent...)
	}
	if len(addrs) == 0 {
		return 0
	}
	joined, err := l.ml.Join(addrs[:min(n, len(addrs))])
	if err != nil {
		l.log.V(1).Info("state sync: some members unreachable", "error", err.Error(), "synced", joined)
	}
	return joined
}

// LocalAddr is the address peers reach this member on (ip:port).
func (l *List) LocalAddr() string { return l.ml.LocalNode().Address() }

// HealthScore is Lifeguard's local health: 0 is healthy; higher means this
// member is missing acks (likely CPU starved) and is stretching its timeouts.
func (l *List) HealthScore() int { return l.ml.GetHealthScore() }

// Join contacts the given peers (host or host:port; default port BindPort) and
// returns how many were reached.
func (l *List) Join(addrs []string) (int, error) {
	addrs = l.normalise(addrs)
	if len(addrs) == 0 {
		return 0, nil
	}
	n, err := l.ml.Join(addrs)
	if err != nil {
		return n, fmt.Errorf("join memberlist peers %v: %w", addrs, err)
	}
	return n, nil
}

// SetPeers records the addresses of all speakers and joins those that are not
// members yet. The rejoin loop keeps retrying them, so a member that was
// declared dead during a partition comes back when the partition heals.
func (l *List) SetPeers(addrs []string) {
	addrs = l.normalise(addrs)
	l.mu.Lock()
	changed := !slices.Equal(addrs, l.peers)
	l.peers = addrs
	l.mu.Unlock()
	if changed {
		l.rejoin()
	}
}

// PeerCount is how many other speakers this member knows of: the known peer
// addresses (SetPeers) and the members, this member excepted.
func (l *List) PeerCount() int {
	l.mu.Lock()
	peers := slices.Clone(l.peers)
	l.mu.Unlock()
	self := l.LocalAddr()
	seen := map[string]bool{self: true}
	for _, n := range l.ml.Members() {
		seen[n.Address()] = true
	}
	for _, p := range peers {
		seen[p] = true
	}
	return len(seen) - 1
}

// absentPeers returns the known peer addresses (SetPeers) that no member
// (alive or suspect) has, this member's own excepted.
func (l *List) absentPeers() []string {
	l.mu.Lock()
	peers := slices.Clone(l.peers)
	l.mu.Unlock()
	have := map[string]bool{l.LocalAddr(): true}
	for _, n := range l.ml.Members() {
		have[n.Address()] = true
	}
	var absent []string
	for _, p := range peers {
		if !have[p] {
			absent = append(absent, p)
		}
	}
	return absent
}

// rejoin joins every known peer address that no live member has.
func (l *List) rejoin() {
	missing := l.absentPeers()
	if len(missing) == 0 {
		return
	}
	n, err := l.ml.Join(missing)
	if err != nil {
		// Expected for peers that are really gone; they stay in the list until
		// the speaker Pod list drops them.
		l.log.V(1).Info("rejoin: some peers unreachable", "peers", missing, "joined", n, "error", err.Error())
		return
	}
	l.log.Info("rejoined peers", "peers", missing, "joined", n)
}

func (l *List) run(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(l.opts.RejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.leave()
			return
		case <-t.C:
			l.rejoin()
		}
	}
}

// leave broadcasts our departure, so peers drop us immediately, then shuts the
// memberlist down.
func (l *List) leave() {
	if l.crashed.Load() {
		return
	}
	start := time.Now()
	if err := l.ml.Leave(l.opts.LeaveTimeout); err != nil {
		l.log.Error(err, "memberlist leave did not complete; peers will detect the departure by timeout", "timeout", l.opts.LeaveTimeout)
	}
	if err := l.ml.Shutdown(); err != nil {
		l.log.Error(err, "memberlist shutdown")
	}
	l.log.Info("left memberlist", "took", time.Since(start))
}

func (l *List) normalise(addrs []string) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			a = net.JoinHostPort(a, strconv.Itoa(l.opts.BindPort))
		}
		out = append(out, a)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// namedBroadcast is a queued application message that a later one with the
// same key replaces. It is a memberlist.NamedBroadcast, which the queue finds
// by name; a plain Broadcast makes every enqueue scan the whole queue, which
// a takeover queueing thousands of messages turns quadratic.
type namedBroadcast struct {
	key string
	msg []byte
}

func (b *namedBroadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(memberlist.NamedBroadcast)
	return ok && o.Name() == b.key
}
func (b *namedBroadcast) Name() string    { return b.key }
func (b *namedBroadcast) Message() []byte { return b.msg }
func (b *namedBroadcast) Finished()       {}

// uniqueBroadcast is a queued application message that replaces nothing and
// that nothing replaces.
type uniqueBroadcast struct{ msg []byte }

func (b *uniqueBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b *uniqueBroadcast) UniqueBroadcast()                      {}
func (b *uniqueBroadcast) Message() []byte                       { return b.msg }
func (b *uniqueBroadcast) Finished()                             {}

// stateDelegate adapts a StateDelegate to memberlist.Delegate.
type stateDelegate struct {
	state StateDelegate
	queue *memberlist.TransmitLimitedQueue
	l     *List
}

func (d stateDelegate) NodeMeta(limit int) []byte {
	var app []byte
	if m := d.l.meta.Load(); m != nil {
		app = *m
	}
	return encodeMeta(app, d.l.localKeys(), limit)
}
func (d stateDelegate) NotifyMsg(msg []byte) {
	if len(msg) > 0 {
		d.state.NotifyMsg(slices.Clone(msg)) // memberlist reuses the buffer
	}
}
func (d stateDelegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.queue.GetBroadcasts(overhead, limit)
}
func (d stateDelegate) LocalState(join bool) []byte { return d.state.LocalState(join) }
func (d stateDelegate) MergeRemoteState(buf []byte, join bool) {
	d.state.MergeRemoteState(buf, join)
}

// logWriter adapts memberlist's "[LEVEL] memberlist: msg" lines to logr.
type logWriter struct{ log logr.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	level, msg := "", line
	if strings.HasPrefix(line, "[") {
		if i := strings.Index(line, "]"); i > 0 {
			level, msg = line[1:i], strings.TrimSpace(line[i+1:])
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	switch level {
	case "ERR", "ERROR":
		w.log.Error(nil, msg)
	case "WARN":
		w.log.Info(msg, "level", "warn")
	case "INFO":
		w.log.Info(msg)
	default:
		w.log.V(1).Info(msg)
	}
	return len(p), nil
}
