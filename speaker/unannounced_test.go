package speaker

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/ironlb/ironlb/internal/election"
)

// A Service nobody announces gets one info line per change of reason, not
// one per reconcile; a normal reason (another node announces) logs nothing.
func TestNotAnnouncedLoggedOncePerReason(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	r := &serviceReconciler{log: log, opts: Options{NodeName: "w1"}, state: newState(), metrics: newMetrics(nil)}
	svc := lbService(testVIP)
	ips := []netip.Addr{netip.MustParseAddr(testVIP)}
	key := "ns1/web"
	steps := []struct {
		want    Want
		newLine string // reason expected in a new log line, "" for none
	}{
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoReadyEndpoints}, election.ReasonNoReadyEndpoints},
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoReadyEndpoints}, ""},
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoReadyEndpoints}, ""},
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoCandidates}, election.ReasonNoCandidates},
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoCandidates}, ""},
		{Want{IPs: ips, Pool: "p1", Winner: "w2", Reason: election.ReasonNotOwner}, ""},
		{Want{IPs: ips, Pool: "p1", Winner: "w2", Reason: election.ReasonNoMatchingAdvertisement}, ""}, // w2 announces
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoMatchingAdvertisement}, election.ReasonNoMatchingAdvertisement},
		{Want{IPs: ips, Reason: ReasonNoConfig}, ""},
		{Want{IPs: ips, Pool: "p1", Reason: election.ReasonNoCandidates}, election.ReasonNoCandidates},
	}
	for i, st := range steps {
		mu.Lock()
		before := len(lines)
		mu.Unlock()
		r.apply(context.Background(), log, key, svc, st.want)
		mu.Lock()
		got := lines[before:]
		mu.Unlock()
		switch {
		case st.newLine == "" && len(got) != 0:
			t.Errorf("step %d (%s): unexpected log %q", i, st.want.Reason, got)
		case st.newLine != "" && (len(got) != 1 || !strings.Contains(got[0], `"reason"="`+st.newLine+`"`) ||
			!strings.Contains(got[0], "serviceNotAnnounced")):
			t.Errorf("step %d: logs %q, want one serviceNotAnnounced line with reason %s", i, got, st.newLine)
		}
	}
	// A deleted Service forgets its reason.
	r.apply(context.Background(), log, key, nil, Want{Reason: ReasonServiceDeleted})
	if _, ok := r.state.unannounced[key]; ok {
		t.Error("reason kept after the Service was deleted")
	}
}
