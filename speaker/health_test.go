package speaker

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/ownership"
)

// fakeProber answers from a table: an address maps to a result, or blocks until the
// probe's context ends (a dead host whose probes time out).
type fakeProber map[netip.Addr]*layer2.ProbeResult

func (f fakeProber) Probe(ctx context.Context, a netip.Addr) layer2.ProbeResult {
	if r := f[a]; r != nil {
		r.Addr = a
		return *r
	}
	<-ctx.Done()
	return layer2.ProbeResult{Addr: a, Reason: layer2.ProbeCanceled}
}

// TestProbeOnceAsksEveryFamilyAtOnce: a dual-stack node is probed on all its addresses
// at once, so an answer on the second address is not held up by the first one's
// timeout, and the verdict's reason does not depend on which probe finished first.
func TestProbeOnceAsksEveryFamilyAtOnce(t *testing.T) {
	v4, v6 := netip.MustParseAddr("172.18.0.3"), netip.MustParseAddr("fc00:f853:ccd:e793::3")
	mac := net.HardwareAddr{2, 0x42, 0xac, 0x12, 0, 3}
	h := &health{log: logr.Discard(), prober: fakeProber{v6: {Reachable: true, Interface: "eth0", MAC: mac}}}
	// The IPv4 probe never ends by itself: a sequential prober would wait here until
	// the deadline and report the node unreachable.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, iface, gotMAC, reason, _ := h.probeOnce(ctx, []netip.Addr{v4, v6}, false)
	if p != ownership.PathUp || iface != "eth0" || gotMAC.String() != mac.String() || !strings.Contains(reason, v6.String()) {
		t.Fatalf("probeOnce = %v %q %v %q, want up on eth0 with %v, answered on %v", p, iface, gotMAC, reason, mac, v6)
	}
	if ctx.Err() != nil {
		t.Fatal("probeOnce waited for the unanswered IPv4 probe")
	}

	h.prober = fakeProber{
		v4: {Reason: layer2.ProbeNoAnswer},
		v6: {Reason: layer2.ProbeNoInterface},
	}
	for range 20 {
		var onLink bool
		p, _, _, reason, onLink = h.probeOnce(ctx, []netip.Addr{v4, v6}, false)
		if p != ownership.PathDown || !onLink || reason != layer2.ProbeNoAnswer.String()+" on "+v4.String() {
			t.Fatalf("probeOnce = %v %q, want down, %s on %s", p, reason, layer2.ProbeNoAnswer, v4)
		}
	}
	h.prober = fakeProber{v4: {Reason: layer2.ProbeNoInterface}, v6: {Reason: layer2.ProbeNoInterface}}
	if p, _, _, reason, onLink := h.probeOnce(ctx, []netip.Addr{v4, v6}, false); p != ownership.PathUnknown || onLink || reason != noInterface {
		t.Errorf("no on-link target: %v %q, want unknown, %q", p, reason, noInterface)
	}
	if p, _, _, _, _ = h.probeOnce(ctx, []netip.Addr{v4, v6}, true); p != ownership.PathDown {
		t.Errorf("no on-link target, memberlist says gone: %v, want down", p)
	}
}

// TestSilenceVerdict: unanswered rounds mean a down data path after
// missedRounds, or at once when memberlist has declared the node gone, unless
// this speaker was already degraded when the node last answered (a score that
// rose only since, from its own probes of the silent node, does not count) or
// the round was late because this speaker was starved.
func TestSilenceVerdict(t *testing.T) {
	const round = 150 * time.Millisecond
	for _, tc := range []struct {
		name          string
		before        int // unanswered rounds counted before this one
		gone          bool
		scoreAnswered int
		took          time.Duration
		want          silence
		wantMisses    int
	}{
		{"first round", 0, false, 0, round, silenceWait, 1},
		{"enough rounds", missedRounds - 1, false, 0, round, silenceDown, missedRounds},
		{"more rounds", missedRounds + 2, false, 0, round, silenceDown, missedRounds + 3},
		{"degraded before the silence", missedRounds - 1, false, 1, round, silenceDistrusted, missedRounds},
		{"late round", missedRounds - 1, false, 0, lateRound, silenceWait, missedRounds - 1},
		// memberlist's verdict never replaces the rounds: it is wrong
		// exactly when the speakers are starved.
		{"gone in memberlist, first round", 0, true, 0, round, silenceWait, 1},
		{"gone in memberlist, late", missedRounds - 1, true, 0, time.Second, silenceWait, missedRounds - 1},
		{"gone in memberlist, enough rounds", missedRounds - 1, true, 0, round, silenceDown, missedRounds},
		// ... but it lifts a degraded watcher's distrust of its own silence.
		{"gone in memberlist, degraded, late", missedRounds - 1, true, 2, time.Second, silenceWait, missedRounds - 1},
		{"gone in memberlist, degraded, enough rounds", missedRounds - 1, true, 2, round, silenceDown, missedRounds},
		{"degraded, gone only after the rounds", missedRounds + 3, true, 2, round, silenceDown, missedRounds + 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, misses, why := silenceVerdict(tc.before, tc.gone, tc.scoreAnswered, tc.took)
			if got != tc.want || misses != tc.wantMisses {
				t.Errorf("silenceVerdict(%d, %v, %d, %v) = %d, %d misses (%q), want %d, %d misses",
					tc.before, tc.gone, tc.scoreAnswered, tc.took, got, misses, why, tc.want, tc.wantMisses)
			}
		})
	}
}
