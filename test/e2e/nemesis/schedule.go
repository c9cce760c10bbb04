// Package nemesis is the fault injector's plan and the checker's judgement for the lab's
// nemesis (issue 25, DESIGN.md section 5b), as pure code: a seeded schedule of random faults,
// one or two at a time, each saying which nodes' data paths are really down while it lasts;
// and the analysis of what a client on the segment recorded meanwhile (which MACs answered
// ARP/NDP for each Service IP, keep-alive breaks, failed new connections, owner changes)
// against that schedule. test/e2e's TestNemesis and BenchmarkChaos apply the faults in the
// lab and feed the records in; this package never touches a cluster, so its judgement is
// table-tested, including the cases where it must fail a run.
package nemesis

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The fault kinds of issue 25's list. What each does to the data path (the
// client -> node -> kube-proxy path the checker judges moves by) is in
// dataPathDown.
const (
	// CablePull takes the node's switch port down (carrier lost, processes alive).
	CablePull Kind = "cable-pull"
	// MemberlistCut drops the node's memberlist traffic both ways.
	MemberlistCut Kind = "memberlist-cut"
	// MemberlistDeaf drops the node's incoming memberlist traffic only.
	MemberlistDeaf Kind = "memberlist-in-loss"
	// MemberlistMute drops the node's outgoing memberlist traffic only.
	MemberlistMute Kind = "memberlist-out-loss"
	// Partition22 splits memberlist into two halves (Nodes is one half).
	Partition22 Kind = "partition-2|2"
	// Partition13 cuts one node's memberlist off from the three others by
	// rules on both sides (Nodes is the single node).
	Partition13 Kind = "partition-1|3"
	// SpeakerStop freezes the node's speaker with SIGSTOP, SIGCONT at the end.
	SpeakerStop Kind = "speaker-sigstop"
	// SpeakerKill SIGKILLs the node's speaker (the agent restarts it).
	SpeakerKill Kind = "speaker-kill"
	// NodeKill kills the node hard (every process, link down) and restores it.
	NodeKill Kind = "node-kill"
	// APIServerDown kills the API server and starts it again.
	APIServerDown Kind = "apiserver-down"
	// PacketLoss drops 30 % of the node's packets on its segment port.
	PacketLoss Kind = "loss-30%"
	// KeyRotation replaces the memberlist key in its Secret (instant; the
	// speakers' rotation runs its phases for minutes after it).
	KeyRotation Kind = "key-rotation"
	// KubeProxyDown kills the node's kube-proxy, its rules left in place (a
	// kube-proxy rolling update, a crash), and starts it again at the end:
	// its health endpoint refuses, its Services are still delivered.
	KubeProxyDown Kind = "kube-proxy-down"
)

// AllKinds is every kind the scheduler knows, in a fixed order (the seed's
// meaning depends on it).
// (KubeProxyDown, added last, changes what a seed may draw: a run before
// 2026-11-29 12:00 UTC replays exactly only at its own commit. TestNemesis's
// seed happens to draw the same schedule as before.)
var AllKinds = []Kind{CablePull, MemberlistCut, MemberlistDeaf, MemberlistMute, Partition22, Partition13,
	SpeakerStop, SpeakerKill, NodeKill, APIServerDown, PacketLoss, KeyRotation, KubeProxyDown}

// durations bounds each kind's length (issue 25's list where it gives one).
// A length of 0 is an instant fault (kill -9): its window is the time the
// system needs to show its reaction.
var durations = map[Kind][2]time.Duration{
	CablePull:      {100 * time.Millisecond, 5 * time.Second},
	MemberlistCut:  {2 * time.Second, 45 * time.Second},
	MemberlistDeaf: {2 * time.Second, 45 * time.Second},
	MemberlistMute: {2 * time.Second, 45 * time.Second},
	Partition22:    {2 * time.Second, 45 * time.Second},
	Partition13:    {2 * time.Second, 45 * time.Second},
	SpeakerStop:    {time.Second, 40 * time.Second},
	SpeakerKill:    {0, 0},
	NodeKill:       {2 * time.Second, 20 * time.Second},
	APIServerDown:  {10 * time.Second, 60 * time.Second},
	PacketLoss:     {5 * time.Second, 30 * time.Second},
	KeyRotation:    {0, 0},
	KubeProxyDown:  {time.Second, 20 * time.Second},
}

// ParseKinds reads a comma-separated list of kinds ("" or "all": AllKinds).
func ParseKinds(s string) ([]Kind, error) {
	if s == "" || s == "all" {
		return slices.Clone(AllKinds), nil
	}
	var out []Kind
	for _, f := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(f))
		if !slices.Contains(AllKinds, k) {
			return nil, fmt.Errorf("fault kind %q: want one of %v", k, AllKinds)
		}
		out = append(out, k)
	}
	return out, nil
}

// Fault is one fault of a schedule.
type Fault struct {
	Kind Kind
	// Nodes are the nodes it acts on: the victim, or one side of a
	// partition; none for APIServerDown.
	Nodes []string
	// Start is its offset from the start of its episode; Duration how long
	// it lasts (0: instant).
	Start, Duration time.Duration
	// DataPathDown are the nodes whose data path (ARP answers and
	// forwarding on the segment) is really down while it lasts: the
	// checker's truth for needless moves.
	DataPathDown []string
	// Impaired are the nodes that cannot take part in a majority while it
	// lasts (data path down, cut off or minority side, speaker frozen).
	Impaired []string
}

func (f Fault) String() string {
	s := fmt.Sprintf("+%.1fs %s", f.Start.Seconds(), f.Kind)
	if len(f.Nodes) > 0 {
		s += " " + strings.Join(f.Nodes, ",")
	}
	if f.Duration > 0 {
		s += fmt.Sprintf(" for %.1fs", f.Duration.Seconds())
	}
	if len(f.DataPathDown) > 0 {
		s += " (data path down: " + strings.Join(f.DataPathDown, ",") + ")"
	}
	return s
}

// Episode is one or two overlapping faults; episodes run one after the
// other, each followed by a quiet time to measure convergence.
type Episode struct{ Faults []Fault }

// Span is the time from the episode's start to its last fault's end.
func (ep Episode) Span() time.Duration {
	var end time.Duration
	for _, f := range ep.Faults {
		end = max(end, f.Start+f.Duration)
	}
	return end
}

// Options shape a schedule.
type Options struct {
	// Nodes are the cluster's nodes, Workers those that may be killed
	// (NodeKill never takes the control plane, which holds the API server).
	Nodes, Workers []string
	Kinds          []Kind
	// Duration is how long the faults and their quiet times take in all
	// (the last episode may end past it).
	Duration time.Duration
	// Quiet is the time after each episode's last heal before the next
	// starts (default 10 s).
	Quiet time.Duration
	// PairChance is the probability that an episode has two faults
	// (default 0.3).
	PairChance float64
	// MaxFaultDuration caps each fault's length (0: the kinds' own bounds).
	MaxFaultDuration time.Duration
}

// Schedule is a seeded list of episodes.
type Schedule struct {
	Seed     uint64
	Episodes []Episode
	// Quiet is the quiet time after each episode.
	Quiet time.Duration
}

// Generate draws a schedule from seed: the same seed and options give the
// same schedule, so a failing run is replayed with its seed.
func Generate(seed uint64, o Options) (Schedule, error) {
	if len(o.Nodes) < 2 {
		return Schedule{}, fmt.Errorf("nemesis needs at least 2 nodes, got %v", o.Nodes)
	}
	if len(o.Kinds) == 0 {
		o.Kinds = AllKinds
	}
	if o.Quiet <= 0 {
		o.Quiet = 10 * time.Second
	}
	if o.PairChance == 0 {
		o.PairChance = 0.3
	}
	nodes := slices.Sorted(slices.Values(o.Nodes))
	workers := slices.Sorted(slices.Values(o.Workers))
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := Schedule{Seed: seed, Quiet: o.Quiet}
	var total time.Duration
	for total < o.Duration || len(s.Episodes) == 0 {
		first, ok := draw(r, o, nodes, workers, nil)
		if !ok {
			return Schedule{}, fmt.Errorf("no fault of %v applies to nodes %v (workers %v)", o.Kinds, nodes, workers)
		}
		ep := Episode{Faults: []Fault{first}}
		if r.Float64() < o.PairChance {
			if second, ok := draw(r, o, nodes, workers, first.Nodes); ok && !apiConflict(first.Kind, second.Kind) {
				// It starts while the first one lasts.
				second.Start = time.Duration(r.Int64N(int64(first.Duration) + 1))
				ep.Faults = append(ep.Faults, second)
			}
		}
		s.Episodes = append(s.Episodes, ep)
		total += ep.Span() + o.Quiet
	}
	return s, nil
}

// apiConflict: two faults that cannot overlap because both act on the API
// server (a key rotation writes a Secret; the API server down refuses it).
func apiConflict(a, b Kind) bool {
	api := func(k Kind) bool { return k == APIServerDown || k == KeyRotation }
	return api(a) && api(b)
}

// draw picks one fault whose nodes are disjoint from busy (the nodes of the
// other fault of the episode), or reports that none fits.
func draw(r *rand.Rand, o Options, nodes, workers, busy []string) (Fault, bool) {
	free := without(nodes, busy)
	freeWorkers := without(workers, busy)
	var fits []Kind
	for _, k := range o.Kinds {
		switch k {
		case Partition22, Partition13:
			// Rules on every node: alone, and a majority side exists to
			// split off only with 3+ nodes.
			if len(busy) == 0 && len(nodes) >= 3 {
				fits = append(fits, k)
			}
		case NodeKill:
			if len(freeWorkers) > 0 {
				fits = append(fits, k)
			}
		case APIServerDown, KeyRotation:
			fits = append(fits, k)
		default:
			if len(free) > 0 {
				fits = append(fits, k)
			}
		}
	}
	if len(fits) == 0 {
		return Fault{}, false
	}
	k := fits[r.IntN(len(fits))]
	b := durations[k]
	if o.MaxFaultDuration > 0 {
		b[1] = min(b[1], o.MaxFaultDuration)
		b[0] = min(b[0], b[1])
	}
	// Milliseconds: a printed schedule reads back exactly.
	d := b[0]
	if b[1] > b[0] {
		d += time.Duration(r.Int64N(int64(b[1]-b[0])/int64(time.Millisecond)+1)) * time.Millisecond
	}
	f := Fault{Kind: k, Duration: d}
	switch k {
	case Partition22:
		perm := r.Perm(len(nodes))
		for _, i := range perm[:len(nodes)/2] {
			f.Nodes = append(f.Nodes, nodes[i])
		}
		slices.Sort(f.Nodes)
	case NodeKill:
		f.Nodes = []string{freeWorkers[r.IntN(len(freeWorkers))]}
	case APIServerDown, KeyRotation:
	default:
		f.Nodes = []string{free[r.IntN(len(free))]}
	}
	f.DataPathDown, f.Impaired = effects(k, f.Nodes, nodes)
	return f, true
}

// effects says which nodes' data paths a fault of kind k on victims takes
// down, and which nodes it takes out of the majority.
func effects(k Kind, victims, nodes []string) (down, impaired []string) {
	switch k {
	case CablePull, NodeKill:
		return slices.Clone(victims), slices.Clone(victims)
	case MemberlistCut, MemberlistDeaf, MemberlistMute, Partition13, SpeakerStop:
		// The data path is up; the speaker is cut off or frozen.
		return nil, slices.Clone(victims)
	case Partition22:
		// Neither side is a majority: every node is impaired.
		return nil, slices.Clone(nodes)
	}
	// SpeakerKill (restarted at once), APIServerDown, PacketLoss (30 % loss
	// still carries traffic), KeyRotation, KubeProxyDown (its rules still
	// forward): nobody's data path is down.
	return nil, nil
}

func without(list, drop []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// String prints the schedule, one line per fault, with the seed to replay it.
func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nemesis schedule, seed %d (replay: E2E_NEMESIS_SEED=%d), %d episodes, quiet %v after each:\n", s.Seed, s.Seed, len(s.Episodes), s.Quiet)
	for i, ep := range s.Episodes {
		for j, f := range ep.Faults {
			lead := fmt.Sprintf("  episode %2d:", i+1)
			if j > 0 {
				lead = strings.Repeat(" ", len(lead))
			}
			fmt.Fprintf(&b, "%s %s\n", lead, f)
		}
	}
	return b.String()
}
