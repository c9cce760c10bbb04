package nemesis

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	nodes   = []string{"cp", "w1", "w2", "w3"}
	workers = []string{"w1", "w2", "w3"}
)

func TestGenerateIsSeeded(t *testing.T) {
	o := Options{Nodes: nodes, Workers: workers, Duration: 10 * time.Minute}
	a, err := Generate(42, o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(42, o)
	c, _ := Generate(43, o)
	if a.String() != b.String() {
		t.Errorf("one seed, two schedules:\n%s\n%s", a, b)
	}
	if a.String() == c.String() {
		t.Errorf("seeds 42 and 43 gave the same schedule:\n%s", a)
	}
	if !strings.Contains(a.String(), "E2E_NEMESIS_SEED=42") {
		t.Errorf("the printed schedule does not say how to replay it:\n%s", a)
	}
}

func TestGenerateRespectsTheRules(t *testing.T) {
	seen := map[Kind]bool{}
	pairs := 0
	for seed := range uint64(200) {
		o := Options{Nodes: nodes, Workers: workers, Duration: 5 * time.Minute, Quiet: 5 * time.Second}
		s, err := Generate(seed, o)
		if err != nil {
			t.Fatal(err)
		}
		var total time.Duration
		for _, ep := range s.Episodes {
			total += ep.Span() + s.Quiet
			if n := len(ep.Faults); n < 1 || n > 2 {
				t.Fatalf("seed %d: an episode of %d faults: %+v", seed, n, ep)
			}
			if len(ep.Faults) == 2 {
				pairs++
				a, b := ep.Faults[0], ep.Faults[1]
				for _, n := range a.Nodes {
					if slices.Contains(b.Nodes, n) {
						t.Errorf("seed %d: two faults at once on %s: %v, %v", seed, n, a, b)
					}
				}
				if b.Start > a.Duration {
					t.Errorf("seed %d: the second fault starts at %v, after the first (%v) ended", seed, b.Start, a.Duration)
				}
			}
			for _, f := range ep.Faults {
				seen[f.Kind] = true
				bnd := durations[f.Kind]
				if f.Duration < bnd[0] || f.Duration > bnd[1] {
					t.Errorf("seed %d: %v lasts %v, outside %v", seed, f, f.Duration, bnd)
				}
				if f.Kind == NodeKill && !slices.Contains(workers, f.Nodes[0]) {
					t.Errorf("seed %d: node-kill of %s, not a worker", seed, f.Nodes[0])
				}
				if f.Kind == CablePull && !slices.Equal(f.DataPathDown, f.Nodes) {
					t.Errorf("seed %d: %v: a pulled cable takes its node's data path down", seed, f)
				}
				if len(ep.Faults) == 2 && apiConflict(ep.Faults[0].Kind, ep.Faults[1].Kind) {
					t.Errorf("seed %d: %v and %v both need the API server", seed, ep.Faults[0], ep.Faults[1])
				}
				if f.Kind == Partition22 && len(f.Nodes) != 2 {
					t.Errorf("seed %d: %v: not a 2|2 split", seed, f)
				}
			}
		}
		if total < o.Duration {
			t.Errorf("seed %d: %v of faults and quiet, want at least %v", seed, total, o.Duration)
		}
	}
	for _, k := range AllKinds {
		if !seen[k] {
			t.Errorf("200 schedules never drew %s", k)
		}
	}
	if pairs == 0 {
		t.Error("200 schedules never had two faults at once")
	}
	if _, err := Generate(1, Options{Nodes: nodes, Kinds: []Kind{NodeKill}}); err == nil {
		t.Error("node-kill with no worker to kill: no error")
	}
	if _, err := ParseKinds("cable-pull,bogus"); err == nil {
		t.Error("ParseKinds accepted an unknown kind")
	}
	if ks, err := ParseKinds("cable-pull, node-kill"); err != nil || !slices.Equal(ks, []Kind{CablePull, NodeKill}) {
		t.Errorf("ParseKinds = %v, %v", ks, err)
	}
}

// A lab of four nodes; macs name them.
var macs = map[string]string{"02:00:00:00:00:01": "cp", "02:00:00:00:00:02": "w1", "02:00:00:00:00:03": "w2", "02:00:00:00:00:04": "w3"}

func mac(node string) string {
	for m, n := range macs {
		if n == node {
			return m
		}
	}
	panic(node)
}

var t0 = time.Date(2026, 11, 28, 15, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// answers: node answers ip once per 100 ms bucket (5 ms after the request) in [from, to) seconds.
func answers(ip, node string, from, to float64) []ARPSample {
	var out []ARPSample
	for ms := int(from * 1000); ms < int(to*1000); ms += 100 {
		out = append(out, ARPSample{At: t0.Add(time.Duration(ms+5) * time.Millisecond), IP: ip, MAC: mac(node)})
	}
	return out
}

func join(parts ...[]ARPSample) []ARPSample { return slices.Concat(parts...) }

// heardBy marks samples as heard by client.
func heardBy(client string, s []ARPSample) []ARPSample {
	for i := range s {
		s[i].Client = client
	}
	return s
}

func fault(ep int, k Kind, victims []string, from, to float64) Applied {
	down, impaired := effects(k, victims, nodes)
	return Applied{Fault: Fault{Kind: k, Nodes: victims, DataPathDown: down, Impaired: impaired, Duration: at(to).Sub(at(from))},
		Episode: ep, Start: at(from), End: at(to)}
}

const ip = "172.18.255.200"

func obs(arp []ARPSample, faults ...Applied) Observations {
	return Observations{Nodes: nodes, IPs: []string{ip}, ARPStart: t0, ARPEnd: at(30), ARPInterval: 100 * time.Millisecond,
		ARP: arp, MACNode: macs, Faults: faults}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		obs  Observations
		// want: substrings of the violations, in order; none: it passes.
		want []string
		// moves and needless: ARP moves counted in the fault's window.
		moves, needless int
		conv            time.Duration
	}{
		{
			name: "cable pull on a non-owner: nothing moves",
			obs:  obs(answers(ip, "w1", 0, 30), fault(1, CablePull, []string{"w2"}, 10, 12)),
		},
		{
			name: "cable pull on a non-owner moves the IP onto it (issue 25's first row)",
			obs: obs(join(answers(ip, "w1", 0, 12.5), answers(ip, "w2", 12.5, 30)),
				fault(1, CablePull, []string{"w2"}, 10, 12)),
			want:  []string{"needless move", "w1 -> w2"},
			moves: 1, needless: 1, conv: 500 * time.Millisecond,
		},
		{
			name: "owner killed, the IP moves once within 0.5 s; restored, nothing moves back",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 10.5, 30)),
				fault(1, NodeKill, []string{"w1"}, 10, 15)),
			moves: 1,
		},
		{
			name: "owner restored, the IP fails back: needless",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 10.5, 16), answers(ip, "w1", 16, 30)),
				fault(1, NodeKill, []string{"w1"}, 10, 12)),
			want:  []string{"needless move", "w2 -> w1", "converged 4s after the heal"},
			moves: 2, needless: 1, conv: 4 * time.Second,
		},
		{
			name: "owner's cable pulled, a detector 1.5 s late still counts as needed",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 11.0, 30)),
				fault(1, CablePull, []string{"w1"}, 10, 10.3)),
			// Unanswered 10.0-11.0 is 1 s: at the bound, not past it; the
			// heal at 10.3 and the move at 11.0 make the convergence 0.7 s.
			moves: 1, conv: 700 * time.Millisecond,
		},
		{
			name: "two MACs answer for 2 s after a memberlist cut (the isolated node claims everything)",
			obs: obs(join(answers(ip, "w1", 0, 30), answers(ip, "w3", 20, 22)),
				fault(1, MemberlistCut, []string{"w3"}, 5, 25)),
			want: []string{"answered by 2 MACs"},
		},
		{
			name: "a 300 ms handover overlap is within the bound",
			obs: obs(join(answers(ip, "w1", 0, 10.8), answers(ip, "w2", 10.5, 30)),
				fault(1, NodeKill, []string{"w1"}, 10, 15)),
			moves: 1,
		},
		{
			name: "nobody answers for 1.5 s under a single fault that leaves a majority up",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 11.5, 30)),
				fault(1, NodeKill, []string{"w1"}, 10, 15)),
			want:  []string{"answered by nobody for 1.5s"},
			moves: 1,
		},
		{
			name: "a fault that starts within a bucket owns the silence of that bucket",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 11.5, 30)),
				fault(1, NodeKill, []string{"w1"}, 10.05, 15)),
			want:  []string{"episode 1 (node-kill w1): " + ip + " answered by nobody for 1.5s"},
			moves: 1,
		},
		{
			name: "nobody answers for 1.5 s during a 2|2 partition: no majority, no bound",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w1", 11.5, 30)),
				fault(1, Partition22, []string{"cp", "w1"}, 10, 15)),
		},
		{
			name: "two faults at once: nobody answering 1.5 s is reported, not bounded",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 11.5, 30)),
				fault(1, NodeKill, []string{"w1"}, 10, 15), fault(1, SpeakerStop, []string{"w3"}, 10, 12)),
			moves: 1,
		},
		{
			name: "after the heal the IP flaps for 3 s: convergence bound missed",
			obs: obs(join(answers(ip, "w1", 0, 10), answers(ip, "w2", 10.5, 17.5), answers(ip, "w1", 17.5, 18), answers(ip, "w2", 18, 30)),
				fault(1, NodeKill, []string{"w1"}, 10, 15)),
			want:  []string{"needless move", "needless move", "converged 3s after the heal"},
			moves: 3, needless: 2, conv: 3 * time.Second,
		},
		{
			name: "still two MACs at the end of the window: not converged",
			obs: obs(join(answers(ip, "w1", 0, 30), answers(ip, "w3", 14, 30)),
				fault(1, MemberlistCut, []string{"w3"}, 5, 12)),
			want: []string{"answered by 2 MACs", "not converged"},
		},
		{
			name: "an unknown MAC takes the IP",
			obs: obs(join(answers(ip, "w1", 0, 10), func() []ARPSample {
				s := answers(ip, "w1", 10, 30)
				for i := range s {
					s[i].MAC = "02:00:00:00:00:99"
				}
				return s
			}()), fault(1, SpeakerKill, []string{"w1"}, 5, 5)),
			want:  []string{"needless move", "unknown MAC", "converged 5s after the heal"},
			moves: 1, needless: 1, conv: 5 * time.Second,
		},
		{
			name: "two clients: one hears no answer for 2 s under a single fault while the other hears the owner",
			obs: obs(join(heardBy("mypc", answers(ip, "w1", 0, 30)),
				heardBy("mypc2", join(answers(ip, "w1", 0, 10), answers(ip, "w1", 12, 30)))),
				fault(1, CablePull, []string{"w2"}, 10, 11)),
			want: []string{ip + " answered by nobody at mypc2 for 2s"},
		},
		{
			name: "two clients: each hears one MAC, a different one, for 2 s",
			obs: obs(join(heardBy("mypc", answers(ip, "w1", 0, 30)),
				heardBy("mypc2", join(answers(ip, "w1", 0, 10), answers(ip, "w3", 10, 12), answers(ip, "w1", 12, 30)))),
				fault(1, MemberlistCut, []string{"w3"}, 9, 20)),
			want: []string{"answered by 2 MACs"},
		},
		{
			name: "two clients hear the same owner: nothing to report",
			obs: obs(join(heardBy("mypc", answers(ip, "w1", 0, 30)), heardBy("mypc2", answers(ip, "w1", 0, 30))),
				fault(1, CablePull, []string{"w2"}, 10, 11)),
		},
		{
			name: "no fault, nobody answers for 2 s",
			obs:  obs(join(answers(ip, "w1", 0, 3), answers(ip, "w1", 5, 30)), fault(1, APIServerDown, nil, 10, 15)),
			want: []string{"baseline", "with no fault"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Check(tc.obs, Limits{})
			s := rep.String()
			if len(tc.want) == 0 && len(rep.Violations) > 0 {
				t.Errorf("violations %v, want none; report:\n%s", rep.Violations, s)
			}
			all := strings.Join(rep.Violations, "\n")
			for _, w := range tc.want {
				i := strings.Index(all, w)
				if i < 0 {
					t.Errorf("no violation mentions %q; report:\n%s", w, s)
					continue
				}
				all = all[i+len(w):]
			}
			var moves, needless int
			var conv time.Duration
			for _, w := range rep.Windows {
				moves += len(w.Moves)
				needless += w.NeedlessMoves
				conv = max(conv, w.Convergence)
			}
			if moves != tc.moves || needless != tc.needless {
				t.Errorf("%d moves (%d needless), want %d (%d); report:\n%s", moves, needless, tc.moves, tc.needless, s)
			}
			if conv != tc.conv {
				t.Errorf("convergence %v, want %v; report:\n%s", conv, tc.conv, s)
			}
		})
	}
}

func TestCheckCountsPerWindow(t *testing.T) {
	o := obs(answers(ip, "w1", 0, 30), fault(1, CablePull, []string{"w2"}, 5, 6), fault(2, SpeakerStop, []string{"w3"}, 15, 20))
	o.Breaks = []Event{{At: at(5.5), IP: ip}, {At: at(16), IP: ip}, {At: at(17), IP: ip}}
	o.NewConns = []Event{{At: at(1), IP: ip, OK: true}, {At: at(5.2), IP: ip}, {At: at(5.3), IP: ip, OK: true}, {At: at(18), IP: ip, OK: true}}
	o.Owners = []Event{{At: at(0), IP: ip, Node: "w1"}, {At: at(16), IP: ip, Node: "w3"}, {At: at(16.5), IP: ip, Node: "w1"}}
	rep := Check(o, Limits{})
	if len(rep.Windows) != 3 {
		t.Fatalf("%d windows, want baseline and 2 episodes:\n%s", len(rep.Windows), rep)
	}
	b, e1, e2 := rep.Windows[0], rep.Windows[1], rep.Windows[2]
	if b.NewConns != 1 || b.FailedNew != 0 || b.Breaks != 0 {
		t.Errorf("baseline: %d/%d failed, %d breaks", b.FailedNew, b.NewConns, b.Breaks)
	}
	if e1.NewConns != 2 || e1.FailedNew != 1 || e1.Breaks != 1 {
		t.Errorf("episode 1: %d/%d failed, %d breaks; want 1/2, 1", e1.FailedNew, e1.NewConns, e1.Breaks)
	}
	if e2.Breaks != 2 || e2.NewConns != 1 || len(e2.StatusMoves) != 2 || e2.NeedlessStatusMoves != 2 {
		t.Errorf("episode 2: %d breaks, %d new, %d status moves (%d needless); want 2, 1, 2 (2)", e2.Breaks, e2.NewConns, len(e2.StatusMoves), e2.NeedlessStatusMoves)
	}
	if !e1.Converged || !e2.Converged || e1.Convergence != 0 {
		t.Errorf("converged %v %v (%v), want both at once:\n%s", e1.Converged, e2.Converged, e1.Convergence, rep)
	}
	if !strings.Contains(rep.String(), "ServiceL2Status move") {
		t.Errorf("the report does not list the ServiceL2Status moves:\n%s", rep)
	}
}
