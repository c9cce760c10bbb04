package speaker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// testNodeOptions are a node on loopback memberlist with no network
// interfaces (the announcer runs for real, with nothing to answer on).
func testNodeOptions(t *testing.T) nodeOptions {
	t.Helper()
	return nodeOptions{
		Name:       "w1",
		Layer2:     layer2.Options{Links: func() ([]layer2.Link, error) { return nil, nil }},
		Ownership:  ownership.Options{Hold: 30 * time.Second},
		Membership: membership.Options{BindAddr: "127.0.0.1", BindPort: freeUDPTCPPort(t, "127.0.0.1")},
		KeyFile:    testKeyFile(t),
		Recorder:   nopRecorder{},
	}
}

// TestNodeStopOrder: the announcer outlives the memberlist leave and the
// leave grace; Stop returns once it has stopped, and a second Stop is a no-op.
func TestNodeStopOrder(t *testing.T) {
	opts := testNodeOptions(t)
	opts.LeaveGrace = 300 * time.Millisecond
	n, err := newNode(logr.Discard(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if n.ml == nil || n.health == nil || n.own.broadcast == nil {
		t.Fatalf("with memberlist: ml %v, health %v, broadcast set %v", n.ml, n.health, n.own.broadcast != nil)
	}
	cancel()
	stopped := make(chan time.Time, 1)
	go func() {
		n.Stop()
		stopped <- time.Now()
	}()
	select {
	case <-n.ml.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the memberlist leave did not complete")
	}
	left := time.Now()
	time.Sleep(opts.LeaveGrace / 2)
	if len(n.annDone) != 0 {
		t.Fatal("the announcer stopped during the leave grace")
	}
	select {
	case at := <-stopped:
		if d := at.Sub(left); d < opts.LeaveGrace*9/10 {
			t.Errorf("Stop returned %v after the leave, want the leave grace %v first", d, opts.LeaveGrace)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return")
	}
	n.Stop()
}

// TestNodeWithoutMemberlist: no memberlist, gossip, prober nor health, and
// the ownership rule is MetalLB's (immediate failback, no hold).
func TestNodeWithoutMemberlist(t *testing.T) {
	opts := testNodeOptions(t)
	opts.DisableMemberlist = true
	opts.KeyFile = filepath.Join(t.TempDir(), "missing") // not read
	n, err := newNode(logr.Discard(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if o := n.opts.Ownership; o.Failback != ownership.FailbackImmediate || o.Hold != 0 {
		t.Errorf("ownership options %+v, want immediate failback and no hold", o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if n.ml != nil || n.gossip != nil || n.prober != nil || n.health != nil {
		t.Errorf("without memberlist: ml %v, gossip %v, prober %v, health %v", n.ml, n.gossip, n.prober, n.health)
	}
	n.Stop() // ctx still running: Stop ends it
}

// TestNodeKeyFile: an unreadable key file fails newNode, a readable one is
// memberlist's key; Stop without Start does nothing.
func TestNodeKeyFile(t *testing.T) {
	opts := testNodeOptions(t)
	opts.KeyFile = filepath.Join(t.TempDir(), "missing")
	if _, err := newNode(logr.Discard(), opts); err == nil {
		t.Error("newNode with a missing key file: no error")
	}
	opts.KeyFile = testKeyFile(t)
	n, err := newNode(logr.Discard(), opts)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(opts.KeyFile)
	if string(n.opts.Membership.SecretKey) != string(want) {
		t.Errorf("memberlist key %q, want the file's %q", n.opts.Membership.SecretKey, want)
	}
	n.Stop()
}
