package speaker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// gossipPair is two speakers' gossip over memberlist's real encrypted
// transport on loopback: w1 sends, w2's ownership layer receives.
type gossipPair struct {
	sender *membership.List
	recv   *owners
	// received counts the messages w2's memberlist handed over: each took
	// a slot in its handler queue.
	received *atomic.Int64
}

// countingDelegate counts the messages handed to NotifyMsg.
type countingDelegate struct {
	membership.StateDelegate
	n *atomic.Int64
}

func (c countingDelegate) NotifyMsg(msg []byte) {
	c.n.Add(1)
	c.StateDelegate.NotifyMsg(msg)
}

func newGossipPair(tb testing.TB) gossipPair {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	recv, _ := testOwners(tb, "w2", logr.Discard(), "w1", "w2", "w3")
	g := newGossip(logr.Discard(), recv, newMetrics(nil))
	go g.run(ctx)

	start := func(name string, state membership.StateDelegate) *membership.List {
		o := membership.DefaultOptions()
		o.NodeName, o.BindAddr, o.BindPort, o.SecretKey = name, "127.0.0.1", freeUDPTCPPort(tb, "127.0.0.1"), []byte("gossip test")
		o.State = state
		l, err := membership.Start(ctx, logr.Discard(), o)
		if err != nil {
			tb.Fatal(err)
		}
		return l
	}
	// The sender's own state holds none of the claims it broadcasts, so no
	// push/pull can carry them instead of the broadcasts.
	sender := start("w1", newGossip(logr.Discard(), newOwners(logr.Discard(), "w1", ownership.Options{}, newFakeAnnouncer(), newMetrics(nil), nopRecorder{}), newMetrics(nil)))
	received := &atomic.Int64{}
	receiver := start("w2", countingDelegate{StateDelegate: g, n: received})
	peers := []string{sender.LocalAddr(), receiver.LocalAddr()}
	sender.SetPeers(peers)
	receiver.SetPeers(peers)
	eventually(tb, "w1 and w2 joined", 20*time.Second, func() string {
		if n := len(sender.States()); n != 2 {
			return fmt.Sprintf("w1 sees %d members", n)
		}
		return ""
	})
	return gossipPair{sender: sender, recv: recv, received: received}
}

// takeoverClaims are n claims for w1 at epoch.
func takeoverClaims(n int, epoch uint64) []ownership.Claim {
	var claims []ownership.Claim
	for i := range n {
		claims = append(claims, ownership.Claim{Key: fmt.Sprintf("172.18.%d.%d", 192+i/256, i%256), Owner: "w1", Epoch: epoch})
	}
	return claims
}

// missing returns how many of claims w2 has not merged.
func (p gossipPair) missing(claims []ownership.Claim) int {
	p.recv.mu.Lock()
	defer p.recv.mu.Unlock()
	n := 0
	for _, c := range claims {
		if got, ok := p.recv.eng.Claim(c.Key); !ok || got != c {
			n++
		}
	}
	return n
}

// TestTakeoverClaimsReachPeers: a takeover's claims, packed by the
// broadcaster, reach a peer and are merged there, every one of them.
func TestTakeoverClaimsReachPeers(t *testing.T) {
	p := newGossipPair(t)
	claims := takeoverClaims(1250, 9) // a node's share of 5,000 Services on four nodes
	broadcaster(p.sender)(claims)
	eventually(t, "every claim merged at w2", 30*time.Second, func() string {
		if n := p.missing(claims); n > 0 {
			return fmt.Sprintf("%d of %d claims not merged", n, len(claims))
		}
		return ""
	})
}

// BenchmarkTakeoverGossip: one takeover's 1,250 claims from one speaker to
// another over loopback, packed (the broadcaster) or one message per claim
// (before 2026-11-24): time until the peer has merged them all, and the CPU
// both memberlists and ownership layers used for it (the process's rusage),
// and how many messages the peer's memberlist handed over (msgs/op: each one
// a slot in its handler queue of 1,024, retransmissions included).
func BenchmarkTakeoverGossip(b *testing.B) {
	for _, bc := range []struct {
		name string
		send func(*membership.List, []ownership.Claim)
	}{
		{"packed", func(l *membership.List, cs []ownership.Claim) { broadcaster(l)(cs) }},
		{"one-per-claim", func(l *membership.List, cs []ownership.Claim) {
			for _, c := range cs {
				l.Broadcast(c.Key, ownership.AppendClaims(nil, c))
			}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := newGossipPair(b)
			var cpu time.Duration
			msgs := p.received.Load()
			b.ResetTimer()
			for i := range b.N {
				claims := takeoverClaims(1250, uint64(10+i))
				before := cpuTime()
				bc.send(p.sender, claims)
				for p.missing(claims) > 0 {
					time.Sleep(time.Millisecond)
				}
				cpu += cpuTime() - before
			}
			b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(p.received.Load()-msgs)/float64(b.N), "msgs/op")
		})
	}
}
