package ownership

import (
	"fmt"
	"testing"
	"time"
)

// scaleCluster is a synced engine with nKeys keys placed over nNodes nodes,
// every key eligible on every node; with prefer, the even-numbered half of
// the nodes scores 100 (preferredNodeSelectors).
func scaleCluster(b *testing.B, nNodes, nKeys int, fb Failback, prefer bool) (*Engine, []string) {
	b.Helper()
	nodes := make([]string, nNodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%04d", i)
	}
	e := New(Options{Self: nodes[0], Failback: fb, Hold: 30 * time.Second})
	for _, n := range nodes {
		e.SetSpeaker(n, SpeakerAlive, t0)
	}
	var scores map[string]int64
	if prefer {
		scores = map[string]int64{}
		for i := 0; i < nNodes; i += 2 {
			scores[nodes[i]] = 100
		}
	}
	all := NewInterner().Intern(nodes, scores)
	// Claims as a running cluster would have them (hash-placed), learned
	// before sync like a restarted speaker: placing 10,000 keys one by one
	// is not what is measured here.
	var claims []Claim
	for i := range nKeys {
		key := fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
		claims = append(claims, Claim{Key: key, Owner: e.winner(key, all, ""), Epoch: 1})
		e.SetKey(key, all)
	}
	e.Merge(claims)
	e.SetSynced(t0)
	return e, nodes
}

// BenchmarkMembershipEvent is issue 10's figure: the CPU one membership
// event costs at 10,000 IPs and 1,000 nodes. One op is a node's death as a
// speaker sees it (speaker gone, hold running; then its data path down, its
// keys re-placed) plus its return (no failback), so 3 events.
func BenchmarkMembershipEvent(b *testing.B) {
	for _, fb := range []Failback{FailbackNever, FailbackImmediate} {
		for _, sz := range []struct {
			nodes, keys int
			prefer      bool
		}{{4, 3, false}, {100, 10000, false}, {1000, 10000, false}, {1000, 10000, true}} {
			name := fmt.Sprintf("failback=%s/nodes=%d/keys=%d", fb, sz.nodes, sz.keys)
			if sz.prefer {
				name += "/preferred=half"
			}
			b.Run(name, func(b *testing.B) {
				e, nodes := scaleCluster(b, sz.nodes, sz.keys, fb, sz.prefer)
				now := t0
				moved := 0
				b.ResetTimer()
				for i := range b.N {
					victim := nodes[1+i%(len(nodes)-1)]
					now = now.Add(time.Second)
					e.SetSpeaker(victim, SpeakerGone, now)
					moved += len(votePath(e, victim, PathDown))
					e.SetSpeaker(victim, SpeakerAlive, now)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(3*b.N)/1e6, "ms/event")
				b.ReportMetric(float64(moved)/float64(b.N), "keys-moved/op")
			})
		}
	}
}

// BenchmarkFullRecompute is what the incremental paths avoid: deciding
// every key again (what the first-wave speaker did on every event).
func BenchmarkFullRecompute(b *testing.B) {
	e, _ := scaleCluster(b, 1000, 10000, FailbackImmediate, false)
	b.ResetTimer()
	for range b.N {
		e.decideAll()
	}
}
