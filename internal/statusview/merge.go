package statusview

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/ownership"
)

// Source is one speaker's answer: its snapshot, or why there is none.
type Source struct {
	Node     string    `json:"node"`
	Pod      string    `json:"pod"`
	Snapshot *Snapshot `json:"-"`
	Err      string    `json:"error,omitempty"`
}

// Report is every speaker's view merged, with the problems found.
type Report struct {
	Time       time.Time       `json:"time"`
	Speakers   []SpeakerStatus `json:"speakers"`
	Membership Membership      `json:"membership"`
	Services   []ServiceStatus `json:"services"`
	// Changes are the recent owner changes of the Services shown, newest
	// first, one entry per transition whichever speakers saw it.
	Changes []Change `json:"changes,omitempty"`
	// Drains are the planned moves in their drain period, by new owner.
	Drains   []NodeDrain `json:"drains,omitempty"`
	Problems []Problem   `json:"problems,omitempty"`
}

// NodeDrain is a drain (Drain) with the node running it.
type NodeDrain struct {
	Node string `json:"node"`
	Drain
}

// Forwarded is what the drains of a report forward to one node.
type Forwarded struct {
	Drains int // drains forwarding to the node
	Flows  int // connections they forwarded within the last 2 minutes
	// ByNode splits Flows by the node forwarding them.
	ByNode map[string]int
	Until  time.Time // the end of the last drain
}

// ForwardedTo sums what the drains of r forward to node.
func (r Report) ForwardedTo(node string) Forwarded {
	f := Forwarded{ByNode: map[string]int{}}
	for _, d := range r.Drains {
		if d.From != node {
			continue
		}
		f.Drains++
		f.Flows += d.ForwardedFlows
		f.ByNode[d.Node] += d.ForwardedFlows
		if d.Until.After(f.Until) {
			f.Until = d.Until
		}
	}
	return f
}

// SpeakerStatus is one speaker pod and whether it answered.
type SpeakerStatus struct {
	Node   string `json:"node"`
	Pod    string `json:"pod"`
	Synced bool   `json:"synced"`
	Error  string `json:"error,omitempty"`
}

// Membership compares the speakers' memberlist views.
type Membership struct {
	// Agree: every synced speaker sees the same members.
	Agree bool   `json:"agree"`
	Views []View `json:"views,omitempty"`
}

// View is one speaker's members (suspects included, marked in Suspect).
type View struct {
	Node    string   `json:"node"`
	Members []string `json:"members"`
	Suspect []string `json:"suspect,omitempty"`
}

// ServiceStatus is one Service across the speakers.
type ServiceStatus struct {
	Name   string   `json:"name"`
	IPs    []string `json:"ips,omitempty"`
	Pool   string   `json:"pool,omitempty"`
	Reason string   `json:"reason,omitempty"`
	Owner  string   `json:"owner,omitempty"`
	Epoch  uint64   `json:"epoch,omitempty"`
	// Announcer is the node whose MAC answers for the IPs: the owner, when
	// its speaker announces or, held, its deputy answers for it.
	Announcer string `json:"announcer,omitempty"`
	// Nodes: the candidates in election order (owner first), then the
	// nodes the configuration leaves out, by name.
	Nodes []NodeStatus `json:"nodes,omitempty"`
	// Problems are the kinds of the problems found for this Service.
	Problems []string `json:"problems,omitempty"`
}

// NodeStatus is one node's part in a Service.
type NodeStatus struct {
	Node string `json:"node"`
	// State is what the node does for the Service (State* constants) or
	// why the configuration leaves it out (election.Node* reasons).
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
}

// What a node does for a Service, or why a candidate does not announce.
const (
	StateAnnouncing = "announcing"
	// StateHeld: the owner's speaker is away; its deputy answers for it.
	StateHeld = "held"
	// StateOwnerNotAnnouncing: it owns the key but its speaker does not
	// announce it (a problem).
	StateOwnerNotAnnouncing = "ownerNotAnnouncing"
	// StateStandby: a live candidate; ownership is sticky, so it waits.
	StateStandby      = "standby"
	StateNotMember    = "notMember"
	StateSuspect      = "suspect"
	StateDataPathDown = "dataPathDown"
	// StateUnhealthy: its kernel answers, but a majority of its watchers
	// find its kube-proxy unhealthy: it owns and takes no IP.
	StateUnhealthy = "unhealthy"
	// StateNotYetHealthy: a live member its watchers have not yet found
	// delivering (kube-proxy healthy for --healthy-after): it takes no IP.
	StateNotYetHealthy    = "notYetHealthy"
	StateInterfaceMissing = "interfaceMissing"
)

// Problem is something wrong; any problem makes `ironlb status` exit 1.
type Problem struct {
	Kind    string `json:"kind"`
	Service string `json:"service,omitempty"`
	Message string `json:"message"`
}

// Problem kinds.
const (
	ProblemNoAnnouncer        = "noAnnouncer"
	ProblemMultipleAnnouncers = "multipleAnnouncers"
	ProblemOwnerDisagreement  = "ownerDisagreement"
	ProblemConflict           = "conflict"
	ProblemInterfaceMissing   = "interfaceMissing"
	ProblemSplitMembership    = "splitMembership"
	ProblemSpeakerUnreachable = "speakerUnreachable"
	// ProblemNoQuorum: a speaker sees fewer than a majority of the known
	// speakers (it is cut off, or too many are away): it only learns.
	ProblemNoQuorum = "noQuorum"
	// ProblemNotAnswering: a speaker says it answers for none of its IPs
	// (no valid configuration); its deputy answers for them meanwhile.
	ProblemNotAnswering = "notAnswering"
)

// Merge combines the speakers' answers into a report. It is pure: the
// same sources give the same report.
func Merge(now time.Time, sources []Source) Report {
	srcs := slices.Clone(sources)
	slices.SortFunc(srcs, func(a, b Source) int { return strings.Compare(a.Node+"/"+a.Pod, b.Node+"/"+b.Pod) })
	r := Report{Time: now, Speakers: []SpeakerStatus{}, Services: []ServiceStatus{}}
	byNode := map[string]*Snapshot{}
	var synced []*Snapshot
	for _, s := range srcs {
		st := SpeakerStatus{Node: s.Node, Pod: s.Pod, Error: s.Err}
		if s.Snapshot != nil {
			st.Synced = s.Snapshot.Synced
			byNode[s.Snapshot.Node] = s.Snapshot
			if s.Snapshot.Synced {
				synced = append(synced, s.Snapshot)
			}
		}
		if s.Err != "" {
			r.Problems = append(r.Problems, Problem{Kind: ProblemSpeakerUnreachable,
				Message: fmt.Sprintf("speaker %s on node %s: %s", s.Pod, s.Node, s.Err)})
		}
		r.Speakers = append(r.Speakers, st)
	}
	r.Membership = membership(synced)
	if !r.Membership.Agree {
		r.Problems = append(r.Problems, Problem{Kind: ProblemSplitMembership,
			Message: "the speakers' memberlist views differ: " + describeViews(r.Membership.Views)})
	}
	r.Problems = append(r.Problems, speakerProblems(synced)...)
	for _, name := range serviceNames(synced) {
		ss, probs := mergeService(name, synced, byNode)
		r.Services = append(r.Services, ss...)
		r.Problems = append(r.Problems, probs...)
	}
	r.Changes = mergeChanges(srcs)
	for _, s := range srcs {
		if s.Snapshot != nil {
			for _, d := range s.Snapshot.Drains {
				r.Drains = append(r.Drains, NodeDrain{Node: s.Snapshot.Node, Drain: d})
			}
		}
	}
	return r
}

// speakerProblems reports the synced speakers that do not act for want of
// quorum, and the members that say they answer for nothing, once each.
func speakerProblems(synced []*Snapshot) []Problem {
	var out []Problem
	notAnswering := map[string]bool{}
	for _, s := range synced {
		// KnownMembers is 0 in the snapshot of a speaker that predates the
		// quorum: no verdict on it.
		if s.Memberlist && s.KnownMembers > 0 && !s.Quorum {
			out = append(out, Problem{Kind: ProblemNoQuorum, Message: fmt.Sprintf(
				"speaker %s sees %d of %d known speakers or fewer: without a majority it places and moves nothing",
				s.Node, countAlive(s.Members), s.KnownMembers)})
		}
		for _, m := range s.Members {
			if m.NotAnswering && !notAnswering[m.Name] {
				notAnswering[m.Name] = true
				out = append(out, Problem{Kind: ProblemNotAnswering, Message: fmt.Sprintf(
					"speaker %s answers for none of its IPs (starting, or no valid configuration: see its ConfigurationState); its deputy answers for them", m.Name)})
			}
		}
	}
	slices.SortFunc(out, func(a, b Problem) int { return strings.Compare(a.Kind+a.Message, b.Kind+b.Message) })
	return out
}

func countAlive(ms []Member) int {
	n := 0
	for _, m := range ms {
		if !m.NotAnswering {
			n++
		}
	}
	return n
}

// membership compares the member sets of the synced memberlist speakers.
func membership(synced []*Snapshot) Membership {
	m := Membership{Agree: true}
	var first []string
	for _, s := range synced {
		if !s.Memberlist {
			continue
		}
		v := View{Node: s.Node, Members: []string{}}
		for _, mb := range s.Members {
			v.Members = append(v.Members, mb.Name)
			if mb.State == SpeakerSuspect {
				v.Suspect = append(v.Suspect, mb.Name)
			}
		}
		slices.Sort(v.Members)
		if first == nil {
			first = v.Members
		} else if !slices.Equal(first, v.Members) {
			m.Agree = false
		}
		m.Views = append(m.Views, v)
	}
	return m
}

func describeViews(views []View) string {
	parts := make([]string, 0, len(views))
	for _, v := range views {
		parts = append(parts, fmt.Sprintf("%s sees [%s]", v.Node, strings.Join(v.Members, " ")))
	}
	return strings.Join(parts, "; ")
}

func serviceNames(synced []*Snapshot) []string {
	set := map[string]struct{}{}
	for _, s := range synced {
		for _, svc := range s.Services {
			set[svc.Name] = struct{}{}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// view is one speaker's entry for a Service.
type view struct {
	snap *Snapshot
	svc  Service
}

// mergeService merges the speakers' entries for one Service: one status,
// or one per address slot of a Service with several (Service.Slots), each
// merged as a Service of that slot's IPs alone, with its own announcer.
// Slots are matched across speakers by their IPs (a speaker whose view of
// the Service's IPs lags shows other slots, left out of that slot's merge).
func mergeService(name string, synced []*Snapshot, byNode map[string]*Snapshot) ([]ServiceStatus, []Problem) {
	var views []view
	for _, s := range synced {
		if i, ok := slices.BinarySearchFunc(s.Services, name, func(x Service, n string) int { return strings.Compare(x.Name, n) }); ok {
			views = append(views, view{s, s.Services[i]})
		}
	}
	if len(views[0].svc.Slots) == 0 {
		ss, probs := mergeViews(name, views, synced, byNode, false)
		return []ServiceStatus{ss}, probs
	}
	var out []ServiceStatus
	var probs []Problem
	for i, sl := range views[0].svc.Slots {
		var slot []view
		for j, v := range views {
			if j == 0 {
				slot = append(slot, view{v.snap, v.svc.slotService(i)})
				continue
			}
			if k := slices.IndexFunc(v.svc.Slots, func(o Slot) bool { return slices.Equal(o.IPs, sl.IPs) }); k >= 0 {
				slot = append(slot, view{v.snap, v.svc.slotService(k)})
			}
		}
		ss, p := mergeViews(name, slot, synced, byNode, true)
		out = append(out, ss)
		probs = append(probs, p...)
	}
	return out, probs
}

// mergeViews merges the speakers' entries for one Service (or address
// slot). The reference view, whose owner and node states explain the
// candidates, is the owner's own speaker when it answered, else the first
// synced speaker by name. slot: the views are of one of the Service's
// address slots, which its problems' messages name by IP.
func mergeViews(name string, views []view, synced []*Snapshot, byNode map[string]*Snapshot, slot bool) (ServiceStatus, []Problem) {
	ref := views[0]
	for _, v := range views {
		if v.snap.Node == ref.svc.Owner {
			ref = v
			break
		}
	}
	ss := ServiceStatus{Name: name, IPs: ref.svc.IPs, Pool: ref.svc.Pool, Reason: ref.svc.Reason, Owner: ref.svc.Owner, Epoch: ref.svc.Epoch}
	var probs []Problem
	problem := func(kind, format string, args ...any) {
		if !slices.Contains(ss.Problems, kind) {
			ss.Problems = append(ss.Problems, kind)
		}
		msg := fmt.Sprintf(format, args...)
		if slot {
			// Which of the Service's slots.
			msg = strings.Join(ss.IPs, ",") + ": " + msg
		}
		probs = append(probs, Problem{Kind: kind, Service: name, Message: msg})
	}

	// Do the speakers agree on the owner?
	owners := map[string][]string{}
	for _, v := range views {
		if v.svc.Reason == "" {
			owners[v.svc.Owner] = append(owners[v.svc.Owner], v.snap.Node)
		}
	}
	if len(owners) > 1 {
		var parts []string
		for _, o := range slices.Sorted(maps.Keys(owners)) {
			parts = append(parts, fmt.Sprintf("%s says %s", strings.Join(owners[o], ","), orNone(o)))
		}
		problem(ProblemOwnerDisagreement, "the speakers disagree on the owner: %s", strings.Join(parts, "; "))
	}

	// Who answers?
	var announcing []string
	for _, v := range views {
		if v.svc.Announcing {
			announcing = append(announcing, v.snap.Node)
		}
		if c := v.svc.Conflict; c != nil {
			problem(ProblemConflict, "node %s announces %s but host %s also answers for it on %s (last seen %s)",
				v.snap.Node, c.IP, c.MAC, c.Interface, c.Last.UTC().Format(time.RFC3339))
		}
	}
	nodes := nodeIndex(ref.snap)
	owner := nodes[ss.Owner]
	deputy := proxiedBy(synced, ss.Owner, ref.svc.Key())
	switch {
	case len(announcing) == 1:
		ss.Announcer = announcing[0]
	case len(announcing) > 1:
		problem(ProblemMultipleAnnouncers, "several nodes announce it: %s", strings.Join(announcing, ", "))
	case ref.svc.Serving && owner.Held && deputy != "":
		ss.Announcer = ss.Owner
	case ss.Reason == "" && len(ref.svc.Candidates) > 0:
		problem(ProblemNoAnnouncer, "no node announces it although %d node(s) may: %s", len(ref.svc.Candidates), noAnnouncerCause(ref, owner))
	}
	if ss.Announcer != "" {
		if a := byNode[ss.Announcer]; a != nil {
			if i := slices.IndexFunc(a.Services, func(x Service) bool { return x.Name == name }); i >= 0 && a.Services[i].MissingInterfaces {
				problem(ProblemInterfaceMissing, "announcer %s has none of the advertisement's interfaces %v", ss.Announcer, a.Services[i].Interfaces)
			}
		}
	}

	// The candidates in election order, the owner first.
	order := slices.Clone(ref.svc.Candidates)
	if i := slices.Index(order, ss.Owner); i > 0 {
		order = append(append([]string{ss.Owner}, order[:i]...), order[i+1:]...)
	}
	next := true
	for _, n := range order {
		st := candidateState(n, ss, ref, nodes, byNode, announcing, deputy)
		if st.State == StateStandby && next && ss.Owner != "" && n != ss.Owner {
			st.Detail = "takes over if " + ss.Owner + " fails"
			next = false
		}
		ss.Nodes = append(ss.Nodes, st)
	}
	for _, n := range slices.Sorted(maps.Keys(ref.svc.Excluded)) {
		ss.Nodes = append(ss.Nodes, NodeStatus{Node: n, State: ref.svc.Excluded[n], Detail: exclusionDetail(ref.svc.Excluded[n])})
	}
	return ss, probs
}

// candidateState says what candidate n does for the Service.
func candidateState(n string, ss ServiceStatus, ref view, nodes map[string]Node, byNode map[string]*Snapshot, announcing []string, deputy string) NodeStatus {
	nd, known := nodes[n]
	own := byNode[n]
	var mine *Service
	if own != nil {
		if i := slices.IndexFunc(own.Services, func(x Service) bool { return x.Name == ss.Name }); i >= 0 {
			mine = &own.Services[i]
		}
	}
	switch {
	case slices.Contains(announcing, n):
		return NodeStatus{Node: n, State: StateAnnouncing, Detail: fmt.Sprintf("owner, epoch %d", ss.Epoch)}
	case n == ss.Owner && nd.Held:
		d := "speaker away, hold time running"
		if deputy != "" {
			d += "; deputy " + deputy + " answers with its MAC"
		}
		return NodeStatus{Node: n, State: StateHeld, Detail: d}
	case !known || nd.Speaker == SpeakerGone:
		return NodeStatus{Node: n, State: StateNotMember, Detail: "no live speaker in " + ref.snap.Node + "'s view"}
	case nd.Path == PathDown:
		return NodeStatus{Node: n, State: StateDataPathDown, Detail: "its kernel stopped answering on the segment"}
	case nd.Path == PathUnhealthy:
		return NodeStatus{Node: n, State: StateUnhealthy, Detail: "excluded: kube-proxy unhealthy since " + nd.PathSince + " (a majority of its watchers)"}
	case mine != nil && mine.MissingInterfaces:
		return NodeStatus{Node: n, State: StateInterfaceMissing, Detail: fmt.Sprintf("none of %v exists on the node", mine.Interfaces)}
	case nd.Speaker == SpeakerSuspect:
		return NodeStatus{Node: n, State: StateSuspect, Detail: "memberlist suspects it"}
	case n != ss.Owner && nd.NotPlaceable && nd.Path == PathUnknown:
		return NodeStatus{Node: n, State: StateNotYetHealthy, Detail: "its watchers have not yet found it delivering (kube-proxy healthy for --healthy-after)"}
	case n == ss.Owner:
		return NodeStatus{Node: n, State: StateOwnerNotAnnouncing, Detail: "owns the IP but its speaker does not announce it"}
	}
	return NodeStatus{Node: n, State: StateStandby}
}

// noAnnouncerCause says why nobody answers, from the reference view.
func noAnnouncerCause(ref view, owner Node) string {
	switch {
	case ref.svc.Owner == "":
		return "no candidate is a live member (" + ref.snap.Node + "'s view)"
	case !ref.svc.Serving:
		return "owner " + ref.svc.Owner + " may not serve it and no candidate can take it"
	case owner.Held:
		return "owner " + ref.svc.Owner + " is held and no deputy answers for it"
	}
	return "owner " + ref.svc.Owner + "'s speaker does not announce it"
}

// proxiedBy returns the deputy answering for a held owner's key, if any.
func proxiedBy(synced []*Snapshot, owner, key string) string {
	if owner == "" || key == "" {
		return ""
	}
	for _, s := range synced {
		for _, p := range s.Proxies {
			if p.Node == owner && slices.Contains(p.IPs, key) {
				return s.Node
			}
		}
	}
	return ""
}

func nodeIndex(s *Snapshot) map[string]Node {
	out := make(map[string]Node, len(s.Nodes))
	for _, n := range s.Nodes {
		out[n.Name] = n
	}
	return out
}

// exclusionDetail says what to look at for a configuration reason.
func exclusionDetail(reason string) string {
	switch reason {
	case election.NodeExcludedByLabel:
		return "node label " + corev1.LabelNodeExcludeBalancers
	case election.NodeDrained:
		return "node annotation " + election.DrainAnnotation + " (kubectl ironlb undrain NODE)"
	case election.NodeNetworkUnavailable:
		return "node condition NetworkUnavailable=True"
	case election.NodeNoLocalEndpoint:
		return "externalTrafficPolicy Local and no ready endpoint on the node"
	case election.NodeNotSelected:
		return "no L2Advertisement of the pool selects the node (nodeSelectors)"
	}
	return ""
}

// mergeChanges returns the transitions every speaker recorded, once each
// (key, epoch, new owner), newest first. The decider's record (a reason
// other than learned) wins over a peer's "learned".
func mergeChanges(srcs []Source) []Change {
	type id struct {
		key   string
		epoch uint64
		to    string
	}
	seen := map[id]int{}
	var out []Change
	for _, s := range srcs {
		if s.Snapshot == nil {
			continue
		}
		for _, c := range s.Snapshot.Changes {
			k := id{c.Key, c.Epoch, c.To}
			i, ok := seen[k]
			switch {
			case !ok:
				seen[k] = len(out)
				out = append(out, c)
			case out[i].Reason == learned && c.Reason != learned:
				out[i] = c
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Change) int {
		if c := b.Time.Compare(a.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out
}

// learned is the reason of a change a speaker took from a peer's claim.
const learned = string(ownership.ReasonLearned)

// ExitCode is `ironlb status`'s exit code for the report: 1 when a problem
// was found, else 0.
func (r Report) ExitCode() int {
	if len(r.Problems) > 0 {
		return 1
	}
	return 0
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
