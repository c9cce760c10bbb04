package ownership

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestClaimsRoundTrip(t *testing.T) {
	in := []Claim{
		{Key: "172.18.255.200", Owner: "myk8s-worker", Epoch: 1},
		{Key: "fc00:f853:ccd:e793::c8", Owner: "myk8s-worker3", Epoch: 1 << 40},
	}
	got, err := DecodeClaims(AppendClaims(nil, in...))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, in) {
		t.Fatalf("round trip: got %v, want %v", got, in)
	}
}

func TestPackClaims(t *testing.T) {
	claim := func(i int) Claim {
		return Claim{Key: fmt.Sprintf("172.18.%d.%d", 192+i/256, i%256), Owner: "myk8s-worker2", Epoch: uint64(i + 1)}
	}
	long := Claim{Key: "fc00:f853:ccd:e793::c8", Owner: strings.Repeat("n", maxNameLen), Epoch: 7}
	for _, tc := range []struct {
		name     string
		claims   []Claim
		maxBytes int
		messages int
	}{
		{name: "none", maxBytes: 600},
		{name: "one", claims: []Claim{claim(0)}, maxBytes: 600, messages: 1},
		{name: "a takeover", claims: claimsOf(1250, claim), maxBytes: 600, messages: 66}, // 28-31 bytes a claim
		{name: "one per message when only one fits", claims: claimsOf(3, claim), maxBytes: 40, messages: 3},
		{name: "a claim larger than the limit goes alone", claims: []Claim{claim(0), long, claim(1)}, maxBytes: 100, messages: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := PackClaims(tc.claims, tc.maxBytes)
			if len(msgs) != tc.messages {
				t.Errorf("%d messages, want %d", len(msgs), tc.messages)
			}
			var got []Claim
			for i, m := range msgs {
				if len(m) > tc.maxBytes && !slices.Contains(tc.claims, long) {
					t.Errorf("message %d: %d bytes, over the limit of %d", i, len(m), tc.maxBytes)
				}
				cs, err := DecodeClaims(m)
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				got = append(got, cs...)
				// As few as fit: the next message's first claim would not
				// have fitted in this one.
				if i+1 < len(msgs) {
					next, _ := DecodeClaims(msgs[i+1])
					if len(m)+len(AppendClaim(nil, next[0])) <= tc.maxBytes {
						t.Errorf("message %d (%d bytes) had room for the next claim", i, len(m))
					}
				}
			}
			if !slices.Equal(got, tc.claims) {
				t.Errorf("decoded %v, want %v", got, tc.claims)
			}
		})
	}
}

func claimsOf(n int, claim func(int) Claim) []Claim {
	out := make([]Claim, n)
	for i := range out {
		out[i] = claim(i)
	}
	return out
}

func TestDecodeClaimsErrors(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":         nil,
		"version":       {2, 1, 1, 'k', 1, 'o'},
		"truncated":     {1, 1, 5, 'k'},
		"empty owner":   {1, 1, 1, 'k', 0},
		"length beyond": {1, 1, 0xff, 0x01, 'k'},
	} {
		if _, err := DecodeClaims(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: error %v, want ErrBadMessage", name, err)
		}
	}
}

func TestNewerIsATotalOrder(t *testing.T) {
	owners := []string{"a", "b", "c", "myk8s-worker2"}
	for _, x := range owners {
		for _, y := range owners {
			a, b := Claim{Key: "k", Owner: x, Epoch: 3}, Claim{Key: "k", Owner: y, Epoch: 3}
			if x == y {
				if Newer(a, b) {
					t.Errorf("%v newer than itself", a)
				}
				continue
			}
			if Newer(a, b) == Newer(b, a) {
				t.Errorf("%v and %v are not ordered", a, b)
			}
		}
	}
	if !Newer(Claim{Key: "k", Owner: "z", Epoch: 4}, Claim{Key: "k", Owner: "a", Epoch: 3}) {
		t.Error("a higher epoch must win")
	}
}

// FuzzDecodeClaims: any input either fails with ErrBadMessage or decodes to
// claims that encode back to the same bytes.
func FuzzDecodeClaims(f *testing.F) {
	f.Add(AppendClaims(nil, Claim{Key: "10.0.0.1", Owner: "n1", Epoch: 7}))
	f.Add(AppendClaims(nil, Claim{Key: "::1", Owner: "node", Epoch: 0}, Claim{Key: "10.0.0.2", Owner: "n2", Epoch: 300}))
	f.Add([]byte{1})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		claims, err := DecodeClaims(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		again, err := DecodeClaims(AppendClaims(nil, claims...))
		if err != nil || !slices.Equal(again, claims) {
			t.Fatalf("re-encoding %v: %v, %v", claims, again, err)
		}
	})
}

// FuzzDecodeVotes: any input either fails with ErrBadMessage or decodes to
// votes that encode back to the same bytes.
func FuzzDecodeVotes(f *testing.F) {
	f.Add(PackVotes([]Vote{{Node: "myk8s-worker2", Watcher: "myk8s-worker3", Path: PathDown, Seq: 1764000000000000000}}, 600)[0])
	f.Add(PackVotes([]Vote{{Node: "n", Watcher: "w", Path: PathUp}, {Node: "m", Watcher: "w", Path: PathUnknown, Seq: 3}}, 600)[0])
	f.Add([]byte{3, 0, 9, 1, 'x', 1, 'y'})
	f.Add([]byte{2, 2, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		votes, err := DecodeVotes(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		if len(votes) == 0 {
			return
		}
		packed := PackVotes(votes, 1<<20)
		if len(packed) != 1 || string(packed[0]) != string(b) || !IsVotes(packed[0]) {
			t.Fatalf("re-encoding %+v: %q, want %q", votes, packed, b)
		}
	})
}

// FuzzDecodeState: any input either fails with ErrBadMessage or decodes to
// claims and votes that survive a round trip.
func FuzzDecodeState(f *testing.F) {
	f.Add(AppendState(nil, []Claim{{Key: "10.0.0.1", Owner: "a", Epoch: 4}}, []Vote{{Node: "a", Watcher: "b", Path: PathUp, Seq: 7}}))
	f.Add(AppendState(nil, nil, nil))
	f.Add(AppendClaims(nil, Claim{Key: "k", Owner: "o", Epoch: 1}))
	f.Add([]byte{4, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		claims, votes, err := DecodeState(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		c2, v2, err := DecodeState(AppendState(nil, claims, votes))
		if err != nil || !slices.Equal(c2, claims) || !slices.Equal(v2, votes) {
			t.Fatalf("round trip of %v %v: %v %v %v", claims, votes, c2, v2, err)
		}
	})
}
