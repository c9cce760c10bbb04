package speaker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/internal/statusview"
)

func statusOf(o *owners, ann announcer) *statusSource {
	return &statusSource{self: o.self, own: o, ann: ann, conflicts: newConflicts()}
}

func snapService(t *testing.T, s statusview.Snapshot, name string) statusview.Service {
	t.Helper()
	for _, svc := range s.Services {
		if svc.Name == name {
			return svc
		}
	}
	t.Fatalf("snapshot of %s has no Service %s: %+v", s.Node, name, s.Services)
	return statusview.Service{}
}

// The snapshot shows the engine's claim, what the announcer was told, the
// candidates in hash order and the owner change that placed the key.
func TestSnapshotShowsOwnership(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.220"
	rank := election.Rank(ip, nodes)
	snaps := map[string]statusview.Snapshot{}
	for _, n := range nodes {
		o, ann := testOwners(t, n, logr.Discard(), nodes...)
		o.SetService("ns1/web", input(ip, nodes...), lbService(ip))
		o.SetService("ns1/other", input("172.18.255.221", nodes...), lbService("172.18.255.221"))
		snaps[n] = statusOf(o, ann).Snapshot(context.Background(), statusview.Filter{Service: "ns1/web"})
	}
	owner := rank[0] // all loads equal: the hash winner
	for n, s := range snaps {
		if s.SchemaVersion != statusview.SchemaVersion || s.Node != n || !s.Synced {
			t.Errorf("%s: header %+v", n, s)
		}
		if len(s.Services) != 1 {
			t.Fatalf("%s: filter by Service gave %d Services", n, len(s.Services))
		}
		svc := snapService(t, s, "ns1/web")
		if svc.Owner != owner || svc.Epoch != 1 || !svc.Serving || svc.Announcing != (n == owner) {
			t.Errorf("%s: %+v, want owner %s epoch 1 serving, announcing only on the owner", n, svc, owner)
		}
		if !slices.Equal(svc.Candidates, rank) || !slices.Equal(svc.IPs, []string{ip}) || svc.Pool != "p1" {
			t.Errorf("%s: candidates %v ips %v pool %s, want %v [%s] p1", n, svc.Candidates, svc.IPs, svc.Pool, rank, ip)
		}
		if len(s.Nodes) != 3 || s.Nodes[0].Speaker != "alive" {
			t.Errorf("%s: nodes %+v", n, s.Nodes)
		}
		if len(s.Changes) != 1 || s.Changes[0].Key != ip || s.Changes[0].To != owner || s.Changes[0].Reason != string(ownership.ReasonPlaced) ||
			!slices.Equal(s.Changes[0].Services, []string{"ns1/web"}) {
			t.Errorf("%s: changes %+v, want the placement of %s only (filtered)", n, s.Changes, ip)
		}
	}
	var src []statusview.Source
	for n, s := range snaps {
		src = append(src, statusview.Source{Node: n, Pod: "speaker-" + n, Snapshot: &s})
	}
	r := statusview.Merge(time.Now(), src)
	if len(r.Problems) != 0 || r.Services[0].Announcer != owner {
		t.Errorf("merged: announcer %q, problems %+v", r.Services[0].Announcer, r.Problems)
	}
}

// A failover is recorded with its cause on every speaker; the history keeps
// the last changeHistory changes, oldest first.
func TestSnapshotChangeHistory(t *testing.T) {
	nodes := []string{"w1", "w2"}
	o, ann := testOwners(t, "w1", logr.Discard(), nodes...)
	st := statusOf(o, ann)
	for i := range changeHistory + 10 {
		ip := fmt.Sprintf("172.18.%d.%d", 1+i/250, 1+i%250)
		o.SetService(fmt.Sprintf("ns1/s%d", i), input(ip, nodes...), lbService(ip))
	}
	s := st.Snapshot(context.Background(), statusview.Filter{})
	if len(s.Changes) != changeHistory {
		t.Fatalf("%d changes kept, want %d", len(s.Changes), changeHistory)
	}
	if s.Changes[0].Services[0] != "ns1/s10" || s.Changes[changeHistory-1].Services[0] != fmt.Sprintf("ns1/s%d", changeHistory+9) {
		t.Errorf("history %s .. %s, want ns1/s10 .. the last", s.Changes[0].Services, s.Changes[changeHistory-1].Services)
	}
	// The peer's data path goes down: its keys move here, with that cause.
	watchersVote(o, "w2", ownership.PathDown, "", nil)
	s = st.Snapshot(context.Background(), statusview.Filter{})
	last := s.Changes[len(s.Changes)-1]
	if last.From != "w2" || last.To != "w1" || last.Reason != string(ownership.ReasonOwnerDown) {
		t.Errorf("last change %+v, want w2 -> w1 ownerDataPathDown", last)
	}
}

// Filtering by IP matches any of a Service's IPs; interfaces missing on
// this node and conflicts are reported for the Services they concern.
func TestSnapshotFilterInterfacesConflicts(t *testing.T) {
	o, ann := testOwners(t, "w1", logr.Discard(), "w1")
	dual := input("172.18.255.230", "w1")
	dual.IPs = append(dual.IPs, netip.MustParseAddr("fd00::230"))
	o.SetService("ns1/dual", dual, lbService("172.18.255.230"))
	eth9 := input("172.18.255.231", "w1")
	eth9.AllInterfaces, eth9.Interfaces = false, []string{"eth9"}
	o.SetService("ns1/eth9", eth9, lbService("172.18.255.231"))
	st := statusOf(o, ann)
	st.conflicts.set("ns1/dual", conflictRecord{Conflict: layer2.Conflict{IP: netip.MustParseAddr("172.18.255.230"),
		MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x99}, Interface: "eth0"}, last: time.Now()})

	s := st.Snapshot(context.Background(), statusview.Filter{IP: "fd00::230"})
	if len(s.Services) != 1 || s.Services[0].Name != "ns1/dual" {
		t.Fatalf("filter by the second IP: %+v", s.Services)
	}
	if c := s.Services[0].Conflict; c == nil || c.MAC != "02:00:00:00:00:99" {
		t.Errorf("conflict %+v, want the other host's MAC", c)
	}
	s = st.Snapshot(context.Background(), statusview.Filter{})
	if svc := snapService(t, s, "ns1/eth9"); !svc.MissingInterfaces || svc.AllInterfaces || !slices.Equal(svc.Interfaces, []string{"eth9"}) {
		t.Errorf("ns1/eth9: %+v, want eth9 missing (the node has %v)", svc, s.Interfaces)
	}
	if svc := snapService(t, s, "ns1/dual"); svc.MissingInterfaces || !svc.AllInterfaces {
		t.Errorf("ns1/dual: %+v, want all interfaces", svc)
	}
}

// A deputy's snapshot lists the held node it answers for, and the held
// node's state.
func TestSnapshotHeldNode(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.240"
	owner := election.Rank(ip, nodes)[0]
	mac, _ := net.ParseMAC("02:42:ac:12:00:09")
	for _, n := range nodes {
		if n == owner {
			continue
		}
		o, ann := testOwners(t, n, logr.Discard(), nodes...)
		o.SetService("ns1/web", input(ip, nodes...), lbService(ip))
		o.SetSpeaker(owner, ownership.SpeakerGone, time.Now())
		watchersVote(o, owner, ownership.PathUp, "eth0", mac)
		s := statusOf(o, ann).Snapshot(context.Background(), statusview.Filter{})
		i := slices.IndexFunc(s.Nodes, func(nd statusview.Node) bool { return nd.Name == owner })
		nd := s.Nodes[i]
		if !nd.Held || nd.Speaker != "gone" || nd.Path != "up" || nd.Deputy == "" {
			t.Fatalf("%s's view of %s: %+v, want held with a deputy", n, owner, nd)
		}
		isDeputy := nd.Deputy == n
		if got := len(s.Proxies) == 1 && s.Proxies[0].Node == owner && slices.Equal(s.Proxies[0].IPs, []string{ip}); got != isDeputy {
			t.Errorf("%s (deputy %v): proxies %+v", n, isDeputy, s.Proxies)
		}
	}
}

// GET /status answers loopback clients only, with the filter applied, and
// refuses a malformed IP naming it.
func TestStatusHTTP(t *testing.T) {
	o, ann := testOwners(t, "w1", logr.Discard(), "w1")
	o.SetService("ns1/web", input("172.18.255.250", "w1"), lbService("172.18.255.250"))
	st := statusOf(o, ann)
	get := func(remote, query string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, statusview.Path+query, nil)
		req.RemoteAddr = remote
		w := httptest.NewRecorder()
		st.ServeHTTP(w, req)
		return w
	}
	w := get("127.0.0.1:5000", "?ip=172.18.255.250")
	var s statusview.Snapshot
	if err := json.Unmarshal(w.Body.Bytes(), &s); w.Code != http.StatusOK || err != nil || len(s.Services) != 1 {
		t.Fatalf("loopback: HTTP %d, %v: %s", w.Code, err, w.Body)
	}
	if w := get("[::1]:5000", "?service=ns1/none"); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"services":[]`) {
		t.Errorf("IPv6 loopback, unknown Service: HTTP %d %s", w.Code, w.Body)
	}
	if w := get("172.18.0.100:5000", ""); w.Code != http.StatusForbidden {
		t.Errorf("non-loopback client: HTTP %d, want 403", w.Code)
	}
	if w := get("127.0.0.1:5000", "?ip=300.1.1.1"); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "ip=300.1.1.1") {
		t.Errorf("bad ip: HTTP %d %s", w.Code, w.Body)
	}
}

// An ownership change logs exactly one info line, with its cause, on each
// node it involves; announcing and withdrawing are debug.
func TestOneInfoLinePerOwnerChange(t *testing.T) {
	var mu sync.Mutex
	info := map[string][]string{}
	logger := func(node string) logr.Logger {
		return funcr.New(func(_, args string) {
			mu.Lock()
			defer mu.Unlock()
			info[node] = append(info[node], args)
		}, funcr.Options{Verbosity: 0})
	}
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.245"
	rank := election.Rank(ip, nodes)
	all := map[string]*owners{}
	for _, n := range nodes {
		all[n], _ = testOwners(t, n, logger(n), nodes...)
	}
	count := func(node, substr string) int {
		mu.Lock()
		defer mu.Unlock()
		c := 0
		for _, l := range info[node] {
			if strings.Contains(l, substr) {
				c++
			}
		}
		return c
	}
	reset := func() {
		mu.Lock()
		defer mu.Unlock()
		info = map[string][]string{}
	}
	reset()
	for _, n := range nodes {
		all[n].SetService("ns1/web", input(ip, nodes...), lbService(ip))
	}
	// Placed on the hash winner: one line there, none elsewhere.
	for _, n := range nodes {
		want := 0
		if n == rank[0] {
			want = 1
		}
		if got := count(n, ip); got != want || count(n, `"reason"="placed"`) != want {
			t.Errorf("placement: %s logged %d info lines naming %s, want %d: %q", n, got, ip, want, info[n])
		}
	}
	reset()
	for _, n := range nodes {
		watchersVote(all[n], rank[0], ownership.PathDown, "", nil)
	}
	for _, n := range nodes {
		want := 0
		if n == rank[0] || n == rank[1] {
			want = 1
		}
		if got := count(n, ip); got != want || count(n, `"reason"="ownerDataPathDown"`) != want {
			t.Errorf("failover: %s logged %d info lines naming %s, want %d with the cause: %q", n, got, ip, want, info[n])
		}
	}
}

// TestStatusFromRunningSpeakers reads /status from two real speakers (an API
// server, memberlist on loopback): they agree on the owner the
// ServiceL2Status shows, and a node labelled exclude-from-external-load-
// balancers is reported with that reason, read from the speakers' caches.
func TestStatusFromRunningSpeakers(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, _ := startEnv(t)
	port := freeUDPTCPPort(t, "127.0.0.1", "127.0.0.2")
	nodes, _, _ := seed(t, c)
	speakers := runSpeakers(t, cfg, nodes, port)
	winner := election.Rank(testVIP, []string{"w1", "w2"})[0]
	other := map[string]string{"w1": "w2", "w2": "w1"}[winner]
	eventually(t, "ServiceL2Status from "+winner, 60*time.Second, checkOwner(t, c, winner))
	speakers.waitReady(t)

	report := func() (statusview.Report, string) {
		var src []statusview.Source
		for n, readyURL := range speakers.readyz {
			url := strings.TrimSuffix(readyURL, "/readyz") + statusview.Path + "?service=ns1/web"
			resp, err := http.Get(url)
			if err != nil {
				return statusview.Report{}, err.Error()
			}
			var s statusview.Snapshot
			err = json.NewDecoder(resp.Body).Decode(&s)
			_ = resp.Body.Close() // read in full
			if err != nil {
				return statusview.Report{}, err.Error()
			}
			src = append(src, statusview.Source{Node: n, Pod: "speaker-" + n, Snapshot: &s})
		}
		return statusview.Merge(time.Now(), src), ""
	}
	eventually(t, "both speakers agree "+winner+" announces", 30*time.Second, func() string {
		r, err := report()
		switch {
		case err != "":
			return err
		case len(r.Problems) > 0 || len(r.Services) != 1 || r.Services[0].Announcer != winner || !r.Membership.Agree:
			return fmt.Sprintf("%+v", r)
		}
		return ""
	})

	var n corev1.Node
	if err := c.Get(context.Background(), client.ObjectKey{Name: other}, &n); err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{corev1.LabelNodeExcludeBalancers: ""}
	if err := c.Update(context.Background(), &n); err != nil {
		t.Fatal(err)
	}
	eventually(t, other+" shown as excluded by its label", 30*time.Second, func() string {
		r, err := report()
		if err != "" {
			return err
		}
		for _, ns := range r.Services[0].Nodes {
			if ns.Node == other && ns.State == election.NodeExcludedByLabel {
				return ""
			}
		}
		return fmt.Sprintf("%+v", r.Services)
	})
}

// TestSnapshotCandidatesFollowPreferences: with preferredNodeSelectors the
// election order puts the highest score first, then the hash order.
func TestSnapshotCandidatesFollowPreferences(t *testing.T) {
	nodes := []string{"w1", "w2", "w3"}
	ip := "172.18.255.222"
	rank := election.Rank(ip, nodes)
	preferred := rank[len(rank)-1] // last by hash
	o, ann := testOwners(t, "w1", logr.Discard(), nodes...)
	in := input(ip, nodes...)
	in.Scores = map[string]int64{preferred: 50}
	o.SetService("ns1/pref", in, lbService(ip))
	svc := snapService(t, statusOf(o, ann).Snapshot(context.Background(), statusview.Filter{Service: "ns1/pref"}), "ns1/pref")
	want := append([]string{preferred}, rank[:len(rank)-1]...)
	if !slices.Equal(svc.Candidates, want) {
		t.Errorf("candidates %v, want %v (score 50 first, then hash order)", svc.Candidates, want)
	}
	if svc.Owner != preferred {
		t.Errorf("owner %s, want the preferred %s", svc.Owner, preferred)
	}
}

// Asked to (Filter.Segment), a speaker asks the segment who answers for the
// IPs it announces, and another host answering is the Service's conflict,
// which the merged report counts as a problem; without Segment nothing is
// asked.
func TestSnapshotSegmentSurvey(t *testing.T) {
	o, ann := testOwners(t, "w1", logr.Discard(), "w1")
	o.SetService("ns1/mine", input("172.18.254.15", "w1"), lbService("172.18.254.15"))
	o.SetService("ns1/quiet", input("172.18.254.16", "w1"), lbService("172.18.254.16"))
	st := statusOf(o, ann)
	var mu sync.Mutex
	var asked []string
	st.survey = func(_ context.Context, addr netip.Addr, _ time.Duration) ([]layer2.SurveyAnswer, layer2.ProbeReason, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, addr.String())
		if addr.String() == "172.18.254.15" {
			return []layer2.SurveyAnswer{{Interface: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x77}}}, layer2.ProbeAnswered, nil
		}
		return nil, layer2.ProbeAnswered, nil
	}
	if s := st.Snapshot(context.Background(), statusview.Filter{}); len(asked) != 0 || s.Surveyed != 0 {
		t.Fatalf("asked the segment without Segment: %v", asked)
	}
	s := st.Snapshot(context.Background(), statusview.Filter{Segment: true})
	slices.Sort(asked)
	if !slices.Equal(asked, []string{"172.18.254.15", "172.18.254.16"}) || s.Surveyed != 2 {
		t.Fatalf("asked about %v (surveyed %d), want both announced IPs", asked, s.Surveyed)
	}
	if c := snapService(t, s, "ns1/mine").Conflict; c == nil || c.MAC != "02:00:00:00:00:77" || c.IP != "172.18.254.15" {
		t.Fatalf("conflict %+v, want the other host answering for 172.18.254.15", c)
	}
	if c := snapService(t, s, "ns1/quiet").Conflict; c != nil {
		t.Errorf("conflict %+v on a Service nobody else answers for", c)
	}
	r := statusview.Merge(time.Now(), []statusview.Source{{Node: "w1", Snapshot: &s}})
	if r.ExitCode() == 0 {
		t.Errorf("a second host answering for an announced IP, exit code 0: %+v", r.Problems)
	}
}
