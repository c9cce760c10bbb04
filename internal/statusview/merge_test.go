package statusview

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ironlb/ironlb/internal/election"
)

var t0 = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

const vip = "172.18.255.200"

// cluster builds the snapshots of speakers w1..w3 (cp excluded by label)
// that agree: w1 owns and announces default/svc1, hash order w1, w3, w2.
func cluster() map[string]*Snapshot {
	out := map[string]*Snapshot{}
	for _, n := range []string{"w1", "w2", "w3"} {
		out[n] = &Snapshot{
			SchemaVersion: SchemaVersion, Node: n, Time: t0, Synced: true, Memberlist: true,
			Members: []Member{{Name: "w1", State: "alive"}, {Name: "w2", State: "alive"}, {Name: "w3", State: "alive"}},
			Nodes: []Node{
				{Name: "w1", Speaker: SpeakerAlive, Path: "unknown", Owned: 1},
				{Name: "w2", Speaker: SpeakerAlive, Path: "unknown"},
				{Name: "w3", Speaker: SpeakerAlive, Path: "unknown"},
			},
			Services: []Service{{
				Name: "default/svc1", IPs: []string{vip}, Pool: "p1", Owner: "w1", Epoch: 1, Serving: true,
				Candidates: []string{"w1", "w3", "w2"},
				Excluded:   map[string]string{"cp": election.NodeExcludedByLabel},
				Announcing: n == "w1", AllInterfaces: true,
			}},
		}
	}
	return out
}

func sources(snaps map[string]*Snapshot) []Source {
	var out []Source
	for n, s := range snaps {
		out = append(out, Source{Node: n, Pod: "speaker-" + n, Snapshot: s})
	}
	return out
}

func svc(s *Snapshot) *Service { return &s.Services[0] }

func nodeState(s *Snapshot, name string) *Node {
	i := slices.IndexFunc(s.Nodes, func(n Node) bool { return n.Name == name })
	return &s.Nodes[i]
}

func kinds(ps []Problem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Kind)
	}
	return out
}

func states(ss ServiceStatus) []string {
	var out []string
	for _, n := range ss.Nodes {
		out = append(out, n.Node+"="+n.State)
	}
	return out
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name          string
		edit          func(map[string]*Snapshot) []Source
		wantAnnouncer string
		wantStates    []string
		wantProblems  []string
	}{
		{
			name:          "healthy: owner announces, others standby in hash order, excluded last",
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
		},
		{
			name: "split membership view",
			edit: func(c map[string]*Snapshot) []Source {
				c["w3"].Members = []Member{{Name: "w3", State: "alive"}}
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems:  []string{ProblemSplitMembership},
		},
		{
			name: "suspects still count as members",
			edit: func(c map[string]*Snapshot) []Source {
				c["w2"].Members[2].State = SpeakerSuspect
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
		},
		{
			name: "owner's speaker does not announce: no announcer",
			edit: func(c map[string]*Snapshot) []Source {
				svc(c["w1"]).Announcing = false
				return nil
			},
			wantStates:   []string{"w1=" + StateOwnerNotAnnouncing, "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems: []string{ProblemNoAnnouncer},
		},
		{
			name: "no live candidate: no owner, no announcer",
			edit: func(c map[string]*Snapshot) []Source {
				for _, s := range c {
					svc(s).Owner, svc(s).Serving, svc(s).Announcing, svc(s).Epoch = "", false, false, 0
					for i := range s.Nodes {
						s.Nodes[i].Speaker = SpeakerGone
					}
				}
				return nil
			},
			wantStates:   []string{"w1=" + StateNotMember, "w3=" + StateNotMember, "w2=" + StateNotMember, "cp=" + election.NodeExcludedByLabel},
			wantProblems: []string{ProblemNoAnnouncer},
		},
		{
			name: "speakers disagree on the owner",
			edit: func(c map[string]*Snapshot) []Source {
				svc(c["w2"]).Owner, svc(c["w2"]).Epoch = "w2", 2
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems:  []string{ProblemOwnerDisagreement},
		},
		{
			name: "two speakers announce",
			edit: func(c map[string]*Snapshot) []Source {
				svc(c["w2"]).Announcing = true
				return nil
			},
			wantStates:   []string{"w1=announcing", "w3=standby", "w2=announcing", "cp=" + election.NodeExcludedByLabel},
			wantProblems: []string{ProblemMultipleAnnouncers},
		},
		{
			name: "address conflict seen by the announcer",
			edit: func(c map[string]*Snapshot) []Source {
				svc(c["w1"]).Conflict = &Conflict{IP: vip, MAC: "02:00:00:00:00:99", Interface: "eth0", Last: t0}
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems:  []string{ProblemConflict},
		},
		{
			name: "held owner answered by its deputy: fine",
			edit: func(c map[string]*Snapshot) []Source {
				delete(c, "w1")
				for _, s := range c {
					*nodeState(s, "w1") = Node{Name: "w1", Speaker: SpeakerGone, Path: "up", Held: true, Deputy: "w2", Owned: 1}
					s.Members = s.Members[1:]
				}
				c["w2"].Proxies = []Proxy{{Node: "w1", IPs: []string{vip}}}
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=" + StateHeld, "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
		},
		{
			name: "held owner without a deputy answering",
			edit: func(c map[string]*Snapshot) []Source {
				delete(c, "w1")
				for _, s := range c {
					*nodeState(s, "w1") = Node{Name: "w1", Speaker: SpeakerGone, Path: "up", Held: true, Deputy: "w2", Owned: 1}
					s.Members = s.Members[1:]
				}
				return nil
			},
			wantStates:   []string{"w1=" + StateHeld, "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems: []string{ProblemNoAnnouncer},
		},
		{
			name: "candidate states: data path down, suspect, interface missing on a standby",
			edit: func(c map[string]*Snapshot) []Source {
				nodeState(c["w1"], "w3").Path = PathDown
				nodeState(c["w1"], "w2").Speaker = SpeakerSuspect
				svc(c["w2"]).MissingInterfaces, svc(c["w2"]).Interfaces = true, []string{"eth9"}
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=" + StateDataPathDown, "w2=" + StateInterfaceMissing, "cp=" + election.NodeExcludedByLabel},
		},
		{
			name: "the announcer lacks the advertisement's interfaces",
			edit: func(c map[string]*Snapshot) []Source {
				svc(c["w1"]).MissingInterfaces, svc(c["w1"]).Interfaces = true, []string{"eth9"}
				return nil
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems:  []string{ProblemInterfaceMissing},
		},
		{
			name: "owner first even when it is not the hash winner (sticky)",
			edit: func(c map[string]*Snapshot) []Source {
				for _, s := range c {
					svc(s).Owner = "w2"
					svc(s).Announcing = s.Node == "w2"
				}
				return nil
			},
			wantAnnouncer: "w2",
			wantStates:    []string{"w2=announcing", "w1=standby", "w3=standby", "cp=" + election.NodeExcludedByLabel},
		},
		{
			name: "not announced at all (no ready endpoints): not a problem",
			edit: func(c map[string]*Snapshot) []Source {
				for _, s := range c {
					*svc(s) = Service{Name: "default/svc1", IPs: []string{vip}, Pool: "p1", Reason: election.ReasonNoReadyEndpoints}
				}
				return nil
			},
		},
		{
			name: "a speaker that cannot be read; unsynced speakers are left out",
			edit: func(c map[string]*Snapshot) []Source {
				c["w3"].Synced = false
				svc(c["w3"]).Owner = ""
				c["w3"].Members = nil
				src := sources(c)
				return append(src, Source{Node: "w4", Pod: "speaker-w4", Err: "container not running"})
			},
			wantAnnouncer: "w1",
			wantStates:    []string{"w1=announcing", "w3=standby", "w2=standby", "cp=" + election.NodeExcludedByLabel},
			wantProblems:  []string{ProblemSpeakerUnreachable},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster()
			var src []Source
			if tc.edit != nil {
				src = tc.edit(c)
			}
			if src == nil {
				src = sources(c)
			}
			r := Merge(t0, src)
			if !slices.Equal(kinds(r.Problems), tc.wantProblems) {
				t.Errorf("problems %v, want %v: %+v", kinds(r.Problems), tc.wantProblems, r.Problems)
			}
			if want := len(tc.wantProblems) > 0; (r.ExitCode() != 0) != want {
				t.Errorf("exit code %d with problems %v", r.ExitCode(), r.Problems)
			}
			if len(r.Services) != 1 {
				t.Fatalf("services %+v, want default/svc1 only", r.Services)
			}
			ss := r.Services[0]
			if ss.Announcer != tc.wantAnnouncer {
				t.Errorf("announcer %q, want %q", ss.Announcer, tc.wantAnnouncer)
			}
			if !slices.Equal(states(ss), tc.wantStates) {
				t.Errorf("nodes %v, want %v", states(ss), tc.wantStates)
			}
			// The report is what -o json prints: it must round-trip.
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			var back Report
			if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.Services, r.Services) {
				t.Errorf("JSON round trip: %v\n%s", err, b)
			}
			var table bytes.Buffer
			if err := WriteTable(&table, r); err != nil {
				t.Fatal(err)
			}
			for _, p := range r.Problems {
				if !strings.Contains(table.String(), p.Message) {
					t.Errorf("table does not show problem %q:\n%s", p.Message, table.String())
				}
			}
		})
	}
}

// The next node to take over is the first live standby in hash order.
func TestMergeNamesNextOwner(t *testing.T) {
	c := cluster()
	nodeState(c["w1"], "w3").Path = PathDown
	r := Merge(t0, sources(c))
	got := r.Services[0].Nodes
	if got[1].Detail != "its kernel stopped answering on the segment" || got[2].Detail != "takes over if w1 fails" {
		t.Errorf("details %+v: want w3 down, w2 next", got)
	}
	if got[3].Detail == "" {
		t.Error("excluded node without a detail")
	}
}

// Every speaker records the same transition; it is listed once, with the
// decider's reason rather than a peer's "learned", newest first.
func TestMergeChanges(t *testing.T) {
	c := cluster()
	c["w1"].Changes = []Change{
		{Time: t0, Key: vip, To: "w1", Epoch: 1, Reason: "placed", Services: []string{"default/svc1"}},
	}
	c["w2"].Changes = []Change{
		{Time: t0.Add(time.Millisecond), Key: vip, To: "w1", Epoch: 1, Reason: "learned", Services: []string{"default/svc1"}},
		{Time: t0.Add(time.Minute), Key: "172.18.255.201", From: "w1", To: "w2", Epoch: 3, Reason: "ownerDataPathDown"},
	}
	c["w3"].Changes = []Change{
		{Time: t0.Add(2 * time.Millisecond), Key: vip, To: "w1", Epoch: 1, Reason: "learned"},
	}
	r := Merge(t0, sources(c))
	if len(r.Changes) != 2 {
		t.Fatalf("changes %+v, want 2", r.Changes)
	}
	if r.Changes[0].Epoch != 3 || r.Changes[1].Reason != "placed" {
		t.Errorf("changes %+v: want the newest first and the decider's reason", r.Changes)
	}
}

func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Service: "default/svc1"}, true},
		{Filter{Service: "default/svc2"}, false},
		{Filter{IP: "fd00::1"}, true},
		{Filter{IP: "172.18.255.201"}, false},
		{Filter{Service: "default/svc1", IP: vip}, true},
	} {
		if got := tc.f.Match("default/svc1", []string{vip, "fd00::1"}); got != tc.want {
			t.Errorf("%+v.Match = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// The table aligns every column, whatever cells are empty, and leaves no
// trailing blanks.
func TestWriteTableAligned(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, Merge(t0, sources(cluster()))); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	col := strings.Index(lines[0], "DETAIL")
	for _, l := range lines {
		if strings.HasSuffix(l, " ") {
			t.Errorf("trailing blanks: %q", l)
		}
	}
	for _, l := range lines[1:5] {
		if len(l) > col && l[col-1] != ' ' {
			t.Errorf("DETAIL not at column %d: %q", col, l)
		}
	}
	if !strings.Contains(lines[4], "excludedByLabel  node label") {
		t.Errorf("excluded row: %q", lines[4])
	}
	t.Log("\n" + b.String())
}

// A speaker without quorum, and a member that answers for nothing, are
// problems; speakers that predate the quorum (no KnownMembers) are not.
func TestMergeQuorumAndNotAnswering(t *testing.T) {
	snaps := cluster()
	for _, s := range snaps {
		s.Quorum, s.Acting, s.KnownMembers = true, true, 3
	}
	if got := kinds(Merge(t0, sources(snaps)).Problems); len(got) != 0 {
		t.Fatalf("healthy cluster: problems %v", got)
	}
	snaps["w2"].Quorum, snaps["w2"].Acting = false, false
	for _, s := range snaps {
		s.Members[2].NotAnswering = true // w3
	}
	got := kinds(Merge(t0, sources(snaps)).Problems)
	if want := []string{ProblemNoQuorum, ProblemNotAnswering}; !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v (one each)", got, want)
	}
	for _, s := range snaps {
		s.KnownMembers = 0
		s.Members[2].NotAnswering = false
	}
	if got := kinds(Merge(t0, sources(snaps)).Problems); len(got) != 0 {
		t.Fatalf("speakers of the previous release (no KnownMembers): problems %v", got)
	}
}

// A node its watchers find unhealthy, and one not yet found delivering, say
// so and why; neither is the next owner.
func TestMergeUnhealthyNodes(t *testing.T) {
	c := cluster()
	w3 := nodeState(c["w1"], "w3")
	w3.Path, w3.PathSince, w3.NotPlaceable = PathUnhealthy, "2026-11-29T11:00:00Z", true
	w2 := nodeState(c["w1"], "w2")
	w2.Path, w2.NotPlaceable = PathUnknown, true
	r := Merge(t0, sources(c))
	got := r.Services[0].Nodes
	if got[1].State != StateUnhealthy || !strings.Contains(got[1].Detail, "kube-proxy unhealthy since 2026-11-29T11:00:00Z") {
		t.Errorf("w3: %+v, want unhealthy since its verdict", got[1])
	}
	if got[2].State != StateNotYetHealthy {
		t.Errorf("w2: %+v, want notYetHealthy", got[2])
	}
}

// TestMergeDrains: every speaker's drains are listed with the node running
// them, ForwardedTo sums those forwarding to one node, and the table shows
// them.
func TestMergeDrains(t *testing.T) {
	c := cluster()
	until := t0.Add(5 * time.Minute)
	c["w2"].Drains = []Drain{{Key: vip, From: "w1", IPs: []string{vip}, Until: until, ForwardedFlows: 3}}
	c["w3"].Drains = []Drain{
		{Key: "172.18.255.201", From: "w1", IPs: []string{"172.18.255.201"}, Until: until, ForwardedFlows: 2},
		{Key: "172.18.255.202", From: "w2", IPs: []string{"172.18.255.202"}, Until: until, ForwardedFlows: 7},
	}
	r := Merge(t0, sources(c))
	if len(r.Drains) != 3 || r.Drains[0].Node != "w2" || r.Drains[1].Node != "w3" {
		t.Fatalf("drains %+v: want w2's, then w3's two", r.Drains)
	}
	if f := r.ForwardedTo("w1"); f.Flows != 5 || f.Drains != 2 || !reflect.DeepEqual(f.ByNode, map[string]int{"w2": 3, "w3": 2}) || !f.Until.Equal(until) {
		t.Errorf("ForwardedTo(w1) = %+v, want 5 flows in 2 drains (w2 3, w3 2) until %v", f, until)
	}
	if f := r.ForwardedTo("w3"); f.Flows != 0 || f.Drains != 0 {
		t.Errorf("ForwardedTo(w3) = %+v, want none", f)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	want := "w3                        172.18.255.202  w2            7            2026-11-24T10:05:00Z"
	if !strings.Contains(b.String(), "DRAINING (planned moves)") || !strings.Contains(b.String(), want) {
		t.Errorf("table lacks the drains (want a line %q):\n%s", want, b.String())
	}
}

// A Service with several address slots merges into one status per slot, each
// with its own announcer: three nodes announcing one slot each is the
// healthy state, not multipleAnnouncers; two announcing one slot is.
func TestMergeSlots(t *testing.T) {
	slotted := func() map[string]*Snapshot {
		c := cluster()
		for n, s := range c {
			sv := svc(s)
			sv.IPs = []string{vip, "172.18.255.201", "172.18.255.202"}
			sv.Slots = []Slot{
				{IPs: []string{vip}, Owner: "w1", Epoch: 1, Serving: true, Announcing: n == "w1", Candidates: []string{"w1", "w3", "w2"}},
				{IPs: []string{"172.18.255.201"}, Owner: "w2", Epoch: 2, Serving: true, Announcing: n == "w2", Candidates: []string{"w2", "w1", "w3"}},
				{IPs: []string{"172.18.255.202"}, Owner: "w3", Epoch: 3, Serving: true, Announcing: n == "w3", Candidates: []string{"w3", "w2", "w1"}},
			}
			sv.Announcing = n != "cp"
		}
		return c
	}
	r := Merge(t0, sources(slotted()))
	if len(r.Problems) != 0 {
		t.Fatalf("problems %v, want none", r.Problems)
	}
	var got []string
	for _, ss := range r.Services {
		got = append(got, strings.Join(ss.IPs, ",")+"="+ss.Announcer)
	}
	want := []string{vip + "=w1", "172.18.255.201=w2", "172.18.255.202=w3"}
	if !slices.Equal(got, want) {
		t.Fatalf("announcers %v, want %v", got, want)
	}
	if s := states(r.Services[1]); s[0] != "w2=announcing" || s[1] != "w1=standby" {
		t.Fatalf("second slot's nodes %v, want w2 announcing first, then its hash order", s)
	}

	c := slotted()
	c["w1"].Services[0].Slots[1].Announcing = true
	r = Merge(t0, sources(c))
	if k := kinds(r.Problems); !slices.Equal(k, []string{ProblemMultipleAnnouncers}) || !strings.HasPrefix(r.Problems[0].Message, "172.18.255.201: ") {
		t.Fatalf("problems %v, want multipleAnnouncers naming 172.18.255.201", r.Problems)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, Merge(t0, sources(slotted()))); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}
