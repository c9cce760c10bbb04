package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ironlb/ironlb/api/v1beta1"
)

// FuzzParseAddresses checks the invariants of one spec.addresses entry. The seed
// corpus is in testdata/fuzz/FuzzParseAddresses; run longer with
// `go test ./internal/config -run '^$' -fuzz FuzzParseAddresses -fuzztime 60s`.
func FuzzParseAddresses(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseAddresses(s)
		if err != nil {
			if r != (Range{}) {
				t.Fatalf("ParseAddresses(%q) returned %v with error %v", s, r, err)
			}
			if !strings.Contains(err.Error(), "invalid") {
				t.Fatalf("error %q does not say what is invalid", err)
			}
			return
		}
		if !r.First.IsValid() || !r.Last.IsValid() {
			t.Fatalf("ParseAddresses(%q) = invalid addresses %v", s, r)
		}
		if r.First.Is4() != r.Last.Is4() {
			t.Fatalf("ParseAddresses(%q) = mixed families %v-%v", s, r.First, r.Last)
		}
		if r.First.Compare(r.Last) > 0 {
			t.Fatalf("ParseAddresses(%q): First %v > Last %v", s, r.First, r.Last)
		}
		if r.First.Zone() != "" || r.Last.Zone() != "" || r.First.Is4In6() || r.Last.Is4In6() {
			t.Fatalf("ParseAddresses(%q) = %v: zone or IPv4-mapped address", s, r)
		}
		if !r.Contains(r.First) || !r.Contains(r.Last) || !r.Overlaps(r) {
			t.Fatalf("range %v does not contain its ends", r)
		}
		// Round trip: the formatted range parses back to the same range.
		f := r.String()
		r2, err := ParseAddresses(f)
		if err != nil {
			t.Fatalf("ParseAddresses(%q) = %v, String() = %q does not parse: %v", s, r, f, err)
		}
		if r2 != r {
			t.Fatalf("round trip %q -> %q -> %v, want %v", s, f, r2, r)
		}
		// A CIDR entry is formatted as the same, masked, prefix.
		if !strings.Contains(s, "-") {
			p, perr := netip.ParsePrefix(strings.TrimSpace(s))
			if perr != nil {
				t.Fatalf("accepted %q as a CIDR but netip rejects it: %v", s, perr)
			}
			if f != p.Masked().String() {
				t.Fatalf("CIDR %q formatted as %q, want %q", s, f, p.Masked().String())
			}
		}
		// The prefix form, when there is one, covers exactly the range.
		if p, ok := r.Prefix(); ok {
			if p.Addr() != r.First || !p.Contains(r.Last) || p.Masked() != p {
				t.Fatalf("Prefix() of %v = %v", r, p)
			}
		}
	})
}

// FuzzParseOverlap checks that Parse rejects two entries exactly when they share an
// address, whether they are in one pool or two, and always names both entries.
func FuzzParseOverlap(f *testing.F) {
	f.Fuzz(func(t *testing.T, a, b string) {
		ra, errA := ParseAddresses(a)
		rb, errB := ParseAddresses(b)
		if errA != nil || errB != nil {
			return
		}
		// Independent of Range.Overlaps: one range holds an end of the other.
		overlap := ra.Is4() == rb.Is4() &&
			(between(ra.First, rb.First, rb.Last) || between(rb.First, ra.First, ra.Last))
		for _, pools := range [][]v1beta1.IPAddressPool{
			{pool("one", a, b)},
			{pool("one", a), pool("two", b)},
		} {
			_, err := Parse(pools, nil, nil)
			if overlap != (err != nil) {
				t.Fatalf("%q and %q: overlap=%v, Parse error=%v", a, b, overlap, err)
			}
			if err != nil && (!strings.Contains(err.Error(), "overlaps with already defined CIDR") ||
				!strings.Contains(err.Error(), strings.ReplaceAll(b, `"`, `\"`))) {
				t.Fatalf("%q and %q: error %q does not name the later entry", a, b, err)
			}
		}
	})
}

func between(x, lo, hi netip.Addr) bool { return lo.Compare(x) <= 0 && x.Compare(hi) <= 0 }
