package membership

import (
	"slices"
	"time"
)

// SetMeta sets what this member says of itself to the others (memberlist's
// node metadata, at most memberlist.MetaMaxSize bytes, carried by the
// application delegate: only with Options.State) and spreads it: they see it
// in MemberState.Meta within a gossip round or two.
func (l *List) SetMeta(meta []byte) {
	m := slices.Clone(meta)
	l.meta.Store(&m)
	if l.ml == nil {
		return
	}
	go func() {
		if err := l.ml.UpdateNode(5 * time.Second); err != nil {
			l.log.V(1).Info("spreading this member's metadata", "error", err.Error())
		}
	}()
}
