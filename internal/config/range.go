package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/ironlb/ironlb/internal/textlimit"
)

// ParseAddresses parses one entry of an IPAddressPool's spec.addresses: a CIDR
// ("192.168.10.0/24", "fc00::/120"; host bits are ignored, as net.ParseCIDR does) or
// an inclusive range "start-end" ("192.168.9.1-192.168.9.5", spaces around either
// address ignored). Both ends of a range must be of one family and start must not
// be after end. Zones and IPv4-mapped IPv6 addresses are refused: they would make
// the family of the entry ambiguous.
//
// The error message names the entry as written, bounded by textlimit.Quote
// (MetalLB's wording: `invalid CIDR %q`, `invalid IP range %q: ...`).
func ParseAddresses(s string) (Range, error) {
	entry := strings.TrimSpace(s)
	if !strings.Contains(entry, "-") {
		return parseCIDR(s, entry)
	}
	start, end, _ := strings.Cut(entry, "-")
	start, end = strings.TrimSpace(start), strings.TrimSpace(end)
	q, qStart, qEnd := textlimit.Quote(s), textlimit.Quote(start), textlimit.Quote(end)
	first, err := parseAddr(start)
	if err != nil {
		return Range{}, fmt.Errorf("invalid IP range %s: invalid start IP %s: %w", q, qStart, err)
	}
	last, err := parseAddr(end)
	if err != nil {
		return Range{}, fmt.Errorf("invalid IP range %s: invalid end IP %s: %w", q, qEnd, err)
	}
	if first.Is4() != last.Is4() {
		return Range{}, fmt.Errorf("invalid IP range %s: start IP %s and end IP %s are of different families", q, qStart, qEnd)
	}
	if first.Compare(last) > 0 {
		return Range{}, fmt.Errorf("invalid IP range %s: start IP %s is after the end IP %s", q, qStart, qEnd)
	}
	return Range{First: first, Last: last}, nil
}

func parseCIDR(raw, entry string) (Range, error) {
	q := textlimit.Quote(raw)
	if entry == "" {
		return Range{}, fmt.Errorf("invalid CIDR %s: empty", q)
	}
	if !strings.Contains(entry, "/") {
		if a, err := netip.ParseAddr(entry); err == nil {
			return Range{}, fmt.Errorf("invalid CIDR %s: no prefix length (write %s/%d for a single address)", q, a.WithZone(""), a.BitLen())
		}
		return Range{}, fmt.Errorf("invalid CIDR %s", q)
	}
	p, err := netip.ParsePrefix(entry)
	if err != nil {
		return Range{}, fmt.Errorf("invalid CIDR %s: %w", q, unwrapParseError(err))
	}
	if p.Addr().Is4In6() {
		return Range{}, fmt.Errorf("invalid CIDR %s: IPv4-mapped IPv6 addresses are not supported, write the IPv4 CIDR", q)
	}
	p = p.Masked()
	return Range{First: p.Addr(), Last: lastAddr(p)}, nil
}

func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, unwrapParseError(err)
	}
	if a.Zone() != "" {
		return netip.Addr{}, errors.New("zones are not allowed")
	}
	if a.Is4In6() {
		return netip.Addr{}, errors.New("IPv4-mapped IPv6 addresses are not supported, write the IPv4 address")
	}
	return a, nil
}

// unwrapParseError keeps netip's reason without repeating the input, which the
// callers already quote.
func unwrapParseError(err error) error {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return errors.New(msg[i+2:])
	}
	return err
}

// lastAddr returns the highest address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr()
	if a.Is4() {
		b := a.As4()
		setHostBits(b[:], p.Bits())
		return netip.AddrFrom4(b)
	}
	b := a.As16()
	setHostBits(b[:], p.Bits())
	return netip.AddrFrom16(b)
}

func setHostBits(b []byte, bits int) {
	for i := range b {
		switch {
		case bits >= 8:
			bits -= 8
		case bits > 0:
			b[i] |= 0xff >> bits
			bits = 0
		default:
			b[i] = 0xff
		}
	}
}

// Is4 reports whether the range holds IPv4 addresses.
func (r Range) Is4() bool { return r.First.Is4() }

// Contains reports whether a is in the range (same family, First <= a <= Last).
func (r Range) Contains(a netip.Addr) bool {
	return a.Is4() == r.First.Is4() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Overlaps reports whether the two ranges share at least one address.
func (r Range) Overlaps(o Range) bool {
	return r.Is4() == o.Is4() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

// Prefix returns the CIDR equal to the range, if there is one.
func (r Range) Prefix() (netip.Prefix, bool) {
	if !r.First.IsValid() || !r.Last.IsValid() || r.First.Is4() != r.Last.Is4() {
		return netip.Prefix{}, false
	}
	for bits := 0; bits <= r.First.BitLen(); bits++ {
		p := netip.PrefixFrom(r.First, bits)
		if p.Masked().Addr() != r.First {
			continue // First has host bits set at this length: try a longer prefix.
		}
		if lastAddr(p) == r.Last {
			return p, true
		}
		if lastAddr(p).Compare(r.Last) < 0 {
			return netip.Prefix{}, false // Shorter prefixes were too big, longer are smaller still.
		}
	}
	return netip.Prefix{}, false
}

// String formats the range as ParseAddresses accepts it: as a CIDR when it is
// exactly one, otherwise as "first-last".
func (r Range) String() string {
	if p, ok := r.Prefix(); ok {
		return p.String()
	}
	return r.First.String() + "-" + r.Last.String()
}
