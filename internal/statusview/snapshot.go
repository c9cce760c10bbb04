// Package statusview is what `ironlb status` (kubectl ironlb status) shows:
// the snapshot each speaker serves of what it sees, and the pure merge of
// every speaker's snapshot into one report with the problems found.
//
// A speaker's snapshot is read, never recomputed: the ownership engine's
// claims and node states, the memberlist view, what the announcer was told,
// conflicts and recent owner changes are copied out as they are. Only the
// per-node reasons a node left out by the configuration (election.Explain)
// are derived, by the speaker, from its own informer cache.
package statusview

import (
	"net/netip"
	"time"
)

// SchemaVersion is the version of Snapshot's JSON form. A reader refuses a
// snapshot of another version rather than misread it; fields are only ever
// added within a version.
const SchemaVersion = 1

// Path is where a speaker serves its Snapshot: on its health server, to
// loopback clients only (`ironlb status --local` in its container).
const Path = "/status"

// Snapshot is one speaker's view (GET /status on its health server,
// `ironlb status --local`).
type Snapshot struct {
	SchemaVersion int       `json:"schemaVersion"`
	Node          string    `json:"node"`
	Time          time.Time `json:"time"`
	// Synced: the speaker decides ownership (false while it starts and
	// learns the current owners from its peers).
	Synced bool `json:"synced"`
	// Memberlist: false with --disable-memberlist (liveness is the Nodes'
	// Ready condition; there are no members to compare).
	Memberlist bool `json:"memberlist"`
	// HealthScore is memberlist's Lifeguard score of this speaker (0 is
	// healthy; higher means it is missing acks itself).
	HealthScore int `json:"healthScore,omitempty"`
	// Quorum: it sees a majority of the known membership (KnownMembers)
	// alive; Acting: it makes ownership decisions (synced, with quorum,
	// trusting its own view). A speaker that does not act only learns.
	Quorum       bool `json:"quorum"`
	Acting       bool `json:"acting"`
	KnownMembers int  `json:"knownMembers,omitempty"`
	// Members is this speaker's memberlist view, sorted by name.
	Members []Member `json:"members,omitempty"`
	// Nodes is what this speaker's ownership engine knows of every node.
	Nodes []Node `json:"nodes,omitempty"`
	// Interfaces are the interfaces this node answers ARP/NDP on.
	Interfaces []string `json:"interfaces,omitempty"`
	// Services are the LoadBalancer Services the speaker knows (those the
	// filter selected), sorted by name.
	Services []Service `json:"services"`
	// Proxies are the held nodes this node answers for with their MAC.
	Proxies []Proxy `json:"proxies,omitempty"`
	// Changes are this speaker's recent owner changes, oldest first.
	Changes []Change `json:"changes,omitempty"`
	// Drains are the planned moves to this node in their drain period,
	// sorted by key: it forwards the TCP connections it did not see start
	// to their previous owner.
	Drains []Drain `json:"drains,omitempty"`
	// Surveyed is how many of the IPs it announces this speaker asked the
	// segment about (Filter.Segment), and Unsurveyed how many it left out
	// (MaxSurvey).
	Surveyed   int `json:"surveyed,omitempty"`
	Unsurveyed int `json:"unsurveyed,omitempty"`
}

// MaxSurvey bounds the IPs one speaker asks the segment about for one
// status call; name a Service or an IP to ask about others.
const MaxSurvey = 512

// Member is one memberlist member.
type Member struct {
	Name  string `json:"name"`
	Addr  string `json:"addr,omitempty"`
	State string `json:"state"` // alive or suspect
	// NotAnswering: it says it does not answer for its IPs (starting, or
	// without a valid configuration); it is held like a speaker that is away.
	NotAnswering bool `json:"notAnswering,omitempty"`
}

// Node is what a speaker's ownership engine knows of one node.
type Node struct {
	Name string `json:"name"`
	// Speaker: alive, suspect or gone (not a member).
	Speaker string `json:"speaker"`
	// Path: the data-path verdict, up, down, unhealthy (its kernel answers
	// but its kube-proxy does not deliver) or unknown (not probed, or not
	// yet found delivering); PathSince: when it last changed (RFC 3339).
	Path      string `json:"path"`
	PathSince string `json:"pathSince,omitempty"`
	// NotPlaceable: it cannot take a new IP now (not a member, data path
	// down or unhealthy, or, where health checks are on, not yet found
	// delivering). Absent in a snapshot of an earlier release.
	NotPlaceable bool `json:"notPlaceable,omitempty"`
	// Held: its speaker is away but it keeps its IPs (hold time running,
	// data path not down); Deputy answers for it.
	Held   bool   `json:"held,omitempty"`
	Deputy string `json:"deputy,omitempty"`
	// Owned is how many keys it owns.
	Owned int `json:"owned"`
	// Votes are its watchers' findings on its data path this speaker
	// holds, by watcher (up, down, unknown).
	Votes map[string]string `json:"votes,omitempty"`
}

// Node speaker states and data-path verdicts, as ownership spells them.
const (
	SpeakerAlive   = "alive"
	SpeakerSuspect = "suspect"
	SpeakerGone    = "gone"
	PathDown       = "down"
	PathUnhealthy  = "unhealthy"
	PathUnknown    = "unknown"
)

// Service is what a speaker knows of one LoadBalancer Service.
type Service struct {
	// Name is namespace/name.
	Name string   `json:"name"`
	IPs  []string `json:"ips,omitempty"`
	Pool string   `json:"pool,omitempty"`
	// Reason no node announces the Service; "" when some node may.
	Reason string `json:"reason,omitempty"`
	// Owner and Epoch are this speaker's replica of the key's claim;
	// Serving says whether the owner may keep it (eligible, not down, not
	// away past the hold time).
	Owner   string `json:"owner,omitempty"`
	Epoch   uint64 `json:"epoch,omitempty"`
	Serving bool   `json:"serving,omitempty"`
	// Candidates are the nodes the configuration allows, in election order:
	// the highest preference score first (preferredNodeSelectors), then the
	// hash order of the key, in which they take a failed owner's IP.
	Candidates []string `json:"candidates,omitempty"`
	// Excluded are the other nodes, with why the configuration leaves them
	// out (election.Node* reasons).
	Excluded map[string]string `json:"excluded,omitempty"`
	// Announcing: this node answers ARP/NDP for the IPs.
	Announcing bool `json:"announcing,omitempty"`
	// Interfaces this node answers on when it owns the Service (none
	// listed: AllInterfaces); MissingInterfaces: none of them exists here.
	AllInterfaces     bool     `json:"allInterfaces,omitempty"`
	Interfaces        []string `json:"interfaces,omitempty"`
	MissingInterfaces bool     `json:"missingInterfaces,omitempty"`
	// Conflict is the last other host seen answering for an IP this node
	// announces (kept for a minute).
	Conflict *Conflict `json:"conflict,omitempty"`
	// Slots, for a Service with several addresses per family
	// (ironlb.io/address-count), are its address slots, each with its own
	// owner; Owner, Epoch, Serving and Candidates above are then the first
	// slot's, and Announcing says this node announces any slot.
	Slots []Slot `json:"slots,omitempty"`
}

// Slot is one address slot of a Service: the IPs (one per family) one node
// announces, with this speaker's replica of their key's claim.
type Slot struct {
	IPs        []string `json:"ips"`
	Owner      string   `json:"owner,omitempty"`
	Epoch      uint64   `json:"epoch,omitempty"`
	Serving    bool     `json:"serving,omitempty"`
	Announcing bool     `json:"announcing,omitempty"`
	Candidates []string `json:"candidates,omitempty"`
}

// AnnouncedIPs are the IPs this speaker answers for: all of them, or those
// of the slots it announces.
func (s Service) AnnouncedIPs() []string {
	if len(s.Slots) == 0 {
		if s.Announcing {
			return s.IPs
		}
		return nil
	}
	var out []string
	for _, sl := range s.Slots {
		if sl.Announcing {
			out = append(out, sl.IPs...)
		}
	}
	return out
}

// slotService is the Service as its slot i alone: the entry a speaker would
// give a Service with only that slot's IPs.
func (s Service) slotService(i int) Service {
	sl := s.Slots[i]
	s.IPs, s.Owner, s.Epoch, s.Serving, s.Announcing, s.Candidates = sl.IPs, sl.Owner, sl.Epoch, sl.Serving, sl.Announcing, sl.Candidates
	s.Slots = nil
	return s
}

// Key is the Service's ownership key, its smallest IP (IPv4 before IPv6),
// as the speaker's.
func (s Service) Key() string {
	var key netip.Addr
	for _, ip := range s.IPs {
		if a, err := netip.ParseAddr(ip); err == nil && (!key.IsValid() || a.Less(key)) {
			key = a
		}
	}
	if !key.IsValid() {
		return ""
	}
	return key.String()
}

// Conflict is another host answering for an announced IP.
type Conflict struct {
	IP        string    `json:"ip"`
	MAC       string    `json:"mac"`
	Interface string    `json:"interface"`
	Last      time.Time `json:"last"`
}

// Proxy is a held node a deputy answers for.
type Proxy struct {
	Node string   `json:"node"`
	IPs  []string `json:"ips"`
}

// Drain is one planned move in its drain period, as its new owner runs it.
type Drain struct {
	Key string `json:"key"`
	// From is the previous owner, which the connections are forwarded to.
	From  string    `json:"from"`
	IPs   []string  `json:"ips"`
	Until time.Time `json:"until"`
	// ForwardedFlows counts the connections forwarded to From within the
	// last 2 minutes (the kernel's forwarded-flow sets).
	ForwardedFlows int `json:"forwardedFlows"`
}

// Change is one key changing owner, as a speaker saw it.
type Change struct {
	Time     time.Time `json:"time"`
	Key      string    `json:"key"`
	Services []string  `json:"services,omitempty"`
	From     string    `json:"from,omitempty"`
	To       string    `json:"to"`
	Epoch    uint64    `json:"epoch"`
	// Reason is ownership's: placed, ownerDataPathDown, holdExpired,
	// ownerIneligible, failback, or learned (from a peer's claim).
	Reason string `json:"reason"`
}

// Filter selects Services: by namespace/name, or by one of their IPs.
type Filter struct {
	Service string `json:"service,omitempty"`
	IP      string `json:"ip,omitempty"`
	// Segment: the speaker also asks the segment who answers for the IPs
	// it announces (ARP/NDP probes, broadcast); another host answering is
	// reported as the Service's Conflict.
	Segment bool `json:"segment,omitempty"`
}

// Match reports whether a Service with name and ips passes the filter.
func (f Filter) Match(name string, ips []string) bool {
	if f.Service != "" && f.Service != name {
		return false
	}
	if f.IP != "" {
		for _, ip := range ips {
			if ip == f.IP {
				return true
			}
		}
		return false
	}
	return true
}
