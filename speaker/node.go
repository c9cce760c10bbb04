package speaker

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// node is a speaker's node machinery, everything but the Kubernetes side:
// the layer-2 announcer, the ownership layer (owners), the claims and votes
// gossip over memberlist, the membership, the data-path prober and the health
// loop that feeds liveness to ownership. Run builds one and wires the
// manager's controllers around it; the netns failover tests and benchmarks
// build the same one and feed it fixed Service inputs instead, so that what
// they measure is the real speaker. Built by newNode, run by Start, ended by
// Stop.
type node struct {
	log  logr.Logger
	opts nodeOptions

	metrics *metrics
	ann     *layer2.Announcer
	own     *owners
	// gossip, prober and health are nil without memberlist; ml is set by
	// Start (nil without memberlist).
	gossip *gossip
	prober *layer2.Prober
	syn    *layer2.SYNProber // nil unless Services are tried (ProbeServices)
	// second forwards planned moves' connections to their previous owner;
	// nil without memberlist (no prober to find that owner) or drains.
	second     *secondChance
	secondDone chan struct{}
	health     *health
	ml         *membership.List
	// linksChanged is kicked by the announcer after a rescan that changed
	// the links, for health (re-sync on carrier regain).
	linksChanged chan struct{}

	// Set by Start.
	cancel     context.CancelFunc
	stopAnn    context.CancelFunc
	annDone    chan error
	healthDone chan struct{}
	stopOnce   sync.Once
}

// nodeOptions configure a node. The functions are what needs the Kubernetes
// manager in Run; the tests give fixed answers.
type nodeOptions struct {
	// Name is this node; required.
	Name string
	// Layer2 configures the announcer; NodeName and OnLinksChanged are set
	// by newNode, and a nil Registerer takes the node's.
	Layer2 layer2.Options
	// Ownership: Failback and Hold (Self is Name).
	Ownership ownership.Options
	// DisableMemberlist: no memberlist, gossip, prober nor health; the
	// caller feeds liveness to own (Run: readyNodes, from the Node objects).
	DisableMemberlist bool
	// Membership: the memberlist options; NodeName and State are set by the
	// node, SecretKey from KeyFile when that is set.
	Membership membership.Options
	// KeyFile is the memberlist key file: read by newNode, then watched by
	// the node so a rotated key takes effect. Empty: Membership.SecretKey as
	// given.
	KeyFile string
	// LeaveGrace: see Options.LeaveGrace.
	LeaveGrace time.Duration
	// KubeProxyHealthPort, HealthyAfter and ProbeServices: see Options (a
	// zero port: no checks). Ownership.RequireUp should be set with a port.
	KubeProxyHealthPort int
	HealthyAfter        time.Duration
	ProbeServices       bool
	// DrainTimeout: see Options (zero: planned moves forward nothing).
	DrainTimeout time.Duration
	// RebalanceRate: see Options (zero: no rebalancing).
	RebalanceRate int

	// Registerer receives the speaker's metrics (nil: none registered).
	Registerer prometheus.Registerer
	// Recorder records the ownership layer's events; required.
	Recorder recorder.EventRecorder
	// Status queues a ServiceL2Status sync for a Service; it must not
	// block. nil: none.
	Status func(svc string)
	// NodeAddrs returns a node's addresses from its Node object, where its
	// data path is probed (after its memberlist address).
	NodeAddrs func(ctx context.Context, node string) []netip.Addr
	// Answering reports whether this speaker answers for the IPs it owns
	// (see health.answering); nil: always.
	Answering func() bool
}

// newNode builds a node's parts, starting none of them. The only error is a
// memberlist key file that cannot be read.
func newNode(log logr.Logger, opts nodeOptions) (*node, error) {
	n := &node{log: log, metrics: newMetrics(opts.Registerer), linksChanged: make(chan struct{}, 1)}

	l2 := opts.Layer2
	l2.NodeName = opts.Name
	if l2.Registerer == nil {
		l2.Registerer = opts.Registerer
	}
	l2.OnLinksChanged = func() {
		select {
		case n.linksChanged <- struct{}{}:
		default:
		}
	}
	n.ann = layer2.NewAnnouncer(log.WithName("layer2"), l2)

	if opts.DisableMemberlist {
		// Without memberlist there is no replica to keep sticky owners in,
		// nor a peer to answer for a held node: every speaker computes
		// MetalLB's hash rule from the Ready nodes.
		opts.Ownership.Failback, opts.Ownership.Hold = ownership.FailbackImmediate, 0
	}
	n.own = newOwners(log.WithName("ownership"), opts.Name, opts.Ownership, n.ann, n.metrics, opts.Recorder)
	if opts.RebalanceRate > 0 {
		n.own.setRebalance(time.Minute / time.Duration(opts.RebalanceRate))
	}
	if opts.Status != nil {
		n.own.status = opts.Status
	}

	if !opts.DisableMemberlist {
		if opts.KeyFile != "" {
			key, err := readKeyFile(opts.KeyFile)
			if err != nil {
				return nil, err
			}
			opts.Membership.SecretKey = key
		}
		opts.Membership.NodeName = opts.Name
		// The gossip delegate hands peers' claims and votes to the owners
		// built above: membership must not start before them.
		n.gossip = newGossip(log.WithName("gossip"), n.own, n.metrics)
		opts.Membership.State = n.gossip
		n.prober = layer2.NewProber(log.WithName("prober"), layer2.ProberOptions{ExcludeInterfaces: opts.Layer2.ExcludeInterfaces})
		if opts.KubeProxyHealthPort > 0 && opts.ProbeServices {
			n.syn = layer2.NewSYNProber(log.WithName("synprober"), layer2.SYNProberOptions{})
		}
	}
	n.opts = opts
	return n, nil
}

// Start starts the node's parts; they run until ctx ends, when the memberlist
// leave begins, except the announcer, which answers until Stop. After Start
// succeeded, Stop must be called; on error, Start has undone what it started.
func (n *node) Start(ctx context.Context) error {
	ctx, n.cancel = context.WithCancel(ctx)
	// The announcer first, on a context of its own: it outlives ctx, still
	// answering through the memberlist leave and the leave grace, so that
	// clients always get an answer from this node or its successor.
	annCtx, stopAnn := context.WithCancel(context.WithoutCancel(ctx))
	n.stopAnn, n.annDone = stopAnn, make(chan error, 1)
	go func() { n.annDone <- n.ann.Run(annCtx) }()
	if n.opts.DisableMemberlist {
		return nil
	}

	// gossip.run before membership.Start: the delegate only queues the
	// claims and votes peers send (from the first join on), run merges them.
	go n.gossip.run(ctx)
	ml, err := membership.Start(ctx, n.log.WithName("membership"), n.opts.Membership)
	if err != nil {
		n.Stop()
		return err
	}
	n.ml = ml
	n.own.broadcast = broadcaster(ml)
	if n.opts.KeyFile != "" {
		go watchKeyFile(ctx, n.log.WithName("membership"), n.opts.KeyFile, n.opts.Membership.SecretKey, ml)
	}

	// Health after the prober and the membership it reads.
	n.health = &health{log: n.log.WithName("health"), self: n.opts.Name, ml: ml, own: n.own, prober: n.prober, metrics: n.metrics,
		votes:        newVoteSender(ml),
		checker:      newHealthChecker(n.opts.KubeProxyHealthPort, n.opts.HealthyAfter),
		nodeAddrs:    n.opts.NodeAddrs,
		links:        n.ann.Links,
		linksChanged: n.linksChanged,
		announcing:   n.ann.Interfaces,
		hold:         n.ann.Hold,
		answering:    n.opts.Answering}
	if n.syn != nil {
		n.health.services = &serviceCheck{syn: n.syn, target: n.own.ProbeTarget, control: n.own.ControlMAC}
	}
	n.healthDone = make(chan struct{})
	go func() {
		defer close(n.healthDone)
		n.health.run(ctx)
	}()
	if n.opts.DrainTimeout > 0 {
		n.second = newSecondChance(n.log.WithName("secondchance"), n.metrics, n.health.macsOf)
		n.own.setDrains(n.opts.DrainTimeout, n.second.Set)
		n.secondDone = make(chan struct{})
		go func() {
			defer close(n.secondDone)
			n.second.run(ctx)
		}()
	}
	return nil
}

// Stop ends the node in the order that keeps the node's IPs answered: it
// waits for the memberlist leave (begun when Start's ctx ended; Stop ends
// that ctx if it has not), keeps answering for LeaveGrace so that the new
// owner has taken over (and sent its gratuitous ARP) before this node goes
// quiet, then stops the announcer and only then forgets the announced
// metrics (owners.Stop: nothing is announced any more, and the registry may
// outlive the node, as with several speakers in one test process). Stop
// without Start does nothing; a second Stop neither.
func (n *node) Stop() {
	n.stopOnce.Do(func() {
		if n.cancel == nil {
			return
		}
		n.cancel()
		if n.ml != nil {
			<-n.ml.Done()
			if n.opts.LeaveGrace > 0 {
				n.log.Info("left memberlist; still answering during the leave grace", "leaveGrace", n.opts.LeaveGrace)
				time.Sleep(n.opts.LeaveGrace)
			}
		}
		n.stopAnn()
		if err := <-n.annDone; err != nil && !errors.Is(err, context.Canceled) {
			n.log.Error(err, "announcer stopped with an error")
		}
		n.own.Stop()
		if n.healthDone != nil {
			<-n.healthDone // its probes are done with the prober
		}
		if n.secondDone != nil {
			<-n.secondDone // its tables are removed
		}
		if n.prober != nil {
			_ = n.prober.Close()
		}
		if n.syn != nil {
			_ = n.syn.Close()
		}
	})
}
