package speaker

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// Timings of the health loop. The nodes whose verdict this speaker needs are
// probed continuously: a probe round (layer2.Prober: 3 probes 50 ms apart)
// every probeEvery; a node is down after missedRounds rounds without an
// answer (~300-400 ms after it died), whatever memberlist says.
const (
	healthPoll = 50 * time.Millisecond
	probeEvery = 100 * time.Millisecond
	// missedRounds: one lost answer is not a dead node.
	missedRounds = 2
	// tickEvery drives hold expiry and the gauges.
	tickEvery = 250 * time.Millisecond
	// stallGap: a poll this late means this process was frozen (SIGSTOP,
	// starved); its claims may be stale, so it re-syncs with peers at once.
	stallGap = time.Second
	// lateRound: an unanswered probe round takes 150 ms (layer2.Prober's
	// 3 probes 50 ms apart); one that took this long means this process
	// was starved meanwhile and may not have read the answers in time.
	lateRound = 400 * time.Millisecond
	// distrustFor: after a stall, or sends that all failed, this speaker
	// distrusts its own view this long (votes unknown, decides nothing):
	// what it saw meanwhile says more about itself than about its peers.
	distrustFor = 2 * time.Second
	// voteResend: a watcher re-sends its current votes as gossip this often,
	// well within ownership's vote lifetime (10 s), so that members that
	// missed the direct send learn them and a lapse means a silent watcher.
	voteResend = 2 * time.Second
	// voteRefresh: a watcher casts its standing finding into its own replica
	// this often (its resends carry what its replica holds).
	voteRefresh = time.Second
	// outageHoldAfter: a node cut off this long (no carrier on any
	// announcing interface) may have lost its IPs to its peers (its watchers
	// find a node down ~300-400 ms after it went silent), so it holds every
	// answer from then until, its carrier back, it has re-synced
	// (resyncHold). A node that still has carrier on some interface holds
	// nothing: it may be serving its IPs there.
	outageHoldAfter = 250 * time.Millisecond
	// resyncHoldMax bounds that hold when no peer can be reached.
	resyncHoldMax = 3 * time.Second
	// answerCheck: how often this speaker checks whether it can answer for
	// its IPs (it reads the configuration from its cache).
	answerCheck = time.Second
)

// prober is what health needs from layer2.Prober.
type prober interface {
	Probe(ctx context.Context, addr netip.Addr) layer2.ProbeResult
}

// health feeds the ownership layer with who is alive: memberlist states and
// data-path verdicts. Each node that owns IPs is probed by its watchers (the
// next two nodes in name order, the first being its deputy), which send
// their verdicts to every member: probes stay constant per node at any
// cluster size. The data path decides
// whether a node keeps its IPs: a speaker that crashed, restarts or is frozen
// on a node whose kernel still answers ARP/NDP for the node's address keeps
// them; a node whose kernel stops answering (dead, link or carrier lost)
// loses them, whatever memberlist says.
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
	// votes publishes this watcher's votes (zero: keep them local).
	votes voteSender
	// trusted: this speaker trusts its own view (announcing carrier up, no
	// recent stall or failed sends); while false its probes vote unknown
	// and ownership decides nothing (owners.SetTrusted).
	trusted atomic.Bool
	// distrustUntil is when a stall's or failed sends' distrust ends
	// (UnixNano).
	distrustUntil atomic.Int64
	// checker asks the watched nodes' kube-proxy health endpoints (nil or
	// port 0: kernel probes only), and services, when set, tries their
	// Services through them; see delivery.go.
	checker  *healthChecker
	services *serviceCheck
	// answering reports whether this speaker answers for the IPs it owns
	// (a valid configuration); the members learn it from this member's
	// memberlist metadata (answersMeta) and hold a member that does not, so
	// that its deputy answers for its IPs meanwhile. nil: always. Asked
	// every answerCheck.
	answering func() bool

	// mu guards last and addrs, which the probe loops read.
	mu     sync.Mutex
	last   map[string]ownership.Speaker
	addrs  map[string]netip.Addr // memberlist address, kept after the node left
	probes map[string]context.CancelFunc
	wg     sync.WaitGroup
	// links lists this node's interfaces (the announcer's last scan), and
	// linksChanged is kicked when they change: a node whose link comes back
	// after a loss re-syncs its claims at once, because its IPs may have
	// moved while it was cut off and it would otherwise answer for them
	// until the next push/pull.
	links        func() []layer2.Link
	linksChanged chan struct{}
	// announcing lists the interfaces with a responder: only their carrier
	// matters (pod veths come and go all the time).
	announcing func() []string
	// hold holds every ARP/NDP answer and announcement until a time (the
	// zero time: none; layer2.Announcer.Hold); nil: never held.
	hold func(until time.Time)
	// holds counts resync holds: a hold's end releases only its own.
	holds atomic.Uint64

	// polls counts completed polls: ownership must not decide before a
	// poll that follows the initial join (see awaitPoll); lastPoll is when
	// the last one completed (UnixNano; liveness).
	polls    atomic.Uint64
	lastPoll atomic.Int64
}

// sinceLastPoll returns how long ago the last poll completed, and whether
// one has.
func (h *health) sinceLastPoll(now time.Time) (time.Duration, bool) {
	last := h.lastPoll.Load()
	if last == 0 {
		return 0, false
	}
	return now.Sub(time.Unix(0, last)), true
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
		h.mu.Lock()
		h.stopProbes()
		h.mu.Unlock()
		h.wg.Wait()
	}()
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	lastPoll, lastTick, lastResend := time.Now(), time.Now(), time.Now()
	carrier := h.carrier()
	// cutSince is when every announcing interface lost its carrier (zero:
	// some has it); holding: this outage lasted long enough to hold every
	// answer until the node has re-synced (resyncHold).
	var cutSince time.Time
	holding := false
	h.trusted.Store(true)
	answers := true // what this member's metadata says (empty at Start: answers)
	var lastAnswerCheck time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.linksChanged:
			now, at := h.carrier(), time.Now()
			was, back := anyUp(carrier), ""
			for name, up := range now {
				if up && !carrier[name] {
					back = name
				}
			}
			carrier = now
			switch {
			case was && !anyUp(now):
				cutSince = at
			case !was && anyUp(now):
				// Its IPs may have moved while it was cut off: learn
				// before answering for them any longer.
				outage := time.Duration(0)
				if !cutSince.IsZero() {
					outage = at.Sub(cutSince)
				}
				cutSince = time.Time{}
				h.log.Info("carrier back; re-syncing ownership claims", "outage", outage.Round(time.Millisecond).String(), "holding", holding)
				if holding {
					holding = false
					h.wg.Add(1)
					go func() {
						defer h.wg.Done()
						h.resyncHold(ctx, at)
					}()
				} else {
					go h.ml.Sync(3)
				}
			case back != "":
				// One of several interfaces: the node was reachable, but
				// what it missed there is learned at once all the same.
				h.log.Info("carrier back on an interface; re-syncing ownership claims", "interface", back)
				go h.ml.Sync(3)
			}
			h.updateTrust(at, carrier)
			continue
		case <-t.C:
		}
		now := time.Now()
		if gap := now.Sub(lastPoll); gap > stallGap {
			h.log.Info("this speaker was stalled; distrusting its own view and re-syncing ownership claims with peers", "gap", gap.Round(time.Millisecond).String())
			h.distrust(now)
			go h.ml.Sync(3)
		}
		lastPoll = now
		if !cutSince.IsZero() && now.Sub(cutSince) >= outageHoldAfter && h.hold != nil {
			// Renewed while cut off, so that it never lapses before the
			// carrier is back: then resyncHold takes it over.
			if !holding {
				h.log.Info("cut off long enough for peers to move this node's IPs: holding every answer until it has re-synced with them")
			}
			holding = true
			h.holds.Add(1)
			h.hold(now.Add(resyncHoldMax))
		}
		h.updateTrust(now, carrier)
		if h.answering != nil && now.Sub(lastAnswerCheck) >= answerCheck {
			lastAnswerCheck = now
			if a := h.answering(); a != answers {
				answers = a
				h.log.Info("telling the other speakers whether this one answers for its IPs", "answers", a)
				h.ml.SetMeta(answersMeta(a))
			}
		}
		h.poll(ctx, now)
		h.polls.Add(1)
		h.lastPoll.Store(time.Now().UnixNano())
		if now.Sub(lastTick) >= tickEvery {
			h.own.Tick(now)
			lastTick = now
		}
		if now.Sub(lastResend) >= voteResend {
			h.votes.resend(h.self, h.own.VotesBy(h.self))
			lastResend = now
		}
	}
}

// anyUp reports whether some announcing interface has carrier.
func anyUp(carrier map[string]bool) bool {
	for _, up := range carrier {
		if up {
			return true
		}
	}
	return false
}

// resyncHold runs after an outage that may have moved this node's IPs: the
// peers moved them while this node, cut off, kept its claims, and it would
// answer and re-announce them, sending clients back to it, until it learned
// the moves. So it holds every answer and announcement (hold) until a
// push/pull with enough peers has brought their claims: two (one may be a
// speaker that has just restarted and knows nothing yet), or the only one;
// or resyncHoldMax after the carrier came back, if they cannot be reached.
// A move learned meanwhile takes the IP out of the announcer's sets, so
// the hold's end announces only what this node still owns.
func (h *health) resyncHold(ctx context.Context, back time.Time) {
	gen := h.holds.Add(1)
	until := back.Add(resyncHoldMax)
	h.hold(until)
	need := min(2, h.ml.PeerCount())
	synced := 0
	for need > 0 && time.Now().Before(until) && ctx.Err() == nil {
		if synced = h.ml.Sync(need); synced >= need {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if h.holds.Load() == gen {
		h.hold(time.Time{})
	}
	h.log.Info("answering again after re-syncing with peers", "held", time.Since(back).Round(time.Millisecond).String(), "peersSynced", synced, "needed", need)
}

// answersMeta is the memberlist metadata saying whether this speaker answers
// for the IPs it owns; metaAnswers reads it. Empty metadata (a speaker of the
// previous release) answers.
func answersMeta(answers bool) []byte {
	if answers {
		return []byte{1}
	}
	return []byte{0}
}

func metaAnswers(meta []byte) bool { return len(meta) == 0 || meta[0] != 0 }

// distrust makes this speaker distrust its own view for distrustFor from now.
func (h *health) distrust(now time.Time) {
	h.distrustUntil.Store(now.Add(distrustFor).UnixNano())
}

// updateTrust recomputes whether this speaker trusts its own view: every
// announcing interface has carrier and no distrust period runs. A change
// reaches ownership (SetTrusted) and is logged.
func (h *health) updateTrust(now time.Time, carrier map[string]bool) {
	why := ""
	for name, up := range carrier {
		if !up {
			why = "no carrier on announcing interface " + name
		}
	}
	if why == "" && now.UnixNano() < h.distrustUntil.Load() {
		why = "stalled or unable to send moments ago"
	}
	ok := why == ""
	if h.trusted.Swap(ok) == ok {
		return
	}
	if ok {
		h.log.Info("trusting this speaker's own view again: deciding ownership")
	} else {
		h.log.Info("distrusting this speaker's own view: it votes unknown and decides nothing, only nodes that see the segment do", "why", why)
	}
	h.own.SetTrusted(ok)
}

// carrier returns which interfaces have carrier.
func (h *health) carrier() map[string]bool {
	out := map[string]bool{}
	if h.links == nil || h.announcing == nil {
		return out
	}
	ann := h.announcing()
	for _, l := range h.links() {
		if slices.Contains(ann, l.Name) {
			out[l.Name] = l.Up && l.Carrier
		}
	}
	return out
}

// poll reads the member states, reports changes, and starts or stops the
// data-path probes.
func (h *health) poll(ctx context.Context, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]ownership.Speaker{}
	for _, m := range h.ml.States() {
		st := ownership.SpeakerAlive
		switch {
		case !metaAnswers(m.Meta):
			// Alive but not answering for its IPs (starting, or no valid
			// configuration): held like a speaker that is away, so that
			// its deputy answers for them while its kernel delivers.
			st = ownership.SpeakerGone
		case m.State == membership.StateSuspect:
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
	for name := range h.last {
		if name == h.self {
			continue
		}
		need := h.own.Interested(name)
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
			// A vote nobody refreshes goes stale: withdraw it.
			h.withdraw(name)
		}
	}
}

// withdraw replaces this watcher's vote on node by unknown.
// macsOf asks the segment for node's MAC, at its own addresses and then its
// memberlist address: the first that answers gives the interface and MAC
// (nil if none answers). For a node this one does not watch, whose MAC its
// probes never saw (secondChance).
func (h *health) macsOf(ctx context.Context, node string) map[string]net.HardwareAddr {
	var targets []netip.Addr
	if h.nodeAddrs != nil {
		targets = h.nodeAddrs(ctx, node)
	}
	h.mu.Lock()
	if a, ok := h.addrs[node]; ok && !slices.Contains(targets, a) {
		targets = append(targets, a)
	}
	h.mu.Unlock()
	for _, a := range targets {
		if r := h.prober.Probe(ctx, a); r.Reachable && len(r.MAC) == 6 {
			return map[string]net.HardwareAddr{r.Interface: r.MAC}
		}
	}
	return nil
}

func (h *health) withdraw(node string) {
	h.own.Vote(ownership.Vote{Node: node, Watcher: h.self, Path: ownership.PathUnknown, Seq: uint64(time.Now().UnixNano())}, "", nil)
}

// stopProbes stops every probe loop and withdraws their votes. h.mu held.
func (h *health) stopProbes() {
	for name, cancel := range h.probes {
		cancel()
		delete(h.probes, name)
		h.withdraw(name)
	}
}

// probeLoop probes node's data path until ctx ends, reporting each change of
// verdict (and of the MAC it answers with).
func (h *health) probeLoop(ctx context.Context, node string) {
	// The node's own addresses (Node InternalIP/ExternalIP: in a layer-2
	// setup, its address on the clients' segment) judge the data path; the
	// memberlist address is the fallback, since memberlist may run on
	// another network than the one the clients use.
	targets := h.nodeAddrs(ctx, node)
	h.mu.Lock()
	fallback, hasFallback := h.addrs[node]
	h.mu.Unlock()
	// Its delivery is checked at the first of its addresses (InternalIP
	// first), where kube-proxy's health endpoint listens.
	var dw *deliveryWatch
	if h.checker.enabled() {
		if addr, ok := firstAddr(targets, fallback, hasFallback); ok {
			dw = newDeliveryWatch(node, h.services)
			dctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				dw.run(dctx, h.checker, addr)
			}()
			defer func() { stop(); <-done }()
		}
	}
	var last ownership.Path = -1
	var lastMAC string
	var seq uint64     // of the current finding
	var cast time.Time // when it was last cast
	misses := 0
	// scoreAnswered is this speaker's Lifeguard score when node last
	// answered: see silenceVerdict.
	scoreAnswered := 0
	for ctx.Err() == nil {
		h.mu.Lock()
		gone := h.last[node] == ownership.SpeakerGone
		h.mu.Unlock()
		began := time.Now()
		p, iface, mac, reason, onLink := h.probeOnce(ctx, targets, gone)
		if !onLink && hasFallback && !slices.Contains(targets, fallback) {
			p, iface, mac, reason, _ = h.probeOnce(ctx, []netip.Addr{fallback}, gone)
		}
		took := time.Since(began)
		if ctx.Err() != nil {
			return
		}
		if p == ownership.PathDown {
			var v silence
			var why string
			v, misses, why = silenceVerdict(misses, gone, scoreAnswered, took)
			switch v {
			case silenceWait:
				p = last
			case silenceDistrusted:
				p = ownership.PathUnknown
			}
			reason += why
		} else {
			misses = 0
			scoreAnswered = h.ml.HealthScore()
		}
		if p == -1 {
			p = ownership.PathUnknown
		}
		if dw != nil {
			dw.setPath(iface, mac)
			d, since, why := dw.get(h.checker)
			if v := voteOf(p, d); v != p {
				state := d.String()
				if !since.IsZero() {
					state += " since " + since.Format(time.RFC3339)
				}
				p, reason = v, why+" ("+state+")"
			}
		}
		if !h.trusted.Load() {
			// Its own link, CPU or sends failed: what it sees says more
			// about itself than about node.
			p, reason = ownership.PathUnknown, "this speaker distrusts its own view"
		}
		changed := p != last || mac.String() != lastMAC
		if changed {
			h.log.Info("data path of node", "node", node, "verdict", p.String(), "reason", reason,
				"interface", iface, "mac", mac.String(), "targets", targets)
		}
		if changed || time.Since(cast) >= voteRefresh {
			// A finding that stands is cast again: a vote not received
			// for a while lapses, on this replica as on the others.
			if p != last {
				seq = uint64(time.Now().UnixNano())
			}
			v := ownership.Vote{Node: node, Watcher: h.self, Path: p, Seq: seq}
			h.own.Vote(v, iface, mac)
			cast = time.Now()
			if p != last && h.votes.sendNow([]ownership.Vote{v}) {
				h.log.Info("every send of a data-path vote failed; distrusting this speaker's own view", "node", node)
				h.distrust(time.Now())
			}
			last, lastMAC = p, mac.String()
		}
		// After an unanswered round the next one starts at once: the node's
		// other watchers must reach the same finding before its IPs move, so
		// each watcher's own confirmation must not wait out a pause.
		pause := probeEvery
		if misses > 0 && misses < missedRounds {
			pause = 0
		}
		var kick chan struct{}
		if dw != nil {
			kick = dw.kick // a changed delivery finding is voted at once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		case <-kick:
		}
	}
}

// firstAddr is the address a node's delivery is checked at: its first Node
// address, else its memberlist address.
func firstAddr(targets []netip.Addr, fallback netip.Addr, hasFallback bool) (netip.Addr, bool) {
	if len(targets) > 0 {
		return targets[0], true
	}
	return fallback, hasFallback
}

// silence is what a run of unanswered probe rounds means (silenceVerdict).
type silence int

const (
	// silenceDown: the node's data path is down.
	silenceDown silence = iota
	// silenceWait: too few rounds yet; the previous verdict stands.
	silenceWait
	// silenceDistrusted: this speaker was itself degraded, so its probes
	// prove nothing: the verdict is unknown until memberlist decides.
	silenceDistrusted
)

// silenceVerdict judges an unanswered probe round that took took, after
// misses counted unanswered rounds in a row, of a node that memberlist has
// declared gone or not, given this speaker's Lifeguard score when the node
// last answered. It returns the verdict, the count of unanswered rounds
// including this one, and why (appended to the probe's reason).
//
// A round that took lateRound or more does not count: this speaker was
// starved during it and may not have read the answer. That holds when
// memberlist has declared the node gone too: starved speakers are exactly
// when memberlist is wrong (at the end of creating 5,000 Services on the
// 2-core lab every speaker missed acks, memberlist marked a live node failed,
// and one unanswered round then moved its 1,250 IPs). Once enough rounds
// count, a speaker that was already missing acks when the node last answered
// (starved of CPU, or its own network bad) cannot tell its own silence from
// the node's, and defers to memberlist: down once memberlist says gone. The
// score at the last answer is used, not the current one: memberlist's own
// probes of the silent node raise the current score too (the other members'
// nacks arrive late when they are busy), so it would partly measure the very
// silence being judged.
func silenceVerdict(misses int, gone bool, scoreAnswered int, took time.Duration) (silence, int, string) {
	late := took >= lateRound
	if !late {
		misses++
	}
	switch {
	case late:
		return silenceWait, misses, " (a late round, " + took.Round(time.Millisecond).String() + ": this speaker was starved; not counted)"
	case misses < missedRounds:
		return silenceWait, misses, " (round " + strconv.Itoa(misses) + ")"
	case gone:
		return silenceDown, misses, ""
	case scoreAnswered > 0:
		return silenceDistrusted, misses, "; this speaker was degraded when the node last answered (health score " + strconv.Itoa(scoreAnswered) + ")"
	}
	return silenceDown, misses, ""
}

// noInterface is probeOnce's reason when no target is on-link anywhere.
const noInterface = "no on-link interface"

// probeOnce asks whether node answers on any of targets, and says why, and
// whether any target is on-link on an announcing interface at all. Without
// one to ask on the data path cannot be judged, and memberlist's verdict
// stands: down once the speaker is declared gone, as in MetalLB.
func (h *health) probeOnce(ctx context.Context, targets []netip.Addr, gone bool) (p ownership.Path, iface string, mac net.HardwareAddr, reason string, onLink bool) {
	// Every target at once: a dual-stack node has an address per family, and
	// asking them one after the other would make a dead node's round the sum
	// of their timeouts (the lab's failover gap grew from 0.55 to 0.82 s).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // once one answered, the other probes stop
	type indexed struct {
		i   int
		res layer2.ProbeResult
	}
	ch := make(chan indexed, len(targets)) // buffered: no sender outlives the call
	for i, a := range targets {
		go func() { ch <- indexed{i, h.prober.Probe(ctx, a)} }()
	}
	results := make([]layer2.ProbeResult, len(targets))
	for range targets {
		r := <-ch
		if r.res.Reachable {
			return ownership.PathUp, r.res.Interface, r.res.MAC, "answered on " + targets[r.i].String(), true
		}
		results[r.i] = r.res
	}
	reason = noInterface
	for i, res := range results { // in target order, so the reason does not depend on timing
		if res.Reason != layer2.ProbeNoInterface {
			onLink, reason = true, res.Why()+" on "+targets[i].String()
		}
	}
	switch {
	case onLink:
		return ownership.PathDown, "", nil, reason, true
	case gone:
		return ownership.PathDown, "", nil, noInterface + "; memberlist says gone", false
	}
	return ownership.PathUnknown, "", nil, noInterface, false
}
