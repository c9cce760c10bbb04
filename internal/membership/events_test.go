package membership

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// Membership events are what the tests and benchmarks of this package time
// failure detection with. The speaker does not read them (it asks Members
// and States when it needs to), so they exist only here: a test sets
// Options.events to newEventRecorder() and reads List.Events.

// EventType says what happened to a member.
type EventType int

const (
	// EventJoin: a member became alive (joined or came back).
	EventJoin EventType = iota
	// EventLeave: a member left gracefully or was declared dead.
	EventLeave
	// EventUpdate: a member's metadata or address changed.
	EventUpdate
)

func (t EventType) String() string {
	switch t {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventUpdate:
		return "update"
	}
	return "unknown"
}

// Event is one membership change.
type Event struct {
	Type EventType
	// Node is the member's name.
	Node string
	// Addr is the member's ip:port.
	Addr string
	// Time the event was raised (for latency measurements).
	Time time.Time
}

// eventBuffer is deep enough for a whole test cluster restarting at once.
const eventBuffer = 1024

// eventRecorder queues memberlist's callbacks without ever blocking them
// (they run inside memberlist's state machine); a test that falls behind by
// more than the buffer loses events, and fails on what it then misses.
type eventRecorder struct{ ch chan Event }

func newEventRecorder() *eventRecorder { return &eventRecorder{ch: make(chan Event, eventBuffer)} }

func (r *eventRecorder) send(t EventType, n *memberlist.Node) {
	select {
	case r.ch <- Event{Type: t, Node: n.Name, Addr: n.Address(), Time: time.Now()}:
	default:
	}
}

func (r *eventRecorder) NotifyJoin(n *memberlist.Node)   { r.send(EventJoin, n) }
func (r *eventRecorder) NotifyLeave(n *memberlist.Node)  { r.send(EventLeave, n) }
func (r *eventRecorder) NotifyUpdate(n *memberlist.Node) { r.send(EventUpdate, n) }

// Events delivers the membership changes of a List started with
// Options.events = newEventRecorder(); nil otherwise.
func (l *List) Events() <-chan Event {
	if r, ok := l.opts.events.(*eventRecorder); ok {
		return r.ch
	}
	return nil
}
