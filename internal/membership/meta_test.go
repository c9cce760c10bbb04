package membership

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestMetaRoundTrip(t *testing.T) {
	a, b := KeyFingerprint([]byte("a")), KeyFingerprint([]byte("b"))
	for _, tc := range []struct {
		name string
		app  []byte
		keys []Fingerprint
	}{
		{"answers, two keys", []byte{1}, []Fingerprint{a, b}},
		{"no app, no keys", nil, nil},
		{"not answering, one key", []byte{0}, []Fingerprint{b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app, keys := decodeMeta(encodeMeta(tc.app, tc.keys, memberlist.MetaMaxSize))
			if !bytes.Equal(app, tc.app) || !slices.Equal(keys, tc.keys) {
				t.Fatalf("decodeMeta(encodeMeta(%v, %x)) = %v, %x", tc.app, tc.keys, app, keys)
			}
		})
	}
}

// A previous release's metadata (the application's byte alone) and garbage
// read as the application's metadata, with no keys: such a member is never
// taken to accept a key.
func TestMetaPreviousReleaseAndGarbage(t *testing.T) {
	for _, b := range [][]byte{{1}, {0}, nil, {5, 1}, {1, 1, 1, 0xff}, {1, 1, 17}} {
		app, keys := decodeMeta(b)
		if !bytes.Equal(app, b) || keys != nil {
			t.Errorf("decodeMeta(%v) = %v, %x; want %v and no keys", b, app, keys, b)
		}
	}
}

// The list of keys is cut to what fits, keeping the one in use (first).
func TestMetaKeysCut(t *testing.T) {
	var keys []Fingerprint
	for i := range 40 {
		keys = append(keys, KeyFingerprint([]byte{byte(i)}))
	}
	b := encodeMeta([]byte{1}, keys, memberlist.MetaMaxSize)
	_, got := decodeMeta(b)
	if len(got) != maxMetaKeys || got[0] != keys[0] {
		t.Fatalf("40 keys encoded as %d (first %x), want the first %d", len(got), got[0], maxMetaKeys)
	}
	b = encodeMeta([]byte{1}, keys, 2+1+8*3)
	if _, got := decodeMeta(b); len(got) != 3 || len(b) > 2+1+8*3 {
		t.Fatalf("in %d bytes: %d keys, %d bytes; want 3 keys within the limit", 2+1+8*3, len(got), len(b))
	}
}

// decodeMeta reads what any peer sends: it never panics, bounds what it
// returns, and what it parses re-encodes to the same bytes.
func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte{1})
	f.Add(encodeMeta([]byte{1}, []Fingerprint{KeyFingerprint([]byte("k"))}, memberlist.MetaMaxSize))
	f.Add([]byte{64, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		app, keys := decodeMeta(b)
		if len(keys) > maxMetaKeys {
			t.Fatalf("%d keys read, bound %d", len(keys), maxMetaKeys)
		}
		if keys != nil && !bytes.Equal(encodeMeta(app, keys, memberlist.MetaMaxSize), b) {
			t.Fatalf("%x parsed as %x, %x, which encodes differently", b, app, keys)
		}
	})
}

// MembersLackingKey names exactly the members that have not installed a
// key yet, as the others see them through gossip.
func TestMembersLackingKey(t *testing.T) {
	f := newFabric()
	o := testOptions("key-A")
	o.State = &recorder{} // metadata rides on the application delegate
	ms := startCluster(t, f, 3, o, testLogger(t))
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	waitMembers(t, ms, []string{"n1", "n2", "n3"}, 20*time.Second)
	waitLacking := func(want ...string) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			got := ms[0].list.MembersLackingKey([]byte("key-B"))
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("n1 sees %v lacking key B, want %v", got, want)
			}
		}
	}
	if got := ms[0].list.MembersLackingKey([]byte("key-A")); len(got) != 0 {
		t.Fatalf("n1 sees %v lacking the key every member started with", got)
	}
	waitLacking("n2", "n3")
	if err := ms[0].list.InstallKey([]byte("key-B")); err != nil {
		t.Fatal(err)
	}
	if err := ms[1].list.InstallKey([]byte("key-B")); err != nil {
		t.Fatal(err)
	}
	waitLacking("n3")
	if err := ms[2].list.InstallKey([]byte("key-B")); err != nil {
		t.Fatal(err)
	}
	waitLacking()

	// A speaker cut off (here: dead) cannot say which keys it has: while
	// its Pod is a peer, it counts as lacking any key. (bench-chaos seed
	// 327311111, episode 49: a node whose cable was pulled during a
	// rotation came back unable to read the others, which had switched
	// without it, and answered for an IP that had moved.)
	n3 := ms[2].addr
	ms[2].kill(f)
	waitLacking(n3 + " (not a member now)")
}
