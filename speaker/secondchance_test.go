package speaker

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/internal/secondchance"
)

// drainLog records what owners hands the data path.
type drainLog struct {
	mu   sync.Mutex
	last []Drain
	n    int
}

func (d *drainLog) set(v []Drain) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last, d.n = v, d.n+1
}

func (d *drainLog) get() ([]Drain, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last, d.n
}

// TestPlannedMoveDrains: a key taken over from a node whose data path is up
// (here: a configuration change makes the owner ineligible) is drained to
// that node for the drain timeout; a failover (the owner's data path down)
// drains nothing; the drain ends when the timeout runs out or when this
// node loses the key.
func TestPlannedMoveDrains(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.210"
	rank := election.Rank(ip, nodes)
	owner, next := rank[0], rank[1]
	mac, _ := net.ParseMAC("02:42:ac:12:00:09")
	o, ann := testOwners(t, next, logr.Discard(), nodes...)
	var got drainLog
	o.setDrains(time.Minute, got.set)
	o.SetService("ns1/web", input(ip, nodes...), lbService(ip))
	watchersVote(o, owner, ownership.PathUp, "eth0", mac)
	if ann.announces("ns1/web") {
		t.Fatalf("%s announces, %s (hash winner) should", next, owner)
	}

	// The owner's node leaves the advertisement: a planned move.
	start := time.Now()
	o.SetService("ns1/web", input(ip, next, rank[2]), lbService(ip))
	if !ann.announces("ns1/web") {
		t.Fatalf("%s did not take over when %s became ineligible", next, owner)
	}
	d, _ := got.get()
	if len(d) != 1 || d[0].From != owner || !slices.Equal(d[0].IPs, []netip.Addr{netip.MustParseAddr(ip)}) ||
		d[0].Until.Before(start.Add(time.Minute)) || d[0].Until.After(time.Now().Add(time.Minute)) {
		t.Fatalf("drains after the planned move: %+v, want %s's IP drained to %s for a minute", d, ip, owner)
	}
	if m := d[0].MACs; m["eth0"].String() != mac.String() {
		t.Fatalf("the drain carries %s's MACs %v, want eth0 %s", owner, m, mac)
	}

	// The drain runs out.
	o.Tick(time.Now().Add(2 * time.Minute))
	if d, _ := got.get(); len(d) != 0 {
		t.Fatalf("drains after the timeout: %+v, want none", d)
	}

	// A failover: the owner's data path is down when the key moves.
	o2, ann2 := testOwners(t, next, logr.Discard(), nodes...)
	var got2 drainLog
	o2.setDrains(time.Minute, got2.set)
	o2.SetService("ns1/web", input(ip, nodes...), lbService(ip))
	watchersVote(o2, owner, ownership.PathDown, "", nil)
	if !ann2.announces("ns1/web") {
		t.Fatalf("%s did not take over when %s's data path went down", next, owner)
	}
	if d, n := got2.get(); len(d) != 0 {
		t.Fatalf("a failover drained (%d handoffs): %+v", n, d)
	}

	// Drained, then lost: the drain ends with the ownership.
	o3, ann3 := testOwners(t, next, logr.Discard(), nodes...)
	var got3 drainLog
	o3.setDrains(time.Minute, got3.set)
	o3.SetService("ns1/web", input(ip, nodes...), lbService(ip))
	watchersVote(o3, owner, ownership.PathUp, "eth0", mac)
	o3.SetService("ns1/web", input(ip, next, rank[2]), lbService(ip))
	if d, _ := got3.get(); len(d) != 1 {
		t.Fatalf("no drain after the planned move: %+v", d)
	}
	o3.SetService("ns1/web", input(ip, rank[2]), lbService(ip))
	if ann3.announces("ns1/web") {
		t.Fatalf("%s still announces after it became ineligible", next)
	}
	if d, _ := got3.get(); len(d) != 0 {
		t.Fatalf("drains after losing the key: %+v, want none", d)
	}
}

func TestForwardsOf(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ip1, ip2 := netip.MustParseAddr("172.18.255.1"), netip.MustParseAddr("fc00::2")
	macA, _ := net.ParseMAC("02:00:00:00:00:0a")
	macB, _ := net.ParseMAC("02:00:00:00:00:0b")
	macs := map[string]map[string]net.HardwareAddr{
		"a": {"eth0": macA, "eth1": macA},
		"b": {"eth0": macB},
	}
	for _, tc := range []struct {
		name   string
		drains []Drain
		want   map[string][]secondchance.Forward
	}{
		{"none", nil, map[string][]secondchance.Forward{}},
		{"every interface where the MAC is known", []Drain{{Key: "k", From: "a", IPs: []netip.Addr{ip1, ip2}, Until: now.Add(time.Minute)}},
			map[string][]secondchance.Forward{
				"eth0": {{VIP: ip1, OldMAC: macA}, {VIP: ip2, OldMAC: macA}},
				"eth1": {{VIP: ip1, OldMAC: macA}, {VIP: ip2, OldMAC: macA}},
			}},
		{"expired", []Drain{{Key: "k", From: "a", IPs: []netip.Addr{ip1}, Until: now}}, map[string][]secondchance.Forward{}},
		{"unknown MAC", []Drain{{Key: "k", From: "c", IPs: []netip.Addr{ip1}, Until: now.Add(time.Minute)}}, map[string][]secondchance.Forward{}},
		{"moved twice: the later drain wins", []Drain{
			{Key: "k", From: "a", IPs: []netip.Addr{ip1}, Until: now.Add(time.Minute)},
			{Key: "k2", From: "b", IPs: []netip.Addr{ip1}, Until: now.Add(2 * time.Minute)},
		}, map[string][]secondchance.Forward{
			"eth0": {{VIP: ip1, OldMAC: macB}},
			"eth1": {{VIP: ip1, OldMAC: macA}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := forwardsOf(tc.drains, macs, now)
			if len(got) != len(tc.want) {
				t.Fatalf("forwardsOf = %v, want %v", got, tc.want)
			}
			for iface, w := range tc.want {
				g := got[iface]
				if len(g) != len(w) {
					t.Fatalf("%s: %v, want %v", iface, g, w)
				}
				for i := range w {
					if g[i].VIP != w[i].VIP || g[i].OldMAC.String() != w[i].OldMAC.String() {
						t.Fatalf("%s: %v, want %v", iface, g, w)
					}
				}
			}
		})
	}
}

// TestPlannedMoveRealHandoff wires owners to a real secondChance, as Start
// does: the planned move's handoff runs under the ownership lock, so the
// data path must never call back into owners (it once asked it for MACs
// and the takeover deadlocked). The interface does not exist: programming
// it fails and is logged, nothing touches this host's nftables.
func TestPlannedMoveRealHandoff(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.211"
	rank := election.Rank(ip, nodes)
	owner, next := rank[0], rank[1]
	mac, _ := net.ParseMAC("02:42:ac:12:00:0a")
	o, ann := testOwners(t, next, logr.Discard(), nodes...)
	sc := newSecondChance(logr.Discard(), newMetrics(nil), nil)
	o.setDrains(time.Minute, sc.Set)
	o.SetService("ns1/web", input(ip, nodes...), lbService(ip))
	watchersVote(o, owner, ownership.PathUp, "ilb-absent0", mac)
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.SetService("ns1/web", input(ip, next, rank[2]), lbService(ip))
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the planned move did not return in 30 s: the handoff to the data path deadlocked")
	}
	if !ann.announces("ns1/web") {
		t.Fatalf("%s did not take over", next)
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.want) != 1 || sc.want[0].MACs["ilb-absent0"].String() != mac.String() {
		t.Fatalf("the data path got %+v, want one drain carrying %s's MAC", sc.want, owner)
	}
}

// TestRequestRebalance: the rebalance annotation starts a burst of one key a
// second on a node whose --rebalance-rate is 0; the same value again, or
// one older than the burst, starts nothing.
func TestRequestRebalance(t *testing.T) {
	o, _ := testOwners(t, "a", logr.Discard(), "a")
	for i := range 6 {
		ip := fmt.Sprintf("172.18.255.%d", 20+i)
		o.SetService(fmt.Sprintf("ns1/s%d", i), input(ip, "a", "b", "c"), lbService(ip))
	}
	now := time.Now()
	for _, n := range []string{"b", "c"} {
		o.SetSpeaker(n, ownership.SpeakerAlive, now)
	}
	owned := func() int {
		o.mu.Lock()
		defer o.mu.Unlock()
		return len(o.eng.Owned("a"))
	}
	if owned() != 6 {
		t.Fatalf("a owns %d keys, want all 6 before rebalancing", owned())
	}
	o.Tick(now.Add(time.Second))
	if owned() != 6 {
		t.Fatalf("a gave keys away with --rebalance-rate 0 and no request: owns %d", owned())
	}
	o.RequestRebalance(now.Add(-2*rebalanceBurst).UTC().Format(time.RFC3339), now)
	o.Tick(now.Add(2 * time.Second))
	if owned() != 6 {
		t.Fatalf("an old request rebalanced: a owns %d", owned())
	}
	o.RequestRebalance(now.UTC().Format(time.RFC3339), now)
	for i := range 10 {
		o.Tick(now.Add(time.Duration(3+i) * time.Second))
	}
	if got := owned(); got != 2 {
		t.Fatalf("after a requested burst a owns %d keys, want 2 (6 over a, b, c)", got)
	}
}

// TestRequestRebalanceRemoved: removing the annotation ends the burst.
func TestRequestRebalanceRemoved(t *testing.T) {
	o, _ := testOwners(t, "a", logr.Discard(), "a")
	now := time.Now()
	o.RequestRebalance(now.UTC().Format(time.RFC3339), now)
	o.mu.Lock()
	started := now.Before(o.rebalanceUntil)
	o.mu.Unlock()
	o.RequestRebalance("", now.Add(time.Second))
	o.mu.Lock()
	defer o.mu.Unlock()
	if !started || !o.rebalanceUntil.IsZero() {
		t.Fatalf("burst started %v, until %v after the annotation was removed: want started, then ended", started, o.rebalanceUntil)
	}
}

// TestHandoverOnPlannedMove: a key this node gives away (here by
// rebalancing) is handed over before its balancer goes, so that its IP is
// answered until the new owner announces it; the hand-over ends after
// handoverLinger at the latest. A move this node learned from a peer is
// not handed over (the peer announces it already).
func TestHandoverOnPlannedMove(t *testing.T) {
	o, ann := testOwners(t, "a", logr.Discard(), "a")
	for i := range 2 {
		ip := fmt.Sprintf("172.18.255.%d", 30+i)
		o.SetService(fmt.Sprintf("ns1/s%d", i), input(ip, "a", "b"), lbService(ip))
	}
	now := time.Now()
	o.SetSpeaker("b", ownership.SpeakerAlive, now)
	ann.calls()
	o.RequestRebalance(now.UTC().Format(time.RFC3339), now)
	o.Tick(now.Add(time.Second))
	calls := ann.calls()
	hand := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "handover handover/") })
	apply := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "apply ") })
	if hand < 0 || apply < 0 || hand > apply {
		t.Fatalf("announcer calls %q: want a hand-over of the given key before the Apply that drops it", calls)
	}
	if !strings.Contains(calls[hand], "[172.18.255.3") {
		t.Fatalf("hand-over %q: want the key's IP", calls[hand])
	}
	name := strings.Fields(calls[hand])[1]
	if ann.proxying(name) == nil {
		t.Fatalf("no announcer entry %s", name)
	}
	o.Tick(now.Add(time.Second + handoverLinger/2))
	if ann.proxying(name) == nil {
		t.Fatalf("hand-over %s ended before handoverLinger", name)
	}
	o.Tick(now.Add(2*time.Second + handoverLinger))
	if ann.proxying(name) != nil {
		t.Fatalf("hand-over %s still in place after handoverLinger", name)
	}

	// The new owner's own decision, learned here: nothing to hand over.
	o2, ann2 := testOwners(t, "a", logr.Discard(), "a", "b")
	ip := "172.18.255.40"
	for i := 41; election.Rank(ip, []string{"a", "b"})[0] != "a"; i++ {
		ip = fmt.Sprintf("172.18.255.%d", i) // one the hash gives to a
	}
	o2.SetService("ns1/x", input(ip, "a", "b"), lbService(ip))
	c := o2.Claims()[0]
	if c.Owner != "a" || !ann2.announces("ns1/x") {
		t.Fatalf("claim %+v: want a, the hash winner, announcing", c)
	}
	ann2.calls()
	o2.Merge([]ownership.Claim{{Key: c.Key, Owner: "b", Epoch: c.Epoch + 1}})
	if ann2.announces("ns1/x") {
		t.Fatal("a still announces after learning b's claim")
	}
	if calls := ann2.calls(); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "handover") }) {
		t.Fatalf("a learned move was handed over: %q", calls)
	}
}

// TestRebalanceKeepsDrainedKeys: a key this node drains (a planned move
// brought it here) is not rebalanced away while its drain lasts: drains are
// one hop, so a second move would break the connections still forwarded to
// the first owner. The other keys are rebalanced as usual.
func TestRebalanceKeepsDrainedKeys(t *testing.T) {
	// ip0 sorts before the other keys: Rebalance tries keys in order.
	ip0 := "172.18.250.50"
	for i := 51; election.Rank(ip0, []string{"a", "b"})[0] != "b"; i++ {
		ip0 = fmt.Sprintf("172.18.250.%d", i) // one the hash gives to b
	}
	mac, _ := net.ParseMAC("02:42:ac:12:00:0b")
	o, ann := testOwners(t, "a", logr.Discard(), "a", "b")
	var got drainLog
	o.setDrains(time.Minute, got.set)
	o.SetService("ns1/moved", input(ip0, "a", "b"), lbService(ip0))
	watchersVote(o, "b", ownership.PathUp, "eth0", mac)
	o.SetService("ns1/moved", input(ip0, "a", "c"), lbService(ip0)) // b ineligible: a planned move to a
	if d, _ := got.get(); len(d) != 1 || !ann.announces("ns1/moved") {
		t.Fatalf("a announces %s: %v, drains %+v; want a, draining to b", ip0, ann.announces("ns1/moved"), d)
	}
	for i := range 3 {
		ip := fmt.Sprintf("172.18.254.%d", 10+i)
		o.SetService(fmt.Sprintf("ns1/s%d", i), input(ip, "a", "c"), lbService(ip))
	}
	now := time.Now()
	o.SetSpeaker("c", ownership.SpeakerAlive, now)
	o.RequestRebalance(now.UTC().Format(time.RFC3339), now)
	for i := range 10 {
		o.Tick(now.Add(time.Duration(1+i) * time.Second))
	}
	if !ann.announces("ns1/moved") {
		t.Fatal("the key a drains was rebalanced away during its drain")
	}
	o.mu.Lock()
	owned := len(o.eng.Owned("a"))
	o.mu.Unlock()
	if owned != 2 {
		t.Fatalf("a owns %d keys after rebalancing, want 2 (the drained one and one of three)", owned)
	}
}

// TestSecondChanceDrainsView: the drains in effect are what `ironlb status`
// lists (an expired one is not); without a table (the previous owner's MAC
// unknown) nothing is forwarded yet.
func TestSecondChanceDrainsView(t *testing.T) {
	sc := newSecondChance(logr.Discard(), newMetrics(nil), nil)
	now := time.Now()
	ip := netip.MustParseAddr("172.18.255.60")
	sc.Set([]Drain{
		{Key: "172.18.255.59", From: "w1", IPs: []netip.Addr{netip.MustParseAddr("172.18.255.59")}, Until: now.Add(-time.Second)},
		{Key: ip.String(), From: "w2", IPs: []netip.Addr{ip}, Until: now.Add(time.Minute)},
	})
	got := sc.Drains()
	if len(got) != 1 || got[0].From != "w2" || !slices.Equal(got[0].IPs, []string{ip.String()}) || got[0].ForwardedFlows != 0 ||
		!got[0].Until.Equal(now.Add(time.Minute).UTC()) {
		t.Fatalf("Drains() = %+v, want w2's drain of %s alone, nothing forwarded", got, ip)
	}
}
