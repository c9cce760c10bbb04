package membership

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestBroadcastReplacesByKey: a keyed broadcast replaces a queued one with
// the same key; unkeyed ones replace nothing and are never replaced.
func TestBroadcastReplacesByKey(t *testing.T) {
	l := &List{queue: &memberlist.TransmitLimitedQueue{NumNodes: func() int { return 4 }, RetransmitMult: 4}}
	l.Broadcast("172.18.255.200", []byte("old"))
	l.Broadcast("", []byte("batch 1"))
	l.Broadcast("172.18.255.200", []byte("new"))
	l.Broadcast("", []byte("batch 2"))
	l.Broadcast("172.18.255.201", []byte("other"))

	var got []string
	for _, m := range l.queue.GetBroadcasts(0, 1<<20) {
		got = append(got, string(m))
	}
	want := map[string]bool{"new": true, "batch 1": true, "batch 2": true, "other": true}
	if len(got) != len(want) {
		t.Fatalf("queued %q, want %d messages: %v", got, len(want), want)
	}
	for _, m := range got {
		if !want[m] {
			t.Errorf("queued %q, want only %v", m, want)
		}
	}
}

// recorder is a StateDelegate that keeps the messages it receives.
type recorder struct {
	mu   sync.Mutex
	msgs [][]byte
}

func (r *recorder) LocalState(bool) []byte        { return nil }
func (r *recorder) MergeRemoteState([]byte, bool) {}
func (r *recorder) NotifyMsg(msg []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) has(msg []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if bytes.Equal(m, msg) {
			return true
		}
	}
	return false
}

// TestMaxBroadcastIsDelivered: messages of MaxBroadcast bytes go through the
// real encrypted transport, so a speaker may pack claims up to that size.
func TestMaxBroadcastIsDelivered(t *testing.T) {
	f := newFabric()
	var recs []*recorder
	var ms []*member
	for i := 1; i <= 2; i++ {
		o := testOptions("secret-A")
		r := &recorder{}
		o.State = r
		recs = append(recs, r)
		ms = append(ms, startMemberAt(t, f, fmt.Sprintf("n%d", i), loopbackIP(i), o, testLogger(t)))
	}
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	for _, m := range ms {
		m.list.SetPeers(addrsOf(ms))
	}
	waitMembers(t, ms, []string{"n1", "n2"}, 20*time.Second)

	var sent [][]byte
	for i := range 20 {
		msg := bytes.Repeat([]byte{byte('a' + i)}, MaxBroadcast)
		sent = append(sent, msg)
		ms[0].list.Broadcast("", msg)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		missing := 0
		for _, m := range sent {
			if !recs[1].has(m) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d broadcasts of %d bytes not received after 20 s (queued at the sender: %d)",
				missing, len(sent), MaxBroadcast, ms[0].list.queue.NumQueued())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
