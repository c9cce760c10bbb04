package speaker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ironlb/ironlb/internal/ownership"
)

func TestSlots(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		name string
		ips  []string
		want [][]string // each slot's addresses; its key is the first
	}{
		{"none", nil, nil},
		{"one IPv4", []string{"10.0.0.5"}, [][]string{{"10.0.0.5"}}},
		{"dual-stack, IPv6 listed first: one slot, keyed by the IPv4 address (Key)", []string{"fd00::5", "10.0.0.5"},
			[][]string{{"10.0.0.5", "fd00::5"}}},
		{"three IPv4, in status order", []string{"10.0.0.9", "10.0.0.2", "10.0.0.5"},
			[][]string{{"10.0.0.2"}, {"10.0.0.5"}, {"10.0.0.9"}}},
		{"two per family", []string{"fd00::2", "10.0.0.2", "fd00::1", "10.0.0.1"},
			[][]string{{"10.0.0.1", "fd00::1"}, {"10.0.0.2", "fd00::2"}}},
		{"more IPv6 than IPv4", []string{"fd00::2", "10.0.0.1", "fd00::1"},
			[][]string{{"10.0.0.1", "fd00::1"}, {"fd00::2"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var in Input
			for _, s := range c.ips {
				in.IPs = append(in.IPs, a(s))
			}
			got := in.Slots()
			if len(got) != len(c.want) {
				t.Fatalf("slots %v, want %v", got, c.want)
			}
			for i, w := range c.want {
				var wa []netip.Addr
				for _, s := range w {
					wa = append(wa, a(s))
				}
				if !slices.Equal(got[i].IPs, wa) || got[i].Key != w[0] {
					t.Fatalf("slot %d = %+v, want %v keyed %s", i, got[i], w, w[0])
				}
			}
			if len(got) > 0 && got[0].Key != in.Key() {
				t.Fatalf("first slot's key %s, want the Service's key %s", got[0].Key, in.Key())
			}
		})
	}
}

// TestServiceSlots: a Service with three addresses per family has three
// ownership keys, placed on three distinct nodes of four; each node
// announces only its slot's addresses (one per family), the status writer
// keeps the other slots' announcers' records, and when one announcer's
// speaker is gone only its slot moves, to the fourth node.
func TestServiceSlots(t *testing.T) {
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2", "fd00::3"}
	in := Input{Pool: "p1", Eligible: []string{"w1", "w2", "w3", "w4"}, Self: true, AllInterfaces: true}
	for _, s := range ips {
		in.IPs = append(in.IPs, netip.MustParseAddr(s))
	}
	slots := in.Slots()
	o, ann := testOwners(t, "w1", logr.Discard(), "w1", "w2", "w3", "w4")
	o.SetService("ns1/web", in, lbService(ips...))

	owners := func() []string {
		var out []string
		for _, s := range slots {
			ow, serving := o.eng.Owner(s.Key)
			if !serving {
				t.Fatalf("slot %s not served", s.Key)
			}
			out = append(out, ow)
		}
		return out
	}
	before := owners()
	if c := slices.Compact(slices.Sorted(slices.Values(before))); len(c) != 3 {
		t.Fatalf("slot owners %v, want three distinct nodes", before)
	}
	var mine []netip.Addr
	for i, s := range slots {
		if before[i] == "w1" {
			mine = append(mine, s.IPs...)
		}
	}
	got := ann.balancers["ns1/web"]
	slices.SortFunc(got, netip.Addr.Compare)
	slices.SortFunc(mine, netip.Addr.Compare)
	if !slices.Equal(got, mine) {
		t.Fatalf("w1 announces %v, want its slots' %v (owners %v)", got, mine, before)
	}
	if w := o.Want("ns1/web"); w.Announce != (len(mine) > 0) || len(w.IPs) != len(mine) {
		t.Fatalf("Want = %+v, want the IPs %v", w, mine)
	}
	keeps := o.KeepsStatus("ns1/web")
	for _, n := range before {
		if n != "w1" && !keeps(n) {
			t.Errorf("the record of %s, announcer of another slot, is not kept", n)
		}
	}

	// The victim: a slot owner other than w1 (which decides here).
	victim := before[0]
	if victim == "w1" {
		victim = before[1]
	}
	var free string
	for _, n := range []string{"w1", "w2", "w3", "w4"} {
		if !slices.Contains(before, n) {
			free = n
		}
	}
	now := time.Now()
	o.SetSpeaker(victim, ownership.SpeakerGone, now)
	o.Tick(now.Add(31 * time.Second)) // the hold (30 s) expires: its IPs move
	after := owners()
	for i, s := range slots {
		switch {
		case before[i] == victim && after[i] != free:
			t.Errorf("slot %s moved from %s to %s, want %s (the node holding none of the Service)", s.Key, victim, after[i], free)
		case before[i] != victim && after[i] != before[i]:
			t.Errorf("slot %s moved from %s to %s although its owner is alive", s.Key, before[i], after[i])
		}
	}
}

func TestSeedClaims(t *testing.T) {
	a := netip.MustParseAddr
	three := Input{IPs: []netip.Addr{a("10.0.0.1"), a("10.0.0.2"), a("10.0.0.3")}}.Slots()
	one := Input{IPs: []netip.Addr{a("10.0.0.1"), a("fd00::1")}}.Slots()
	for _, c := range []struct {
		name  string
		slots []Slot
		seeds []Seed
		want  []ownership.Claim
	}{
		{"one slot, MetalLB's record (no IPs)", one, []Seed{{Node: "w2"}}, []ownership.Claim{{Key: "10.0.0.1", Owner: "w2"}}},
		{"one slot, records of two nodes: the first (oldest)", one, []Seed{{Node: "w2"}, {Node: "w3"}},
			[]ownership.Claim{{Key: "10.0.0.1", Owner: "w2"}}},
		{"three slots, each record naming its IPs", three,
			[]Seed{{Node: "w3", IPs: []netip.Addr{a("10.0.0.3")}}, {Node: "w1", IPs: []netip.Addr{a("10.0.0.1"), a("10.0.0.2")}}},
			[]ownership.Claim{{Key: "10.0.0.1", Owner: "w1"}, {Key: "10.0.0.2", Owner: "w1"}, {Key: "10.0.0.3", Owner: "w3"}}},
		{"three slots, a record without IPs resumes nothing", three, []Seed{{Node: "w2"}}, nil},
		{"no record", three, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := seedClaims(c.slots, c.seeds); !slices.Equal(got, c.want) {
				t.Fatalf("seedClaims = %v, want %v", got, c.want)
			}
		})
	}
}

// reasonRecorder keeps each event's reason and message.
type reasonRecorder struct {
	nopRecorder
	mu     sync.Mutex
	events []string
}

func (r *reasonRecorder) Eventf(_ runtime.Object, _ runtime.Object, _, reason, _, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, reason+": "+fmt.Sprintf(note, args...))
}

// TestSlotsShareNodeThenSpread: with one eligible node a Service's three
// slots share it, which an AddressesShareNode event says once; once two
// more nodes are eligible, Tick spreads them by planned moves, one a second.
func TestSlotsShareNodeThenSpread(t *testing.T) {
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	in := Input{Pool: "p1", Eligible: []string{"w1"}, Self: true, AllInterfaces: true}
	for _, s := range ips {
		in.IPs = append(in.IPs, netip.MustParseAddr(s))
	}
	rec := &reasonRecorder{}
	ann := newFakeAnnouncer()
	o := newOwners(logr.Discard(), "w1", ownership.Options{Hold: 30 * time.Second}, ann, newMetrics(nil), rec)
	now := time.Now()
	for _, n := range []string{"w1", "w2", "w3"} {
		o.SetSpeaker(n, ownership.SpeakerAlive, now)
	}
	o.Sync(now, nil)
	o.SetService("ns1/web", in, lbService(ips...))
	if got := len(ann.balancers["ns1/web"]); got != 3 {
		t.Fatalf("w1 announces %v, want all three IPs (the only eligible node)", ann.balancers["ns1/web"])
	}
	shared := func() int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, e := range rec.events {
			if strings.HasPrefix(e, EventAddressesShareNode+": 3 of the Service's 3 address slots") {
				n++
			}
		}
		return n
	}
	if shared() != 1 {
		t.Fatalf("events %v, want one %s", rec.events, EventAddressesShareNode)
	}
	o.SetService("ns1/web", in, lbService(ips...)) // nothing changed: no new event
	if shared() != 1 {
		t.Fatalf("events %v, want still one %s", rec.events, EventAddressesShareNode)
	}

	in.Eligible = []string{"w1", "w2", "w3"}
	o.SetService("ns1/web", in, lbService(ips...))
	if got := len(ann.balancers["ns1/web"]); got != 3 {
		t.Fatalf("w1 announces %v right after w2 and w3 became eligible, want all three until Tick spreads them", ann.balancers["ns1/web"])
	}
	for i := 1; i <= 2; i++ {
		o.Tick(now.Add(time.Duration(i) * spreadEvery))
		if got := len(ann.balancers["ns1/web"]); got != 3-i {
			t.Fatalf("after %d ticks w1 announces %v, want %d IPs (one slot given away a tick)", i, ann.balancers["ns1/web"], 3-i)
		}
	}
	owners := map[string]bool{}
	for _, s := range in.Slots() {
		ow, _ := o.eng.Owner(s.Key)
		owners[ow] = true
	}
	if len(owners) != 3 {
		t.Fatalf("slot owners %v, want three distinct nodes", owners)
	}
}
