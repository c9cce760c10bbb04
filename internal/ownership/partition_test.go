package ownership

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The partition simulation: speakers as engines wired by a simulated
// network that loses, duplicates, delays and reorders their messages, under
// random partial failures, with the invariants of issue 25 checked as
// assertions:
//   - no needless move: a transition (not learning) whose previous owner's
//     data path was up, on any replica, whatever memberlist fault is on;
//   - convergence: within convergeWithin of the last fault healing, every
//     replica holds the same claims and each key is announced by exactly
//     one node, one whose data path is up.
//
// The model, per node: kernelUp (it answers on the segment), segUp (its own
// link to the segment: down is a cable pull, seen as no carrier), ml[i][j]
// (i's memberlist packets reach j). Memberlist liveness follows two-way
// reachability after a detection delay; watchers vote what the segment
// shows them, or unknown while their own carrier is down.

const (
	simStep        = 100 * time.Millisecond
	simDetect      = 3 * time.Second // memberlist: gone after this long unreachable
	simRejoin      = time.Second     // and alive again this long after healing
	simPushPull    = 15 * time.Second
	simResend      = 2 * time.Second
	convergeWithin = 2 * time.Second
)

type simMsg struct {
	from, to int
	at       time.Time // delivery time
	claims   []Claim
	votes    []Vote
}

type simNode struct {
	name     string
	e        *Engine // nil while powered off
	kernelUp bool
	segUp    bool
	// deaf: it receives nothing on the segment, its carrier up: it hears
	// no answers (votes down, trusting itself) and no client reaches it.
	deaf bool
	// seen[j]: when j last had two-way memberlist with this node;
	// alive[j]: j's liveness as this node's memberlist reports it.
	seen  []time.Time
	alive []bool
	// last vote cast on each node, and when.
	voted    map[string]Path
	votedAt  map[string]time.Time
	votedSeq map[string]uint64
	// upSince: when its data path last came up (truth, for the checker).
	upSince time.Time
	// silentSince: when each watched node stopped answering.
	silentSince map[string]time.Time
}

type sim struct {
	t     *testing.T
	rng   *rand.Rand
	now   time.Time
	nodes []*simNode
	ml    [][]bool
	keys  []string
	set   *NodeSet
	inbox []simMsg
	trail []string
	// moves: when each transition (key, epoch, owner) was first made, by
	// any replica: the checker judges a move when it is made, not when
	// lagging replicas make the same one.
	moves map[Claim]Reason
	// lossy: message loss, duplication and reordering on.
	lossy        bool
	lastPushPull time.Time
	lastResend   time.Time
}

func newSim(t *testing.T, seed uint64, nNodes, nKeys int) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed*7+1)), now: t0, lossy: true, moves: map[Claim]Reason{}}
	var names []string
	for i := range nNodes {
		names = append(names, fmt.Sprintf("n%d", i))
	}
	s.set = NewInterner().Intern(names, nil)
	for i := range nKeys {
		s.keys = append(s.keys, fmt.Sprintf("10.0.0.%d", i+1))
	}
	s.ml = make([][]bool, nNodes)
	for i := range nNodes {
		s.ml[i] = make([]bool, nNodes)
		for j := range s.ml[i] {
			s.ml[i][j] = true
		}
		s.nodes = append(s.nodes, &simNode{name: names[i], kernelUp: true, segUp: true})
	}
	for i := range s.nodes {
		s.boot(i)
	}
	return s
}

// boot starts node i's speaker: it joins (learns the state of a reachable
// peer), then decides.
func (s *sim) boot(i int) {
	n := s.nodes[i]
	n.e = New(Options{Self: n.name, Hold: 30 * time.Second})
	n.seen = make([]time.Time, len(s.nodes))
	n.alive = make([]bool, len(s.nodes))
	n.voted, n.votedAt, n.votedSeq = map[string]Path{}, map[string]time.Time{}, map[string]uint64{}
	n.silentSince = map[string]time.Time{}
	for j := range s.nodes {
		if j == i || s.twoWay(i, j) {
			n.seen[j], n.alive[j] = s.now, true
			n.e.SetSpeaker(s.nodes[j].name, SpeakerAlive, s.now)
		}
	}
	for _, k := range s.keys {
		n.e.SetKey(k, s.set)
	}
	for j := range s.nodes {
		if j != i && s.twoWay(i, j) && s.nodes[j].e != nil {
			n.e.Merge(s.nodes[j].e.Claims())
			s.recordVotes(i, s.nodes[j].e.AllVotes())
		}
	}
	s.check(i, n.e.SetSynced(s.now))
}

func (s *sim) twoWay(i, j int) bool {
	return s.ml[i][j] && s.ml[j][i] && s.nodes[i].e != nil && s.nodes[j].e != nil
}

// pathUp is the truth the checker judges moves by.
func (s *sim) pathUp(name string) bool {
	n := s.node(name)
	return n != nil && n.kernelUp && n.segUp && !n.deaf
}

// evidenceLag bounds how old the evidence behind a decision can be: two
// probe rounds and the delivery of the votes. A move whose previous owner's
// data path was up throughout it is needless; one made while a fault is
// still being reported is the failover working.
const evidenceLag = time.Second

// upThroughout reports whether name's data path has been up for the last
// evidenceLag.
func (s *sim) upThroughout(name string) bool {
	n := s.node(name)
	return s.pathUp(name) && s.now.Sub(n.upSince) >= evidenceLag
}

func (s *sim) node(name string) *simNode {
	for _, n := range s.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

func (s *sim) logf(format string, args ...any) {
	s.trail = append(s.trail, s.now.Sub(t0).String()+" "+fmt.Sprintf(format, args...))
}

// check fails on a needless move among changes made by node i, then sends
// its own transitions to its peers.
func (s *sim) check(i int, changes []Change) {
	var mine []Claim
	for _, c := range changes {
		cl := Claim{Key: c.Key, Owner: c.To, Epoch: c.Epoch}
		first, made := s.moves[cl]
		if c.Reason == ReasonLearned {
			// Learning a placement over an owner that serves: two
			// replicas placed one key apart (a minority acted).
			if made && first == ReasonPlaced && c.From != "" && s.upThroughout(c.From) {
				s.fail("%s learned that %s moved from %s to %s, placed elsewhere, although %s's data path is up", s.nodes[i].name, c.Key, c.From, c.To, c.From)
			}
			continue
		}
		if !made && c.From != "" && c.Reason != ReasonPlaced && s.upThroughout(c.From) {
			s.fail("%s moved %s from %s to %s (%s) although %s's data path is up", s.nodes[i].name, c.Key, c.From, c.To, c.Reason, c.From)
		}
		if !made {
			s.moves[cl] = c.Reason
			s.logf("%s decided %+v", s.nodes[i].name, c)
		}
		mine = append(mine, cl)
	}
	if len(mine) > 0 {
		s.broadcast(i, mine, nil)
	}
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("%s\nlast events:\n  %s", fmt.Sprintf(format, args...), strings.Join(s.trail[max(0, len(s.trail)-25):], "\n  "))
}

// broadcast queues claims and votes from i to every node i's memberlist
// reaches, each copy possibly lost, duplicated or delayed.
func (s *sim) broadcast(i int, claims []Claim, votes []Vote) {
	for j := range s.nodes {
		if j == i || !s.ml[i][j] {
			continue
		}
		// Memberlist retransmits a broadcast (RetransmitMult x log n): each
		// transmission may be lost, duplicated or delayed on its own.
		copies := 0
		for range 3 {
			switch r := s.rng.IntN(20); {
			case !s.lossy:
				copies = 1
			case r < 2: // lost
			case r == 2:
				copies += 2 // duplicated
			default:
				copies++
			}
		}
		for range copies {
			delay := time.Duration(0)
			if s.lossy {
				delay = time.Duration(s.rng.IntN(4)) * simStep // reordered
			}
			s.inbox = append(s.inbox, simMsg{from: i, to: j, at: s.now.Add(delay), claims: claims, votes: votes})
		}
	}
}

func (s *sim) recordVotes(i int, votes []Vote) {
	for _, v := range votes {
		c, _ := s.nodes[i].e.Vote(v, s.now)
		s.check(i, c)
	}
}

// step advances the simulation by simStep.
func (s *sim) step() {
	s.now = s.now.Add(simStep)
	// Deliver what is due (and still reachable), in arrival order.
	var later []simMsg
	for _, m := range s.inbox {
		switch {
		case m.at.After(s.now):
			later = append(later, m)
		case s.nodes[m.to].e == nil || !s.ml[m.from][m.to]:
			// lost with the link or the node
		default:
			s.check(m.to, s.nodes[m.to].e.Merge(m.claims))
			s.recordVotes(m.to, m.votes)
		}
	}
	s.inbox = later
	for i, n := range s.nodes {
		if n.e == nil {
			continue
		}
		// Memberlist liveness.
		for j := range s.nodes {
			if j == i {
				continue
			}
			if s.twoWay(i, j) {
				if !n.alive[j] && s.now.Sub(n.seen[j]) < simRejoin {
					continue
				}
				if !n.alive[j] {
					if n.seen[j].Before(s.now.Add(-simRejoin - simStep)) {
						n.seen[j] = s.now // healing starts now
						continue
					}
					n.alive[j] = true
					s.logf("%s sees %s alive", n.name, s.nodes[j].name)
					s.check(i, n.e.SetSpeaker(s.nodes[j].name, SpeakerAlive, s.now))
					s.pushPull(i, j) // a member came back: sync at once
				}
				n.seen[j] = s.now
			} else if n.alive[j] && s.now.Sub(n.seen[j]) >= simDetect {
				n.alive[j] = false
				s.logf("%s sees %s gone", n.name, s.nodes[j].name)
				s.check(i, n.e.SetSpeaker(s.nodes[j].name, SpeakerGone, s.now))
			}
		}
		// Trust: its own carrier.
		s.check(i, n.e.SetTrusted(n.segUp))
		// Watching: vote what the segment shows.
		for _, x := range s.nodes {
			if x.name == n.name {
				continue
			}
			if !n.e.Interested(x.name) {
				if p, ok := n.voted[x.name]; ok && p != PathUnknown {
					s.cast(i, x.name, PathUnknown) // stopped watching: withdrawn
				}
				continue
			}
			// Two unanswered rounds make a down vote (health.go).
			p := PathUnknown
			if n.segUp {
				p = PathUp
				if !x.kernelUp || !x.segUp || x.deaf || n.deaf {
					since, ok := n.silentSince[x.name]
					if !ok {
						since = s.now
						n.silentSince[x.name] = since
					}
					p = n.voted[x.name]
					if s.now.Sub(since) >= 2*simStep {
						p = PathDown
					}
				} else {
					delete(n.silentSince, x.name)
				}
			}
			if n.voted[x.name] != p || s.now.Sub(n.votedAt[x.name]) >= time.Second {
				s.cast(i, x.name, p)
			}
		}
		s.check(i, n.e.Tick(s.now))
	}
	if s.now.Sub(s.lastResend) >= simResend {
		s.lastResend = s.now
		for i, n := range s.nodes {
			if n.e != nil {
				s.broadcast(i, nil, n.e.VotesBy(n.name))
			}
		}
	}
	if s.now.Sub(s.lastPushPull) >= simPushPull {
		s.lastPushPull = s.now
		for i := range s.nodes {
			s.pushPull(i, s.rng.IntN(len(s.nodes)))
		}
	}
}

// cast records node i's own vote on x and sends it when it changed.
func (s *sim) cast(i int, x string, p Path) {
	n := s.nodes[i]
	changed := n.voted[x] != p || n.votedSeq[x] == 0
	if changed {
		n.votedSeq[x] = uint64(s.now.UnixNano())
	}
	v := Vote{Node: x, Watcher: n.name, Path: p, Seq: n.votedSeq[x]}
	n.voted[x], n.votedAt[x] = p, s.now
	c, _ := n.e.Vote(v, s.now)
	s.check(i, c)
	if changed {
		s.broadcast(i, nil, []Vote{v})
	}
}

// pushPull exchanges the full state of i and j, if they reach each other.
func (s *sim) pushPull(i, j int) {
	if i == j || !s.twoWay(i, j) {
		return
	}
	a, b := s.nodes[i].e, s.nodes[j].e
	ac, av, bc, bv := a.Claims(), a.AllVotes(), b.Claims(), b.AllVotes()
	s.check(i, a.Merge(bc))
	s.recordVotes(i, bv)
	s.check(j, b.Merge(ac))
	s.recordVotes(j, av)
}

// fault applies one random partial failure and returns its description and
// how to heal it.
func (s *sim) fault() (string, func()) {
	n := len(s.nodes)
	v := s.rng.IntN(n)
	name := s.nodes[v].name
	setML := func(pred func(i, j int) bool, to bool) {
		for i := range n {
			for j := range n {
				if i != j && pred(i, j) {
					s.ml[i][j] = to
				}
			}
		}
	}
	allML := func() { setML(func(int, int) bool { return true }, true) }
	switch s.rng.IntN(7) {
	case 6:
		s.nodes[v].deaf = true
		return name + " deaf on the segment (carrier up)", func() { s.nodes[v].deaf, s.nodes[v].upSince = false, s.now }
	case 0:
		setML(func(i, j int) bool { return i == v || j == v }, false)
		return "memberlist of " + name + " cut both ways", allML
	case 1:
		setML(func(i, j int) bool { return j == v }, false)
		return "memberlist of " + name + " cannot receive", allML
	case 2:
		setML(func(i, j int) bool { return i == v }, false)
		return "memberlist of " + name + " cannot send", allML
	case 3:
		side := s.rng.Perm(n)[:n/2]
		in := func(i int) bool { return slices.Contains(side, i) }
		setML(func(i, j int) bool { return in(i) != in(j) }, false)
		return fmt.Sprintf("memberlist split %v | rest", side), allML
	case 4:
		// Memberlist runs over the same link, as in the lab.
		s.nodes[v].segUp = false
		setML(func(i, j int) bool { return i == v || j == v }, false)
		return "cable of " + name + " pulled", func() {
			s.nodes[v].segUp, s.nodes[v].upSince = true, s.now
			allML()
			// Carrier back: the speaker re-syncs at once (health.go).
			for j := range s.nodes {
				s.pushPull(v, j)
			}
		}
	default:
		s.nodes[v].kernelUp, s.nodes[v].segUp = false, false
		s.nodes[v].e = nil
		return name + " powered off", func() {
			s.nodes[v].kernelUp, s.nodes[v].segUp, s.nodes[v].upSince = true, true, s.now
			s.boot(v)
		}
	}
}

// addKey creates a Service (a new key) on every running replica.
func (s *sim) addKey() {
	k := fmt.Sprintf("10.0.1.%d", len(s.keys))
	s.keys = append(s.keys, k)
	s.logf("new key %s", k)
	for i, n := range s.nodes {
		if n.e != nil {
			s.check(i, n.e.SetKey(k, s.set))
		}
	}
}

// converged checks that every running replica holds the same claims and
// that each key is announced by exactly one node, whose data path is up.
func (s *sim) converged() string {
	var ref []Claim
	var refName string
	for _, n := range s.nodes {
		if n.e == nil {
			continue
		}
		c := n.e.Claims()
		if ref == nil {
			ref, refName = c, n.name
			continue
		}
		if !slices.Equal(c, ref) {
			return fmt.Sprintf("%s and %s disagree:\n  %v\n  %v", refName, n.name, ref, c)
		}
	}
	for _, k := range s.keys {
		var announcers []string
		for _, n := range s.nodes {
			if n.e == nil {
				continue
			}
			if o, serving := n.e.Owner(k); o == n.name && serving {
				announcers = append(announcers, n.name)
			}
		}
		if len(announcers) != 1 || !s.pathUp(announcers[0]) {
			return fmt.Sprintf("key %s announced by %v", k, announcers)
		}
	}
	return ""
}

// TestPartitionSimulation runs random single faults (memberlist cuts one
// way and both, splits, cable pulls, power-offs), each followed by a quiet
// period, over lossy gossip, and checks the invariants after every event.
func TestPartitionSimulation(t *testing.T) {
	seeds := uint64(40)
	if testing.Short() {
		seeds = 8
	}
	for seed := range seeds {
		s := newSim(t, seed, 3+int(seed%4), 3+int(seed%12))
		for range 200 { // settle: placement and gossip
			s.step()
		}
		if msg := s.converged(); msg != "" {
			s.fail("seed %d: not converged before any fault: %s", seed, msg)
		}
		for f := range 6 {
			what, heal := s.fault()
			d := time.Duration(1+s.rng.IntN(60)) * time.Second
			if strings.Contains(what, "cable") {
				d = time.Duration(1+s.rng.IntN(50)) * simStep
			}
			s.logf("fault %d: %s for %v", f, what, d)
			for end := s.now.Add(d); s.now.Before(end); {
				s.step()
				if s.rng.IntN(30) == 0 {
					s.addKey() // Services created during the fault
				}
			}
			heal()
			s.logf("healed: %s", what)
			// memberlist needs simRejoin to see a healed member again (its
			// push/pull follows at once); the data path is judged within
			// a probe round.
			healed := s.now
			for s.now.Sub(healed) < simRejoin+convergeWithin {
				s.step()
			}
			if msg := s.converged(); msg != "" {
				s.fail("seed %d: %v after %q healed: %s", seed, s.now.Sub(healed), what, msg)
			}
			for range 50 {
				s.step()
			}
		}
	}
}

// FuzzEngineInputs feeds a replica hostile claims and votes (any key, owner,
// watcher, epoch and sequence, in any order, with the clock moving) and
// checks what must hold whatever peers send: no panic, no epoch past
// MaxEpoch, bounded foreign claims, votes only from designated watchers, and
// nothing gossiped on that no Service here uses.
func FuzzEngineInputs(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add([]byte("claims and votes about nodes nobody knows"))
	f.Fuzz(func(t *testing.T, b []byte) {
		nodes := []string{"a", "b", "c", "d"}
		e, all := cluster(t, "a", Options{Hold: 30 * time.Second}, nodes...)
		e.SetKey("10.0.0.1", all)
		e.SetKey("10.0.0.2", all)
		now := t0
		name := func(x byte) string {
			if int(x)%8 < len(nodes) {
				return nodes[int(x)%8]
			}
			return fmt.Sprintf("stranger-%d", x)
		}
		for len(b) >= 4 {
			op, x, y, z := b[0], b[1], b[2], b[3]
			b = b[4:]
			epoch := uint64(z) << (8 * (uint(y) % 8))
			if y == 0xff {
				epoch = ^uint64(0)
			}
			switch op % 4 {
			case 0:
				e.Merge([]Claim{{Key: fmt.Sprintf("10.0.0.%d", x%4), Owner: name(y), Epoch: epoch}})
			case 1:
				e.Vote(Vote{Node: name(x), Watcher: name(y), Path: Path(z % 3), Seq: epoch}, now)
			case 2:
				e.SetSpeaker(name(x), Speaker(y%3), now)
			case 3:
				now = now.Add(time.Duration(x) * 100 * time.Millisecond)
				e.Tick(now)
			}
		}
		for _, c := range e.Claims() {
			if c.Epoch > MaxEpoch {
				t.Fatalf("claim %+v past MaxEpoch", c)
			}
			if _, active := e.keys[c.Key]; !active {
				if _, f := e.foreign[c.Key]; f {
					t.Fatalf("foreign claim %+v offered to peers", c)
				}
			}
		}
		if len(e.foreign) > maxForeignClaims {
			t.Fatalf("%d foreign claims kept", len(e.foreign))
		}
		for node, n := range e.nodes {
			if len(n.votes) > len(e.nodes) {
				t.Fatalf("%d votes kept on %s", len(n.votes), node)
			}
		}
	})
}
