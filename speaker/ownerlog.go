package speaker

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/ironlb/ironlb/internal/ownership"
)

// changeLogChunk bounds the IPs of one "owner changed" line: a takeover of
// thousands of IPs logs a few lines of a few kilobytes (each IP still greps
// to its line), instead of a line per IP that zap's sampling (100 identical
// messages a second, then one in 100) would mostly drop.
const changeLogChunk = 64

// changeGroup is one "owner changed" log line: IPs that moved between the
// same two nodes for the same reason in one decision.
type changeGroup struct {
	from, to string
	reason   ownership.Reason
	keys     []string
}

// groupChanges groups a decision's changes by (from, to, reason), in the
// order each group first appears, with at most changeLogChunk keys a group.
func groupChanges(changes []ownership.Change) []changeGroup {
	type id struct {
		from, to string
		reason   ownership.Reason
	}
	var out []changeGroup
	open := map[id]int{} // -> index in out of the group's last chunk
	for _, ch := range changes {
		g := id{ch.From, ch.To, ch.Reason}
		i, ok := open[g]
		if !ok || len(out[i].keys) == changeLogChunk {
			out = append(out, changeGroup{from: ch.From, to: ch.To, reason: ch.Reason})
			i = len(out) - 1
			open[g] = i
		}
		out[i].keys = append(out[i].keys, ch.Key)
	}
	for i := range out {
		slices.SortFunc(out[i].keys, compareKeys)
	}
	return out
}

// compareKeys orders keys (IPs) by address, so that a line's IPs read in
// order.
func compareKeys(a, b string) int {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	if errX != nil || errY != nil {
		return strings.Compare(a, b)
	}
	return x.Compare(y)
}
