package speaker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/membership"
)

// writeKeyFile replaces the key file as the kubelet does: a new file
// renamed over the old one.
func writeKeyFile(t *testing.T, path, key string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp")
	if err := os.WriteFile(tmp, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startKeyedList starts a memberlist on a free loopback port with key;
// withState makes it publish its keys (the speaker always does; without
// State a member says nothing, as a previous release).
func startKeyedList(ctx context.Context, t *testing.T, name, key string, withState bool) *membership.List {
	t.Helper()
	o := membership.DefaultOptions()
	o.NodeName, o.BindAddr, o.BindPort, o.SecretKey = name, "127.0.0.1", freeUDPTCPPort(t, "127.0.0.1"), []byte(key)
	o.RejoinInterval = 200 * time.Millisecond
	if withState {
		o.State = nopState{}
	}
	l, err := membership.Start(ctx, logr.Discard(), o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type nopState struct{}

func (nopState) LocalState(bool) []byte        { return nil }
func (nopState) MergeRemoteState([]byte, bool) {}
func (nopState) NotifyMsg([]byte)              {}

// waitPrimary waits until l sends with the key of want.
func waitPrimary(t *testing.T, name string, l *membership.List, want string) {
	t.Helper()
	wantKey := membership.SecretKeyFromSecret([]byte(want))
	for deadline := time.Now().Add(30 * time.Second); !bytes.Equal(l.PrimaryKey(), wantKey); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s sends with key %x, want the key of %q (%x)", name, l.PrimaryKey(), want, wantKey)
		}
	}
}

// A rotated key file (the kubelet swapping the mounted Secret) reaches the
// running memberlist in three phases: installed (accepted, not used), used,
// and the previous key retired; a missing or empty file keeps the current
// key. Here the only peer never says which keys it accepts (a previous
// release), so the switch waits for useAfter.
func TestKeyFileReload(t *testing.T) {
	dir := t.TempDir()
	path := keyFilePath(dir)
	if path != filepath.Join(dir, SecretKeyField) {
		t.Fatalf("keyFilePath(dir) = %s, want the secretkey file inside", path)
	}
	writeKeyFile(t, path, "first key")
	key, err := readKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := startKeyedList(ctx, t, "self", "first key", true)
	peer := startKeyedList(ctx, t, "silent-peer", "first key", false)
	if _, err := l.Join([]string{peer.LocalAddr()}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchKeyFileTimed(ctx, logr.Discard(), path, keyTimings{reload: 20 * time.Millisecond, agree: 20 * time.Millisecond, useAfter: 2 * time.Second, retireAfter: 2 * time.Second}, key, l)
	}()

	waitPrimary(t, "self", l, "first key")
	writeKeyFile(t, path, "second key")
	// First the new key is accepted while the old one still encrypts (the
	// peer, which does not say it has loaded the Secret, must still read
	// this speaker)...
	for deadline := time.Now().Add(30 * time.Second); l.NumKeys() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys accepted 30s after the key file changed, want 2 (old and new)", l.NumKeys())
		}
	}
	if want := membership.SecretKeyFromSecret([]byte("first key")); !bytes.Equal(l.PrimaryKey(), want) {
		t.Fatalf("the new key was used to send as soon as it was installed, though a member does not say it accepts it")
	}
	// ...then it is used...
	waitPrimary(t, "self", l, "second key")
	// ...and the first key is accepted for a while (peers that have not
	// switched yet), then retired: a leaked old key stops working.
	if n := l.NumKeys(); n != 2 {
		t.Errorf("right after the switch %d keys are accepted, want 2 (old and new)", n)
	}
	for deadline := time.Now().Add(30 * time.Second); l.NumKeys() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still accepted 30s after the rotation, want the old one retired", l.NumKeys())
		}
	}

	// Empty, then missing: the key in use stays; the next good file applies.
	writeKeyFile(t, path, "")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	writeKeyFile(t, path, "third key")
	waitPrimary(t, "self", l, "third key")

	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("watchKeyFile did not stop with its context")
	}
	<-l.Done()
}

// fakeKeyring records the watcher's calls; lacking is what
// MembersLackingKey answers.
type fakeKeyring struct {
	mu        sync.Mutex
	installed []string
	used      []string
	lacking   []string
}

func (k *fakeKeyring) InstallKey(s []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.installed = append(k.installed, string(s))
	return nil
}

func (k *fakeKeyring) UseKey(s []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.used = append(k.used, string(s))
	return nil
}

func (k *fakeKeyring) RetireOldKeys() (int, error) { return 0, nil }

func (k *fakeKeyring) MembersLackingKey([]byte) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.lacking)
}

func (k *fakeKeyring) calls() (installed, used []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.installed), slices.Clone(k.used)
}

// A new key is used as soon as every member says it accepts it, not before,
// and without waiting for useAfter (an hour here).
func TestKeyUsedOnceEveryMemberAcceptsIt(t *testing.T) {
	path := keyFilePath(t.TempDir())
	writeKeyFile(t, path, "old")
	kr := &fakeKeyring{lacking: []string{"n2"}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchKeyFileTimed(ctx, logr.Discard(), path, keyTimings{reload: 10 * time.Millisecond, agree: 10 * time.Millisecond, useAfter: time.Hour, retireAfter: time.Hour}, []byte("old"), kr)

	writeKeyFile(t, path, "new")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if in, _ := kr.calls(); slices.Equal(in, []string{"new"}) {
			break
		}
		if time.Now().After(deadline) {
			in, _ := kr.calls()
			t.Fatalf("installed %q 30s after the key file changed, want [new]", in)
		}
	}
	// Many agreement checks pass while n2 lacks the key: none may use it.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if _, used := kr.calls(); len(used) > 0 {
			t.Fatalf("used %q while member n2 did not accept it", used)
		}
	}
	kr.mu.Lock()
	kr.lacking = nil
	kr.mu.Unlock()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, used := kr.calls(); slices.Equal(used, []string{"new"}) {
			return
		}
		if time.Now().After(deadline) {
			_, used := kr.calls()
			t.Fatalf("used %q 30s after every member accepted the new key, want [new]", used)
		}
	}
}

// The bug bench-chaos found (docs/benchmarks-e2e.md, seed 327311111): a
// speaker restarted during a rotation knows only the newest key and sends
// with it; the others accept it but sent with the previous key for minutes,
// so it could not read them and acted on a view without them. Now the
// others see that every member accepts the new key (the restarted one
// says so) and switch to it within seconds: useAfter is an hour here, so
// only that agreement can make the restarted speaker see its peers.
func TestRestartedDuringRotationReadsPeers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	timings := keyTimings{reload: 20 * time.Millisecond, agree: 50 * time.Millisecond, useAfter: time.Hour, retireAfter: time.Hour}
	type node struct {
		name   string
		path   string
		list   *membership.List
		cancel context.CancelFunc
	}
	start := func(name, key string) *node {
		n := &node{name: name, path: filepath.Join(t.TempDir(), SecretKeyField)}
		writeKeyFile(t, n.path, key)
		var nctx context.Context
		nctx, n.cancel = context.WithCancel(ctx)
		n.list = startKeyedList(nctx, t, name, key, true)
		go watchKeyFileTimed(nctx, logr.Discard(), n.path, timings, []byte(key), n.list)
		return n
	}
	nodes := []*node{start("n1", "key-A"), start("n2", "key-A"), start("n3", "key-A")}
	addrs := func() []string {
		var out []string
		for _, n := range nodes {
			out = append(out, n.list.LocalAddr())
		}
		return out
	}
	for _, n := range nodes {
		n.list.SetPeers(addrs())
	}
	waitSeen := func(n *node, want int, what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); len(n.list.States()) != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				var seen []string
				for _, m := range n.list.States() {
					seen = append(seen, fmt.Sprintf("%s keys=%x", m.Name, m.Keys))
				}
				t.Fatalf("%s: %s sees %v, want %d members", what, n.name, seen, want)
			}
		}
	}
	for _, n := range nodes {
		waitSeen(n, 3, "before the rotation")
	}

	// The Secret is rotated on n1 and n2; n3's speaker restarts meanwhile
	// and reads only the new key from its file.
	for _, n := range nodes[:2] {
		writeKeyFile(t, n.path, "key-B")
	}
	for _, n := range nodes[:2] {
		for deadline := time.Now().Add(30 * time.Second); n.list.NumKeys() != 2; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s accepts %d keys 30s after the rotation, want 2", n.name, n.list.NumKeys())
			}
		}
	}
	nodes[2].cancel()
	<-nodes[2].list.Done()
	nodes[2] = start("n3", "key-B")
	// Its Pod is replaced: the peers learn its new address (here also a
	// new port) from the Pod list.
	for _, n := range nodes {
		n.list.SetPeers(addrs())
	}

	for _, n := range nodes[:2] {
		waitPrimary(t, n.name, n.list, "key-B")
	}
	waitSeen(nodes[2], 3, "after restarting during the rotation")
}
