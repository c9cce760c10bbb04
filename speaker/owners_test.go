package speaker

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/ownership"
)

// fakeAnnouncer records what the speaker tells the announcer.
type fakeAnnouncer struct {
	mu        sync.Mutex
	balancers map[string][]netip.Addr
	proxies   map[string]map[string]net.HardwareAddr
	// log records the calls in order: "apply N" (a batch of N updates)
	// and "kernelCheck N" (KernelARPFindings for N IPs).
	log []string
}

func newFakeAnnouncer() *fakeAnnouncer {
	return &fakeAnnouncer{balancers: map[string][]netip.Addr{}, proxies: map[string]map[string]net.HardwareAddr{}}
}

func (f *fakeAnnouncer) Apply(updates []layer2.BalancerUpdate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("apply %d", len(updates)))
	for _, u := range updates {
		if u.Delete {
			delete(f.balancers, u.Name)
		} else {
			f.balancers[u.Name] = u.IPs
		}
	}
}
func (f *fakeAnnouncer) SetProxy(name string, _ []netip.Addr, macs map[string]net.HardwareAddr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxies[name] = macs
}
func (f *fakeAnnouncer) SetHandover(name string, ips []netip.Addr, _ []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("handover %s %v", name, ips))
	f.proxies[name] = map[string]net.HardwareAddr{} // proxying: non-nil, for this node itself
}
func (f *fakeAnnouncer) DeleteProxy(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.proxies, name)
}
func (f *fakeAnnouncer) Interfaces() []string { return []string{"eth0"} }
func (f *fakeAnnouncer) KernelARPFindings(ips []netip.Addr) ([]layer2.KernelARPFinding, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("kernelCheck %d", len(ips)))
	return nil, nil
}

// calls returns the calls logged since the last one.
func (f *fakeAnnouncer) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.log
	f.log = nil
	return out
}
func (f *fakeAnnouncer) announces(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.balancers[name]
	return ok
}
func (f *fakeAnnouncer) proxying(name string) map[string]net.HardwareAddr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.proxies[name]
}

type nopRecorder struct{}

func (nopRecorder) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
func (nopRecorder) AnnotatedEventf(runtime.Object, runtime.Object, map[string]string, string, string, string, string, ...any) {
}

var _ recorder.EventRecorder = nopRecorder{}

// testOwners is an owners for self in a synced cluster of live nodes.
func testOwners(t testing.TB, self string, log logr.Logger, nodes ...string) (*owners, *fakeAnnouncer) {
	t.Helper()
	ann := newFakeAnnouncer()
	o := newOwners(log, self, ownership.Options{Hold: 30 * time.Second}, ann, newMetrics(nil), nopRecorder{})
	for _, n := range nodes {
		o.SetSpeaker(n, ownership.SpeakerAlive, time.Now())
	}
	o.Sync(time.Now(), nil)
	return o, ann
}

func input(ip string, eligible ...string) Input {
	return Input{IPs: []netip.Addr{netip.MustParseAddr(ip)}, Pool: "p1", Eligible: eligible, Self: true, AllInterfaces: true}
}

// A Service nobody announces gets one info line per change of reason, not
// one per reconcile; a normal state (some node announces) logs nothing.
func TestNotAnnouncedLoggedOncePerReason(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(args, "serviceNotAnnounced") {
			lines = append(lines, args)
		}
	}, funcr.Options{})
	o, _ := testOwners(t, "w1", log, "w1", "w2")
	svc := lbService(testVIP)
	key := "ns1/web"
	reason := func(r string) Input { in := input(testVIP, "w1", "w2"); in.Reason, in.Eligible = r, nil; return in }
	steps := []struct {
		in      Input
		newLine string // reason expected in a new log line, "" for none
	}{
		{reason(election.ReasonNoReadyEndpoints), election.ReasonNoReadyEndpoints},
		{reason(election.ReasonNoReadyEndpoints), ""},
		{reason(election.ReasonNoCandidates), election.ReasonNoCandidates},
		{input(testVIP, "w1", "w2"), ""},
		{input(testVIP, "w3"), election.ReasonNoCandidates}, // w3 is not a member
		{input(testVIP, "w3"), ""},
		{reason(election.ReasonNoMatchingAdvertisement), election.ReasonNoMatchingAdvertisement},
		{Input{IPs: []netip.Addr{netip.MustParseAddr(testVIP)}, Reason: ReasonNoConfig}, ""},
	}
	for i, st := range steps {
		mu.Lock()
		before := len(lines)
		mu.Unlock()
		o.SetService(key, st.in, svc)
		mu.Lock()
		got := slices.Clone(lines[before:])
		mu.Unlock()
		switch {
		case st.newLine == "" && len(got) != 0:
			t.Errorf("step %d (%s): unexpected log %q", i, st.in.Reason, got)
		case st.newLine != "" && (len(got) != 1 || !strings.Contains(got[0], `"reason"="`+st.newLine+`"`)):
			t.Errorf("step %d: logs %q, want one serviceNotAnnounced line with reason %s", i, got, st.newLine)
		}
	}
	o.SetService(key, Input{Reason: ReasonServiceDeleted}, nil)
	if _, ok := o.unannounced[key]; ok {
		t.Error("reason kept after the Service was deleted")
	}
}

// A held node's IPs are answered by its deputy with its MAC; when its data
// path goes down they move to the hash winner, which announces them itself.
func TestHeldNodeDeputyThenTakeover(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.210"
	rank := election.Rank(ip, nodes)
	owner := rank[0]
	all := make(map[string]*owners)
	anns := make(map[string]*fakeAnnouncer)
	for _, n := range nodes {
		all[n], anns[n] = testOwners(t, n, logr.Discard(), nodes...)
		all[n].SetService("ns1/web", input(ip, nodes...), lbService(ip))
	}
	if !anns[owner].announces("ns1/web") {
		t.Fatalf("%s (hash winner, all loads equal) does not announce", owner)
	}
	mac, _ := net.ParseMAC("02:42:ac:12:00:09")
	var deputy string
	for _, n := range rank[1:] {
		o := all[n]
		o.SetSpeaker(owner, ownership.SpeakerGone, time.Now())
		watchersVote(o, owner, ownership.PathUp, "eth0", mac)
		if d := o.eng.Deputy(owner); d == n {
			deputy = n
		}
	}
	if deputy == "" {
		t.Fatal("no deputy among the survivors")
	}
	if got := anns[deputy].proxying("held/" + owner); got["eth0"].String() != mac.String() {
		t.Fatalf("deputy %s proxies %v for %s, want eth0 -> %s", deputy, got, owner, mac)
	}
	for _, n := range rank[1:] {
		if anns[n].announces("ns1/web") {
			t.Fatalf("%s took the IP over while %s is held", n, owner)
		}
	}
	for _, n := range rank[1:] {
		watchersVote(all[n], owner, ownership.PathDown, "", nil)
	}
	if !anns[rank[1]].announces("ns1/web") {
		t.Fatalf("%s (next in hash order) did not take over after %s's data path went down", rank[1], owner)
	}
	if p := anns[deputy].proxying("held/" + owner); p != nil {
		t.Errorf("deputy still proxies for a node that is down: %v", p)
	}
}

// builderIndexer registers indexes (setupIndexes) on a fake client.
type builderIndexer struct{ b *fake.ClientBuilder }

func (i builderIndexer) IndexField(_ context.Context, obj client.Object, field string, fn client.IndexerFunc) error {
	i.b.WithIndex(obj, field, fn)
	return nil
}

// TestTakeoverDoesNotWaitForStatus: with the status writer stuck on an API
// call that never returns, a takeover still reaches the announcer at once.
func TestTakeoverDoesNotWaitForStatus(t *testing.T) {
	scheme, _ := Scheme()
	block := make(chan struct{})
	defer close(block)
	stuck := make(chan struct{}, 16)
	b := fake.NewClientBuilder().WithScheme(scheme)
	if err := setupIndexes(context.Background(), builderIndexer{b}); err != nil {
		t.Fatal(err)
	}
	c := b.WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			stuck <- struct{}{}
			<-block // an API server that never answers
			return cl.List(ctx, list, opts...)
		},
	}).Build()
	nodes := []string{"w1", "w2"}
	ip := "172.18.255.211"
	winner := election.Rank(ip, nodes)[0]
	self := map[string]string{"w1": "w2", "w2": "w1"}[winner]
	o, ann := testOwners(t, self, logr.Discard(), nodes...)
	w := &statusWriter{Client: c, apiRead: c, log: logr.Discard(), opts: Options{NodeName: self, Namespace: testNS}, own: o,
		conflicts: newConflicts(), created: map[string]string{}}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	w.queue.Store(&q)
	o.status = w.Enqueue
	go func() {
		for {
			req, shut := q.Get()
			if shut {
				return
			}
			_, _ = w.Reconcile(context.Background(), req)
			q.Done(req)
		}
	}()
	o.SetService("ns1/web", input(ip, nodes...), lbService(ip))
	select {
	case <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the status writer never called the API")
	}
	start := time.Now()
	o.SetSpeaker(winner, ownership.SpeakerGone, time.Now())
	watchersVote(o, winner, ownership.PathDown, "", nil)
	if !ann.announces("ns1/web") {
		t.Fatal("the survivor does not announce while its status writer is stuck")
	}
	t.Logf("takeover applied %s after the owner's data path went down, status writer blocked", time.Since(start))
}

// TestTakeoverIsOneBatch: when an owner's data path goes down, the survivor
// hands the announcer every Service it takes over in one batch, and checks
// their interfaces and kernel ARP settings once, after announcing them: the
// last IP of a takeover waits for no other Service's work.
func TestTakeoverIsOneBatch(t *testing.T) {
	nodes := []string{"w1", "w2"}
	o, ann := testOwners(t, "w1", logr.Discard(), nodes...)
	for i := range 200 {
		ip := fmt.Sprintf("172.18.250.%d", i)
		o.SetService(fmt.Sprintf("ns1/svc-%03d", i), input(ip, nodes...), lbService(ip))
	}
	var theirs []string
	for i := range 200 {
		if svc := fmt.Sprintf("ns1/svc-%03d", i); !ann.announces(svc) {
			theirs = append(theirs, svc)
		}
	}
	if len(theirs) < 50 || len(theirs) > 150 {
		t.Fatalf("w2 owns %d of 200 Services; want them spread over both nodes", len(theirs))
	}
	ann.calls()
	o.SetSpeaker("w2", ownership.SpeakerGone, time.Now())
	watchersVote(o, "w2", ownership.PathDown, "", nil)
	want := []string{fmt.Sprintf("apply %d", len(theirs)), fmt.Sprintf("kernelCheck %d", len(theirs))}
	if got := ann.calls(); !slices.Equal(got, want) {
		t.Errorf("announcer calls during the takeover %q, want %q", got, want)
	}
	for _, svc := range theirs {
		if !ann.announces(svc) {
			t.Errorf("%s not announced after the takeover", svc)
		}
	}
}

// TestVotesFromWatchers: a node that does not probe the dead owner itself
// (it is not one of its watchers) takes over its IP once a majority of the
// owner's watchers vote it down, received as memberlist messages; one
// watcher's vote, or votes from nodes that are not its watchers, move
// nothing.
func TestVotesFromWatchers(t *testing.T) {
	nodes := []string{"w1", "w2", "w3", "w4", "w5"}
	ip := "172.18.255.212"
	rank := election.Rank(ip, nodes)
	owner, next := rank[0], rank[1]
	o, ann := testOwners(t, next, logr.Discard(), nodes...)
	o.SetService("ns1/web", input(ip, nodes...), lbService(ip))
	o.Merge([]ownership.Claim{{Key: ip, Owner: owner, Epoch: 4}})
	if ann.announces("ns1/web") {
		t.Fatalf("%s announces while %s owns the IP", next, owner)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := newGossip(logr.Discard(), o, newMetrics(nil))
	go g.run(ctx)
	o.mu.Lock()
	watchers := o.eng.Watchers(owner, ownership.WatchersPerNode)
	o.mu.Unlock()
	var others []string
	for _, n := range nodes {
		if n != owner && !slices.Contains(watchers, n) {
			others = append(others, n)
		}
	}
	down := func(watcher string) []byte {
		return ownership.PackVotes([]ownership.Vote{{Node: owner, Watcher: watcher, Path: ownership.PathDown, Seq: uint64(time.Now().UnixNano())}}, 600)[0]
	}
	// Votes from nodes that are not its watchers, and one watcher's, are
	// not enough; a message about another node behind them shows when they
	// were handled.
	for _, n := range others {
		g.NotifyMsg(down(n))
	}
	g.NotifyMsg(down(watchers[0]))
	marker := rank[2]
	o.mu.Lock()
	mw := o.eng.Watchers(marker, ownership.WatchersPerNode)
	o.mu.Unlock()
	for _, w := range mw {
		g.NotifyMsg(ownership.PackVotes([]ownership.Vote{{Node: marker, Watcher: w, Path: ownership.PathUp, Seq: 1}}, 600)[0])
	}
	eventually(t, "the votes handled", 10*time.Second, func() string {
		if _, p := o.path(marker); p != ownership.PathUp {
			return marker + "'s path is " + p.String()
		}
		return ""
	})
	if ann.announces("ns1/web") {
		t.Fatalf("%s took over on the votes of %v and one watcher (%s) of %v", next, others, watchers[0], watchers)
	}
	for _, w := range watchers[1:] {
		g.NotifyMsg(down(w))
	}
	eventually(t, next+" takes over once the watchers agree that "+owner+" is down", 10*time.Second, func() string {
		if !ann.announces("ns1/web") {
			return "not announcing"
		}
		return ""
	})
}

// TestNotifyMsgNeverWaitsForOwnership: memberlist's handler goroutine, which
// calls NotifyMsg, also handles its failure detector's suspect and dead
// messages, and drops messages when it falls 1,024 behind. So NotifyMsg
// queues even while the ownership layer is busy (its lock held), and
// what it queued is merged once the lock is free.
func TestNotifyMsgNeverWaitsForOwnership(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	o, _ := testOwners(t, "w1", logr.Discard(), nodes...)
	const n = 5000
	var msgs [][]byte
	for i := range n {
		msgs = append(msgs, ownership.AppendClaims(nil, ownership.Claim{Key: fmt.Sprintf("10.1.%d.%d", i/256, i%256), Owner: "w2", Epoch: 3}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := newGossip(logr.Discard(), o, newMetrics(nil))
	go g.run(ctx)

	o.mu.Lock() // the ownership layer is busy
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, m := range msgs {
			g.NotifyMsg(m)
		}
		for _, w := range []string{"w1", "w2"} { // w3's watchers
			g.NotifyMsg(ownership.PackVotes([]ownership.Vote{{Node: "w3", Watcher: w, Path: ownership.PathDown, Seq: 1}}, 600)[0])
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		o.mu.Unlock()
		t.Fatalf("NotifyMsg blocked while the ownership lock was held")
	}
	o.mu.Unlock()
	eventually(t, "the queued claims and votes merged", 10*time.Second, func() string {
		if _, p := o.path("w3"); p != ownership.PathDown {
			return "w3's path is " + p.String()
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		for i := range n {
			k := fmt.Sprintf("10.1.%d.%d", i/256, i%256)
			if c, ok := o.eng.Claim(k); !ok || c.Owner != "w2" || c.Epoch != 3 {
				return "claim of " + k + " not merged"
			}
		}
		return ""
	})
}

// TestNodeSetsSwept: node sets no key uses any more (the endpoints of an ETP
// Local Service moved) are dropped, so they do not accumulate.
func TestNodeSetsSwept(t *testing.T) {
	o, _ := testOwners(t, "w1", logr.Discard(), "w1", "w2", "w3")
	ip := "172.18.255.213"
	o.SetService("ns1/web", input(ip, "w1"), lbService(ip))
	o.SetService("ns1/web", input(ip, "w1", "w2"), lbService(ip))
	o.SetService("ns1/web", input(ip, "w2", "w3"), lbService(ip))
	if n := o.sets.Len(); n != 3 {
		t.Fatalf("%d interned sets before the sweep, want 3", n)
	}
	o.Tick(time.Now().Add(setSweepEvery))
	if n := o.sets.Len(); n != 1 {
		t.Fatalf("%d interned sets after the sweep, want only the one in use", n)
	}
}

// TestPreferenceScoresReachEngine: a Service's preference scores decide where
// its IP is placed, and Services sharing a key give each node the lowest of
// their scores, whatever order they arrive in. A score that drops later does
// not move the IP off a node that still serves it.
func TestPreferenceScoresReachEngine(t *testing.T) {
	for _, order := range [][]string{{"ns1/a", "ns1/b"}, {"ns1/b", "ns1/a"}} {
		o, _ := testOwners(t, "w1", logr.Discard(), "w1", "w2", "w3")
		ip := "172.18.255.214"
		scores := map[string]map[string]int64{
			"ns1/a": {"w2": 100, "w3": 50},
			"ns1/b": {"w2": 40, "w3": 50},
		}
		for _, svc := range order {
			in := input(ip, "w1", "w2", "w3")
			in.Scores = scores[svc]
			o.SetService(svc, in, lbService(ip))
		}
		elig := o.eng.Eligible(ip)
		if elig.Score("w2") != 40 || elig.Score("w3") != 50 || elig.Score("w1") != 0 {
			t.Fatalf("order %v: scores w1=%d w2=%d w3=%d, want 0 40 50", order, elig.Score("w1"), elig.Score("w2"), elig.Score("w3"))
		}
		// Placed by the first Service's scores (a: w2, b: w3), then sticky.
		want := map[string]string{"ns1/a": "w2", "ns1/b": "w3"}[order[0]]
		if own, _ := o.eng.Owner(ip); own != want {
			t.Fatalf("order %v: owner %q, want %s", order, own, want)
		}
	}
}

// TestServicesShareEligibleNodes: Services with the same eligible nodes share
// one interned set instead of keeping their own copy of the names (at 10,000
// Services and 1,000 nodes the copies were 160 MB; BenchmarkSpeakerAtScale),
// and a Service's eligible nodes still reach the engine.
func TestServicesShareEligibleNodes(t *testing.T) {
	o, _ := testOwners(t, "w1", logr.Discard(), "w1", "w2", "w3")
	o.SetService("ns1/a", input("172.18.255.215", "w1", "w2", "w3"), lbService("172.18.255.215"))
	o.SetService("ns1/b", input("172.18.255.216", "w3", "w2", "w1"), lbService("172.18.255.216"))
	a, b := o.services["ns1/a"], o.services["ns1/b"]
	if a.eligible != b.eligible || a.eligible.Len() != 3 {
		t.Fatalf("Services with the same eligible nodes hold sets %p (%v) and %p (%v), want one shared set of 3",
			a.eligible, a.eligible.Names(), b.eligible, b.eligible.Names())
	}
	if a.in.Eligible != nil || b.in.Eligible != nil {
		t.Errorf("Services keep their own eligible names too: %v, %v", a.in.Eligible, b.in.Eligible)
	}
	if o.eng.Eligible("172.18.255.215") != a.eligible {
		t.Error("the engine got another set than the Service's")
	}
}

// countingRecorder counts nodeAssigned events.
type countingRecorder struct {
	nopRecorder
	mu       sync.Mutex
	assigned int
}

func (r *countingRecorder) Eventf(_ runtime.Object, _ runtime.Object, _, reason, _, _ string, _ ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reason == EventNodeAssigned {
		r.assigned++
	}
}

// A speaker that learns from a peer, before it syncs, that it owns a new key
// announces it with a nodeAssigned event; one whose ServiceL2Status already
// named it (a restart) resumes without one.
func TestStartupAssignmentLearnedFromPeer(t *testing.T) {
	const ip = "172.18.255.230"
	for _, c := range []struct {
		name  string
		seeds map[string][]Seed
		want  int
	}{
		{"fresh placement by a peer", nil, 1},
		{"restart: ServiceL2Status names this node", map[string][]Seed{"ns1/web": {{Node: "a"}}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &countingRecorder{}
			o := newOwners(logr.Discard(), "a", ownership.Options{Hold: 30 * time.Second}, newFakeAnnouncer(), newMetrics(nil), rec)
			o.SetSpeaker("a", ownership.SpeakerAlive, time.Now())
			o.SetSpeaker("b", ownership.SpeakerAlive, time.Now())
			o.SetService("ns1/web", input(ip, "a", "b"), lbService(ip))
			o.Merge([]ownership.Claim{{Key: ip, Owner: "a", Epoch: 1}}) // placed by b, gossiped
			o.Sync(time.Now(), c.seeds)
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.assigned != c.want {
				t.Errorf("%d nodeAssigned events, want %d", rec.assigned, c.want)
			}
		})
	}
}

// BenchmarkMergeClaims is what a speaker does with a peer's takeover: 5,000
// Services on 4 nodes, one node's ~1,250 keys claimed by another, each claim
// its own gossip message (owners.Merge per message, as NotifyMsg calls it).
// memberlist drops messages once 1,024 wait for the handler, so this cost per
// message bounds how fast a takeover's claims can arrive.
func BenchmarkMergeClaims(b *testing.B) {
	nodes := []string{"w1", "w2", "w3", "w4"}
	for b.Loop() {
		b.StopTimer()
		o := newOwners(logr.Discard(), "w1", ownership.Options{Hold: 30 * time.Second}, newFakeAnnouncer(), newMetrics(nil), nopRecorder{})
		for _, n := range nodes {
			o.SetSpeaker(n, ownership.SpeakerAlive, time.Now())
		}
		o.Sync(time.Now(), nil)
		for i := range 5000 {
			ip := fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)
			o.SetService(fmt.Sprintf("ns/svc-%05d", i), input(ip, nodes...), lbService(ip))
		}
		var claims []ownership.Claim
		for _, c := range o.Claims() {
			if c.Owner == "w4" {
				claims = append(claims, ownership.Claim{Key: c.Key, Owner: "w2", Epoch: c.Epoch + 1})
			}
		}
		b.StartTimer()
		for _, c := range claims {
			o.Merge([]ownership.Claim{c})
		}
		b.ReportMetric(float64(len(claims)), "claims/op")
	}
}

// path returns what o's engine knows of node's speaker and data path.
func (o *owners) path(node string) (ownership.Speaker, ownership.Path) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.eng.Speaker(node)
}

// watchersVote casts p on node from each of its watchers on replica o, as
// their votes arriving would.
func watchersVote(o *owners, node string, p ownership.Path, iface string, mac net.HardwareAddr) {
	o.mu.Lock()
	ws := o.eng.Watchers(node, ownership.WatchersPerNode)
	o.mu.Unlock()
	for _, w := range ws {
		o.Vote(ownership.Vote{Node: node, Watcher: w, Path: p, Seq: uint64(time.Now().UnixNano())}, iface, mac)
	}
}

// TestSharedIPFollowsOneKey: a single-stack IPv4 Service and a dual-stack
// one listed IPv6 first that share the IPv4 address are owned under one key,
// so exactly one node announces the shared address (they used to follow
// their first IPs, two keys placed apart, and two MACs answered).
func TestSharedIPFollowsOneKey(t *testing.T) {
	nodes := []string{"w1", "w2", "w3", "w4"}
	v4, v6 := netip.MustParseAddr("172.18.254.15"), netip.MustParseAddr("fc00:f853:ccd:e799::15")
	a := input(v4.String(), nodes...)
	b := input(v4.String(), nodes...)
	b.IPs = []netip.Addr{v6, v4}
	if a.Key() != b.Key() {
		t.Fatalf("keys %q and %q differ for Services sharing %s", a.Key(), b.Key(), v4)
	}
	announcers := map[string][]string{}
	for _, n := range nodes {
		o, ann := testOwners(t, n, logr.Discard(), nodes...)
		// Some other Services first, so that least-loaded placement has
		// loads to weigh.
		for i := range 5 {
			ip := fmt.Sprintf("172.18.254.%d", 100+i)
			o.SetService(fmt.Sprintf("ns1/other-%d", i), input(ip, nodes...), lbService(ip))
		}
		o.SetService("ns1/sh-b", b, lbService(v6.String()))
		o.SetService("ns1/sh-a", a, lbService(v4.String()))
		for _, svc := range []string{"ns1/sh-a", "ns1/sh-b"} {
			if ann.announces(svc) {
				announcers[svc] = append(announcers[svc], n)
			}
		}
	}
	if len(announcers["ns1/sh-a"]) != 1 || !slices.Equal(announcers["ns1/sh-a"], announcers["ns1/sh-b"]) {
		t.Fatalf("announcers of the Services sharing %s: sh-a %v, sh-b %v; want one node for both", v4, announcers["ns1/sh-a"], announcers["ns1/sh-b"])
	}
}

// TestStatusWaitsForOwnershipSync: a restarted speaker's status writer runs
// before ownership has synced, when Want is empty for every Service. It must
// not delete this node's records then: they are the seeds the restart resumes
// from (in the lab, a speaker killed with -9 and restarted at once deleted
// them, and its IP moved to another node). After Sync it keeps the record of
// what it still owns.
func TestStatusWaitsForOwnershipSync(t *testing.T) {
	scheme, _ := Scheme()
	ip := "172.18.255.201"
	svc := lbService(ip)
	key := client.ObjectKeyFromObject(svc).String()
	record := &v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "l2-w1", Labels: map[string]string{
		v1beta1.ServiceL2StatusNodeLabel: "w1", v1beta1.ServiceL2StatusServiceNameLabel: svc.Name,
		v1beta1.ServiceL2StatusServiceNamespaceLabel: svc.Namespace}},
		Status: v1beta1.MetalLBServiceL2Status{Node: "w1", ServiceName: svc.Name, ServiceNamespace: svc.Namespace}}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(svc, record).WithStatusSubresource(record)
	if err := setupIndexes(context.Background(), builderIndexer{b}); err != nil {
		t.Fatal(err)
	}
	c := b.Build()
	o := newOwners(logr.Discard(), "w1", ownership.Options{Hold: 30 * time.Second}, newFakeAnnouncer(), newMetrics(nil), nopRecorder{})
	for _, n := range []string{"w1", "w2"} {
		o.SetSpeaker(n, ownership.SpeakerAlive, time.Now())
	}
	o.SetService(key, input(ip, "w1", "w2"), svc)
	w := &statusWriter{Client: c, apiRead: c, log: logr.Discard(), opts: Options{NodeName: "w1", Namespace: testNS}, own: o,
		conflicts: newConflicts(), created: map[string]string{}}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)}
	res, err := w.Reconcile(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if items := statuses(t, c); len(items) != 1 || res.RequeueAfter <= 0 {
		t.Fatalf("before ownership synced: records %s, requeue after %v; want the record kept and a requeue", describeStatuses(items), res.RequeueAfter)
	}
	o.Sync(time.Now(), map[string][]Seed{key: {{Node: "w1"}}})
	if _, err := w.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if items := statuses(t, c); len(items) != 1 || items[0].Name != "l2-w1" || items[0].Status.Node != "w1" {
		t.Fatalf("after resuming its IP: records %s, want w1's l2-w1 kept", describeStatuses(items))
	}
}

// TestRecreatedServiceGossipsKeptClaim: a Service re-created within the
// kept-claim window keeps its owner on a replica that kept the claim, and
// that replica gossips the claim at once, so that a peer which forgot it
// (restarted meanwhile) and placed the key afresh at a lower epoch converges
// without waiting for a push/pull.
func TestRecreatedServiceGossipsKeptClaim(t *testing.T) {
	const ip = "172.18.255.231"
	o, _ := testOwners(t, "a", logr.Discard(), "a", "b")
	var sent []ownership.Claim
	o.broadcast = func(c []ownership.Claim) { sent = append(sent, c...) }
	o.SetService("ns1/web", input(ip, "a", "b"), lbService(ip))
	o.Merge([]ownership.Claim{{Key: ip, Owner: "b", Epoch: 7}}) // b took it over once
	o.SetService("ns1/web", Input{Reason: ReasonServiceDeleted}, nil)
	sent = nil
	o.SetService("ns1/web", input(ip, "a", "b"), lbService(ip))
	if len(sent) != 1 || sent[0] != (ownership.Claim{Key: ip, Owner: "b", Epoch: 7}) {
		t.Fatalf("re-created Service: gossiped %v, want the kept claim (b, epoch 7)", sent)
	}
}

// TestGoneMemberStatusResynced: when a member is declared gone, the Services
// this node owns get their status synced again, so that the gone member's
// leftover ServiceL2Status (which a live member would delete itself) goes now.
func TestGoneMemberStatusResynced(t *testing.T) {
	const ip = "172.18.255.232"
	o, _ := testOwners(t, "a", logr.Discard(), "a", "b")
	o.SetService("ns1/web", input(ip, "a"), lbService(ip)) // only a may own it
	var queued []string
	o.status = func(svc string) { queued = append(queued, svc) }
	o.SetSpeaker("b", ownership.SpeakerGone, time.Now())
	if !slices.Contains(queued, "ns1/web") {
		t.Fatalf("b gone: status queued for %v, want ns1/web (owned by a)", queued)
	}
	if o.KeepsStatus("ns1/web")("b") {
		t.Error("a gone member cleans its own status records")
	}
}
