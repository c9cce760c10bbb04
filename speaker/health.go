package speaker

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// Timings of the health loop. Polling memberlist every 50 ms sees a member
// turn suspect (it missed a probe round, ~150-250 ms after a node dies) long
// before memberlist's suspicion timeout declares it dead; the data-path probe
// (3 probes 50 ms apart) then decides within 150 ms.
const (
	healthPoll = 50 * time.Millisecond
	// tickEvery drives hold expiry and the gauges.
	tickEvery = 250 * time.Millisecond
	// stallGap: a poll this late means this process was frozen (SIGSTOP,
	// starved); its claims may be stale, so it re-syncs with peers at once.
	stallGap = time.Second
	// reprobeUp and reprobeDown pace the probes of a node that answered
	// (held: catches its death during the hold) and of one that did not.
	reprobeUp   = 500 * time.Millisecond
	reprobeDown = time.Second
)

// prober is what health needs from layer2.Prober.
type prober interface {
	Probe(ctx context.Context, addr netip.Addr) layer2.ProbeResult
}

// health feeds the ownership layer with who is alive: memberlist states,
// polled so a suspect is seen early, and data-path verdicts for the members
// that are not alive. The data path decides whether a node keeps its IPs:
// a speaker that crashed, restarts or is frozen on a node whose kernel still
// answers ARP/NDP for the node's address keeps them.
type health struct {
	log    logr.Logger
	self   string
	ml     *membership.List
	own    *owners
	prober prober
	// nodeAddrs returns the addresses of a node from its Node object (the
	// memberlist address is probed first).
	nodeAddrs func(ctx context.Context, node string) []netip.Addr
	metrics   *metrics

	// mu guards last and addrs, which the probe loops read.
	mu     sync.Mutex
	last   map[string]ownership.Speaker
	addrs  map[string]netip.Addr // memberlist address, kept after the node left
	probes map[string]context.CancelFunc
	wg     sync.WaitGroup
	// polls counts completed polls: ownership must not decide before a
	// poll that follows the initial join (see awaitPoll).
	polls atomic.Uint64
}

// awaitPoll waits until a poll that started after the call has completed.
func (h *health) awaitPoll(ctx context.Context) bool {
	start := h.polls.Load()
	for h.polls.Load() < start+2 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(healthPoll / 2):
		}
	}
	return true
}

func (h *health) run(ctx context.Context) {
	h.last = map[string]ownership.Speaker{}
	h.addrs = map[string]netip.Addr{}
	h.probes = map[string]context.CancelFunc{}
	defer func() {
		for _, cancel := range h.probes {
			cancel()
		}
		h.wg.Wait()
	}()
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	lastPoll, lastTick := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if gap := now.Sub(lastPoll); gap > stallGap {
			h.log.Info("this speaker was stalled; re-syncing ownership claims with peers", "gap", gap.Round(time.Millisecond).String())
			go h.ml.Sync(3)
		}
		lastPoll = now
		h.poll(ctx, now)
		h.polls.Add(1)
		if now.Sub(lastTick) >= tickEvery {
			h.own.Tick(now)
			lastTick = now
		}
	}
}

// poll reads the member states, reports changes, and starts or stops the
// data-path probes.
func (h *health) poll(ctx context.Context, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]ownership.Speaker{}
	for _, m := range h.ml.States() {
		st := ownership.SpeakerAlive
		if m.State == membership.StateSuspect {
			st = ownership.SpeakerSuspect
		}
		seen[m.Name] = st
		if ap, err := netip.ParseAddrPort(m.Addr); err == nil {
			h.addrs[m.Name] = ap.Addr().Unmap()
		}
	}
	h.metrics.members.Set(float64(len(seen)))
	for name := range h.last {
		if _, ok := seen[name]; !ok {
			seen[name] = ownership.SpeakerGone
		}
	}
	for name, st := range seen {
		prev, known := h.last[name]
		if known && prev == st {
			continue
		}
		h.last[name] = st
		h.log.V(1).Info("member state", "member", name, "state", st.String(), "was", prev.String())
		h.own.SetSpeaker(name, st, now)
		if known && prev == ownership.SpeakerGone && st != ownership.SpeakerGone {
			// A member came back (restart, healed partition): exchange
			// claims now rather than at the next periodic push/pull, so
			// neither side keeps announcing what moved meanwhile.
			go h.ml.Sync(1)
		}
	}
	for name, st := range h.last {
		if name == h.self {
			continue
		}
		need := st != ownership.SpeakerAlive && h.own.Interested(name)
		cancel, running := h.probes[name]
		switch {
		case need && !running:
			pctx, cancel := context.WithCancel(ctx)
			h.probes[name] = cancel
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				h.probeLoop(pctx, name)
			}()
		case !need && running:
			cancel()
			delete(h.probes, name)
		}
	}
}

// probeLoop probes node's data path until ctx ends, reporting each change of
// verdict (and of the MAC it answers with).
func (h *health) probeLoop(ctx context.Context, node string) {
	targets := []netip.Addr{}
	h.mu.Lock()
	if a, ok := h.addrs[node]; ok {
		targets = append(targets, a)
	}
	h.mu.Unlock()
	for _, a := range h.nodeAddrs(ctx, node) {
		if !containsAddr(targets, a) {
			targets = append(targets, a)
		}
	}
	var last ownership.Path = -1
	var lastMAC string
	for ctx.Err() == nil {
		h.mu.Lock()
		gone := h.last[node] == ownership.SpeakerGone
		h.mu.Unlock()
		p, iface, mac, reason := h.probeOnce(ctx, targets, gone)
		if ctx.Err() != nil {
			return
		}
		if p != last || mac.String() != lastMAC {
			h.log.Info("data path of node", "node", node, "verdict", p.String(), "reason", reason,
				"interface", iface, "mac", mac.String(), "targets", targets)
			h.own.SetPath(node, p, iface, mac)
			last, lastMAC = p, mac.String()
		}
		wait := reprobeUp
		if p == ownership.PathDown {
			wait = reprobeDown
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// probeOnce asks whether node answers on any of its addresses. Without an
// on-link interface to ask on (the node's address is not on any announcing
// interface's subnet) the data path cannot be judged, and memberlist's
// verdict stands: down once the speaker is declared gone, as in MetalLB.
func (h *health) probeOnce(ctx context.Context, targets []netip.Addr, gone bool) (ownership.Path, string, net.HardwareAddr, string) {
	noInterface := true
	reason := "no address known"
	for _, a := range targets {
		res := h.prober.Probe(ctx, a)
		if res.Reachable {
			return ownership.PathUp, res.Interface, res.MAC, "answered on " + a.String()
		}
		reason = res.Reason
		if res.Reason != layer2.ProbeNoInterface {
			noInterface = false
		}
	}
	if noInterface {
		if gone {
			return ownership.PathDown, "", nil, "cannot probe (" + reason + "); memberlist says gone"
		}
		return ownership.PathUnknown, "", nil, "cannot probe (" + reason + ")"
	}
	return ownership.PathDown, "", nil, reason
}

func containsAddr(s []netip.Addr, a netip.Addr) bool {
	for _, x := range s {
		if x == a {
			return true
		}
	}
	return false
}
