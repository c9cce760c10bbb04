package membership

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testOptions are fast timings so the tests finish quickly; they are not the
// defaults under test (BenchmarkFailover measures those).
func testOptions(key string) Options {
	o := DefaultOptions()
	o.SecretKey = []byte(key)
	o.RejoinInterval = 200 * time.Millisecond
	return o
}

func TestThreeMembersConverge(t *testing.T) {
	f := newFabric()
	ms := startCluster(t, f, 3, testOptions("secret-A"), testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 20*time.Second)

	// Each member reported a join for each peer.
	for _, m := range ms {
		seen := map[string]bool{}
		for _, e := range drain(m) {
			if e.Type == EventJoin {
				seen[e.Node] = true
			}
		}
		for _, other := range []string{"n1", "n2", "n3"} {
			if !seen[other] {
				t.Errorf("%s: no join event for %s", m.name, other)
			}
		}
	}
}

func TestDifferentKeysNeverMeet(t *testing.T) {
	f := newFabric()
	a := startCluster(t, f, 2, testOptions("secret-A"), testLogger(t))
	stranger := startMember(t, f, "stranger", testOptions("secret-B"), testLogger(t))
	defer func() {
		for _, m := range append(a, stranger) {
			m.stop()
		}
	}()
	waitMembers(t, a, []string{"n1", "n2"}, 20*time.Second)

	if n, err := stranger.list.Join([]string{a[0].addr}); err == nil {
		t.Fatalf("join with the wrong key succeeded (%d reached)", n)
	}
	if n, err := a[0].list.Join([]string{stranger.addr}); err == nil {
		t.Fatalf("join of a wrong-key peer succeeded (%d reached)", n)
	}
	// Also let the rejoin loops of both sides try a few times. This asserts an
	// absence, so it can only wait a bounded time: 5 rejoin rounds.
	for _, m := range a {
		m.list.SetPeers([]string{a[0].addr, a[1].addr, stranger.addr})
	}
	stranger.list.SetPeers([]string{a[0].addr, a[1].addr, stranger.addr})
	time.Sleep(5 * stranger.list.opts.RejoinInterval)
	for _, m := range a {
		if got := m.list.Members(); !slices.Equal(got, []string{"n1", "n2"}) {
			t.Errorf("%s sees %v; the wrong-key stranger must not be a member", m.name, got)
		}
	}
	if got := stranger.list.Members(); !slices.Equal(got, []string{"stranger"}) {
		t.Errorf("stranger sees %v, want only itself", got)
	}
}

// A graceful leave is seen at once, not after failure detection: with a
// suspicion timeout of minutes, only the Leave broadcast can explain the event.
func TestLeaveSeenImmediately(t *testing.T) {
	o := testOptions("secret-A")
	o.ProbeInterval = time.Second
	o.ProbeTimeout = 500 * time.Millisecond
	o.SuspicionMult = 200 // dead by timeout only after >= 200 s
	f := newFabric()
	ms := startCluster(t, f, 3, o, testLogger(t))
	defer func() {
		for _, m := range ms[:2] {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 20*time.Second)
	for _, m := range ms {
		drain(m)
	}
	// Forget the leaver's address so the rejoin loop does not pull it back
	// before it shuts down.
	for _, m := range ms[:2] {
		m.list.SetPeers([]string{ms[0].addr, ms[1].addr})
	}
	ms[2].stop()
	waitLeave(t, ms[:2], "n3", 30*time.Second)
	waitMembers(t, ms[:2], []string{"n1", "n2"}, 5*time.Second)
}

// A hard kill (no Leave, packets blackholed) is detected by failure detection
// with the default timings.
func TestKillSeen(t *testing.T) {
	f := newFabric()
	ms := startCluster(t, f, 3, testOptions("secret-A"), testLogger(t))
	defer func() {
		for _, m := range ms[:2] {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 20*time.Second)
	for _, m := range ms {
		drain(m)
	}
	ms[2].kill(f)
	waitLeave(t, ms[:2], "n3", 60*time.Second)
	waitMembers(t, ms[:2], []string{"n1", "n2"}, 10*time.Second)
}

// After a partition heals, the rejoin loop makes the cluster whole again even
// though memberlist itself never contacts dead members.
func TestRejoinAfterPartition(t *testing.T) {
	f := newFabric()
	ms := startCluster(t, f, 3, testOptions("secret-A"), testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 20*time.Second)
	f.kill(ms[2].addr) // isolate n3, its process keeps running
	waitMembers(t, ms[:2], []string{"n1", "n2"}, 60*time.Second)
	waitMembers(t, ms[2:], []string{"n3"}, 60*time.Second)
	f.revive(ms[2].addr)
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 60*time.Second)
}

// A member cut off long enough to declare every peer dead (a pulled cable)
// reaches them again with Sync at once, through its known peers, not at the
// next rejoin (an hour here).
func TestSyncAfterIsolationUsesPeers(t *testing.T) {
	f := newFabric()
	o := testOptions("secret-A")
	o.RejoinInterval = time.Hour
	ms := startCluster(t, f, 3, o, testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 20*time.Second)
	f.kill(ms[2].addr)
	waitMembers(t, ms[:2], []string{"n1", "n2"}, 60*time.Second)
	waitMembers(t, ms[2:], []string{"n3"}, 60*time.Second)
	f.revive(ms[2].addr)
	if n := ms[2].list.Sync(3); n == 0 {
		t.Fatal("Sync reached no peer after the isolation: it only tried live members, and there were none")
	}
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 10*time.Second)
}

// The default path, without an injected transport: a real bind on a port.
func TestStartRealTransport(t *testing.T) {
	port := freePort(t)
	o := DefaultOptions()
	o.NodeName = "solo"
	o.BindAddr = "127.0.0.1"
	o.BindPort = port
	o.SecretKey = []byte("k")
	ctx, cancel := context.WithCancel(context.Background())
	l, err := Start(ctx, testLogger(t), o)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Members(); !slices.Equal(got, []string{"solo"}) {
		t.Errorf("members = %v", got)
	}
	if !strings.HasSuffix(l.LocalAddr(), ":"+strconv.Itoa(port)) {
		t.Errorf("local addr %s, want port %d", l.LocalAddr(), port)
	}
	cancel()
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("leave/shutdown did not finish")
	}
}

func TestValidate(t *testing.T) {
	o := DefaultOptions()
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "node name") {
		t.Errorf("empty node name: %v", err)
	}
	o.NodeName = "n"
	o.ProbeTimeout = o.ProbeInterval
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "probe timeout") {
		t.Errorf("probe timeout = interval: %v", err)
	}
}

func TestSecretKeyFromSecret(t *testing.T) {
	if SecretKeyFromSecret(nil) != nil {
		t.Error("empty secret must give no key")
	}
	k := SecretKeyFromSecret([]byte("anything at all, of any length"))
	if len(k) != 32 {
		t.Errorf("key length %d, want 32 (AES-256)", len(k))
	}
}

func TestNormalise(t *testing.T) {
	l := &List{opts: Options{BindPort: 7946}}
	got := l.normalise([]string{"10.0.0.2", " 10.0.0.1:7000 ", "", "10.0.0.2", "fd00::1"})
	want := []string{"10.0.0.1:7000", "10.0.0.2:7946", "[fd00::1]:7946"}
	if !slices.Equal(got, want) {
		t.Errorf("normalise = %v, want %v", got, want)
	}
}

// waitLeave waits until every member in ms has an EventLeave for node.
func waitLeave(t *testing.T, ms []*member, node string, deadline time.Duration) {
	t.Helper()
	end := time.After(deadline)
	for _, m := range ms {
		for {
			select {
			case e := <-m.list.Events():
				if e.Type == EventLeave && e.Node == node {
					goto next
				}
			case <-end:
				t.Fatalf("%s saw no leave of %s within %s; members %v", m.name, node, deadline, m.list.Members())
			}
		}
	next:
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	// memberlist binds TCP and UDP on the same port; find one free for both.
	for i := 0; i < 20; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", ln.Addr().String())
		_ = ln.Close() // only probed for a free port
		if err == nil {
			_ = u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// Rotating the key keeps the old one for decryption: a cluster that switched
// to key B accepts a newcomer that only knows B, and members still agree.
func TestKeyRotation(t *testing.T) {
	f := newFabric()
	ms := startCluster(t, f, 2, testOptions("key-A"), testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2"}, 20*time.Second)
	for _, m := range ms {
		if err := m.list.UseKey([]byte("key-B")); err != nil {
			t.Fatal(err)
		}
	}
	newcomer := startMember(t, f, "n3", testOptions("key-B"), testLogger(t))
	defer newcomer.stop()
	if _, err := newcomer.list.Join([]string{ms[0].addr}); err != nil {
		t.Fatalf("newcomer with the rotated key cannot join: %v", err)
	}
	waitMembers(t, append(ms, newcomer), []string{"n1", "n2", "n3"}, 20*time.Second)

	plain := &List{}
	if err := plain.UseKey([]byte("x")); err == nil {
		t.Error("UseKey on an unencrypted list must fail")
	}
}

// After a rotation the cluster still decrypts what is encrypted with the old key
// (members that have not switched yet), so whoever holds the old key can still
// talk to it; RetireOldKeys ends that. A member knowing only key A cannot read the
// cluster's answers (they use B) but, before the retirement, the cluster accepts its
// join and lists it; after the retirement it never does.
func TestKeyRetirement(t *testing.T) {
	f := newFabric()
	ms := startCluster(t, f, 2, testOptions("key-A"), testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2"}, 20*time.Second)
	for _, m := range ms {
		if err := m.list.UseKey([]byte("key-B")); err != nil {
			t.Fatal(err)
		}
	}
	stale := startMember(t, f, "n3", testOptions("key-A"), testLogger(t))
	_, _ = stale.list.Join([]string{ms[0].addr}) // fails on its side: it cannot decrypt the answer
	if !sawJoin(ms[0], "n3", 10*time.Second) {
		t.Fatal("before retirement the cluster did not accept a join encrypted with the old key; the test cannot show the retirement")
	}
	stale.stop()

	for _, m := range ms {
		n, err := m.list.RetireOldKeys()
		if err != nil || n != 1 {
			t.Fatalf("%s: RetireOldKeys = %d, %v; want 1 key removed", m.name, n, err)
		}
		if n, _ := m.list.RetireOldKeys(); n != 0 {
			t.Errorf("%s: second RetireOldKeys removed %d keys", m.name, n)
		}
	}
	leaked := startMember(t, f, "n4", testOptions("key-A"), testLogger(t))
	defer leaked.stop()
	if _, err := leaked.list.Join([]string{ms[0].addr}); err == nil {
		t.Error("a member with the retired key joined")
	}
	// The join either reached the cluster and failed to decrypt there, or it
	// did not: either way no join of n4 may show up.
	if sawJoin(ms[0], "n4", 2*time.Second) {
		t.Error("the cluster accepted a join encrypted with the retired key")
	}

	if _, err := (&List{}).RetireOldKeys(); err == nil {
		t.Error("RetireOldKeys on an unencrypted list must fail")
	}
}

// sawJoin reports whether m sees a join of name within d (other events are dropped).
func sawJoin(m *member, name string, d time.Duration) bool {
	end := time.After(d)
	for {
		select {
		case e := <-m.list.Events():
			if e.Type == EventJoin && e.Node == name {
				return true
			}
		case <-end:
			return false
		}
	}
}

// A two-phase rotation never splits the members: each installs the new key
// (accepting it) before any sends with it, and each sends with it before any
// retires the old one, in whatever order the members take each phase. A
// member sending with a key the others have not installed is cut off: the
// control at the end shows the test would see a split.
func TestTwoPhaseRotationKeepsMembers(t *testing.T) {
	f := newFabric()
	ms := startCluster(t, f, 3, testOptions("key-A"), testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	all := []string{"n1", "n2", "n3"}
	waitMembers(t, ms, all, 20*time.Second)
	// stays: every member keeps seeing every other, through a window long
	// past the failure detector's suspicion (a split shows within it).
	stays := func(phase string) {
		t.Helper()
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			for _, m := range ms {
				if got := len(m.list.States()); got != len(ms) {
					t.Fatalf("%s: %s sees %d members, want %d", phase, m.name, got, len(ms))
				}
			}
		}
	}
	for _, m := range ms {
		if err := m.list.InstallKey([]byte("key-B")); err != nil {
			t.Fatal(err)
		}
		stays(m.name + " installed key B")
	}
	for _, m := range ms {
		if err := m.list.UseKey([]byte("key-B")); err != nil {
			t.Fatal(err)
		}
		stays(m.name + " sends with key B")
	}
	for _, m := range ms {
		if _, err := m.list.RetireOldKeys(); err != nil {
			t.Fatal(err)
		}
		stays(m.name + " retired key A")
	}
	// Control: one member sends with a key nobody else has installed.
	if err := ms[0].list.UseKey([]byte("key-C")); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); len(ms[1].list.States()) == len(ms); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("a member sending with a key the others lack was never seen failed: this test cannot see a split")
		}
	}
}

// What a member says of itself (SetMeta) reaches the others, and a change
// of it too.
func TestMetaSpreads(t *testing.T) {
	f := newFabric()
	o := testOptions("key-A")
	o.State = &recorder{} // metadata rides on the application delegate
	ms := startCluster(t, f, 2, o, testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2"}, 20*time.Second)
	metaOf := func(m *member, name string) string {
		for _, st := range m.list.States() {
			if st.Name == name {
				return string(st.Meta)
			}
		}
		return "<absent>"
	}
	for _, want := range []string{"x", "yz"} {
		ms[0].list.SetMeta([]byte(want))
		for end := time.Now().Add(20 * time.Second); metaOf(ms[1], "n1") != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("n2 sees n1's meta %q, want %q", metaOf(ms[1], "n1"), want)
			}
		}
	}
}
