package allocator

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"

	"github.com/ironlb/ironlb/internal/config"
)

// u128 is an unsigned 128-bit integer. IPv6 ranges can hold up to 2^128
// addresses, so offsets inside a range do not fit in a uint64.
type u128 struct{ hi, lo uint64 }

func (a u128) cmp(b u128) int {
	switch {
	case a.hi < b.hi:
		return -1
	case a.hi > b.hi:
		return 1
	case a.lo < b.lo:
		return -1
	case a.lo > b.lo:
		return 1
	}
	return 0
}

func (a u128) sub(b u128) u128 {
	lo, borrow := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, borrow)
	return u128{hi, lo}
}

func (a u128) add(b u128) u128 {
	lo, carry := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, carry)
	return u128{hi, lo}
}

// addSat adds with saturation at 2^128-1 (only reachable when summing several
// huge IPv6 ranges).
func (a u128) addSat(b u128) u128 {
	lo, carry := bits.Add64(a.lo, b.lo, 0)
	hi, over := bits.Add64(a.hi, b.hi, carry)
	if over != 0 {
		return u128{math.MaxUint64, math.MaxUint64}
	}
	return u128{hi, lo}
}

// int64Sat converts to int64, saturating at math.MaxInt64.
func (a u128) int64Sat() int64 {
	if a.hi != 0 || a.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(a.lo)
}

func addrU128(a netip.Addr) u128 {
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func u128Addr6(v u128) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], v.hi)
	binary.BigEndian.PutUint64(b[8:], v.lo)
	return netip.AddrFrom16(b)
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func u32Addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// isBuggy reports whether an IPv4 address ends in .0 or .255, addresses that
// some old client firmwares mistake for network or broadcast addresses.
func isBuggy(v uint32) bool {
	o := v & 0xff
	return o == 0 || o == 0xff
}

// usableBelow counts the non-buggy IPv4 addresses in [0, x): each block of
// 256 has 254 usable ones (.1 to .254).
func usableBelow(x uint64) uint64 {
	r := x & 0xff
	n := 254 * (x >> 8)
	if r > 1 {
		n += r - 1
	}
	return n
}

// usableAt is the inverse of usableBelow: the non-buggy address with exactly
// t usable addresses below it.
func usableAt(t uint64) uint32 {
	return uint32((t/254)<<8 + 1 + t%254)
}

// span is one range of one pool, with the ordered set of its in-use
// addresses. Addresses are mapped to dense indexes 0..lastIdx (skipping buggy
// IPv4 addresses when the pool avoids them), so "first free address" is "first
// index missing from the set", found in O(log n) by the order-statistic treap.
// Nothing proportional to the range's size is ever stored.
type span struct {
	pool        *poolState
	first, last netip.Addr
	v4          bool
	avoidBuggy  bool   // IPv4 only
	base        uint64 // IPv4: first as uint32, or usableBelow(first) when avoidBuggy
	first6      u128   // IPv6: first as u128
	lastIdx     u128   // highest index; a span with no usable address has empty=true
	empty       bool
	used        treap
}

func newSpan(p *poolState, r config.Range, avoidBuggy bool) *span {
	s := &span{pool: p, first: r.First, last: r.Last, v4: r.First.Is4()}
	if s.v4 {
		f, l := uint64(addrU32(r.First)), uint64(addrU32(r.Last))
		if avoidBuggy {
			s.avoidBuggy = true
			s.base = usableBelow(f)
			n := usableBelow(l+1) - s.base
			if n == 0 {
				s.empty = true
			} else {
				s.lastIdx = u128{0, n - 1}
			}
		} else {
			s.base = f
			s.lastIdx = u128{0, l - f}
		}
		return s
	}
	s.first6 = addrU128(r.First)
	s.lastIdx = addrU128(r.Last).sub(s.first6)
	return s
}

func (s *span) contains(a netip.Addr) bool {
	return a.Is4() == s.v4 && s.first.Compare(a) <= 0 && a.Compare(s.last) <= 0
}

// index maps an address of the span to its dense index; ok is false for an
// address outside the span or one the pool avoids.
func (s *span) index(a netip.Addr) (u128, bool) {
	if !s.contains(a) {
		return u128{}, false
	}
	if s.v4 {
		v := addrU32(a)
		if s.avoidBuggy {
			if isBuggy(v) {
				return u128{}, false
			}
			return u128{0, usableBelow(uint64(v)) - s.base}, true
		}
		return u128{0, uint64(v) - s.base}, true
	}
	return addrU128(a).sub(s.first6), true
}

// addr maps a dense index back to its address; i must be <= lastIdx.
func (s *span) addr(i u128) netip.Addr {
	if s.v4 {
		if s.avoidBuggy {
			return u32Addr4(usableAt(s.base + i.lo))
		}
		return u32Addr4(uint32(s.base + i.lo))
	}
	return u128Addr6(s.first6.add(i))
}

// sizeSat is the number of usable addresses in the span, saturated at 2^128-1: the whole
// IPv6 space (::/0) has 2^128 addresses, one more than a u128 holds.
func (s *span) sizeSat() u128 {
	if s.empty {
		return u128{}
	}
	return s.lastIdx.addSat(u128{0, 1})
}

// firstFree returns the lowest unused address of the span.
func (s *span) firstFree() (netip.Addr, bool) {
	if s.empty {
		return netip.Addr{}, false
	}
	g := s.used.firstGap()
	if g.cmp(s.lastIdx) > 0 {
		return netip.Addr{}, false
	}
	return s.addr(g), true
}
