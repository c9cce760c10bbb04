package secondchance

import (
	"errors"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// TestSetRefusesInvalidInput runs without root: Set must refuse bad input
// before it opens a netlink socket (the interface does not even exist), and
// the error must name the offending value.
func TestSetRefusesInvalidInput(t *testing.T) {
	mac := mustMAC("02:00:00:00:00:01")
	vip := netip.MustParseAddr("192.0.2.10")
	for _, tc := range []struct {
		name string
		fwds []Forward
		want string // in the error
	}{
		{"zero address", []Forward{{OldMAC: mac}}, `VIP "invalid IP"`},
		{"unspecified IPv4", []Forward{{VIP: netip.IPv4Unspecified(), OldMAC: mac}}, "VIP 0.0.0.0 is the unspecified address"},
		{"unspecified IPv6", []Forward{{VIP: netip.IPv6Unspecified(), OldMAC: mac}}, "VIP :: is the unspecified address"},
		{"zone", []Forward{{VIP: netip.MustParseAddr("fe80::1%eth0"), OldMAC: mac}}, "VIP fe80::1%eth0 has a zone"},
		{"multicast", []Forward{{VIP: netip.MustParseAddr("239.1.1.1"), OldMAC: mac}}, "VIP 239.1.1.1 is not a unicast"},
		{"loopback", []Forward{{VIP: netip.MustParseAddr("::1"), OldMAC: mac}}, "VIP ::1 is not a unicast"},
		{"no MAC", []Forward{{VIP: vip}}, `VIP 192.0.2.10: previous owner's MAC "" is not a 6-byte`},
		{"EUI-64", []Forward{{VIP: vip, OldMAC: mustMAC("02:00:00:00:00:00:00:01")}}, `MAC "02:00:00:00:00:00:00:01" is not a 6-byte`},
		{"short MAC", []Forward{{VIP: vip, OldMAC: net.HardwareAddr{2, 0, 0}}}, `MAC "02:00:00" is not a 6-byte`},
		{"broadcast MAC", []Forward{{VIP: vip, OldMAC: mustMAC("ff:ff:ff:ff:ff:ff")}}, "MAC ff:ff:ff:ff:ff:ff is a group address"},
		{"multicast MAC", []Forward{{VIP: vip, OldMAC: mustMAC("01:00:5e:00:00:01")}}, "MAC 01:00:5e:00:00:01 is a group address"},
		{"zero MAC", []Forward{{VIP: vip, OldMAC: make(net.HardwareAddr, 6)}}, "MAC 00:00:00:00:00:00 is the zero address"},
		{"one bad among good", []Forward{{VIP: vip, OldMAC: mac}, {VIP: netip.MustParseAddr("2001:db8::1"), OldMAC: net.HardwareAddr{1}}},
			`VIP 2001:db8::1: previous owner's MAC "01" is not`},
		{"two MACs for one VIP", []Forward{{VIP: vip, OldMAC: mac}, {VIP: vip, OldMAC: mustMAC("02:00:00:00:00:02")}},
			"VIP 192.0.2.10 forwarded to two MACs, 02:00:00:00:00:01 and 02:00:00:00:00:02"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTable("ilbsc-nonexist0")
			err := tb.Set(tc.fwds)
			if err == nil {
				t.Fatal("Set accepted invalid input")
			}
			if !errors.Is(err, ErrInvalidForward) {
				t.Errorf("error %q does not wrap ErrInvalidForward (was it refused before validation?)", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "ilbsc-nonexist") {
				t.Errorf("error %q does not name the interface", err)
			}
			if tb.active {
				t.Error("the table is marked active after refused input")
			}
		})
	}
}

// TestSetValidInputNeedsInterface: valid input reaches the interface lookup,
// whose failure names the interface and is not an input error.
func TestSetValidInputNeedsInterface(t *testing.T) {
	tb := newTable("ilbscnone0")
	err := tb.Set([]Forward{{VIP: netip.MustParseAddr("192.0.2.1"), OldMAC: mustMAC("02:00:00:00:00:01")}})
	if err == nil {
		t.Fatal("Set succeeded on an interface that does not exist")
	}
	if errors.Is(err, ErrInvalidForward) || !strings.Contains(err.Error(), "ilbscnone0") {
		t.Errorf("unexpected error %q", err)
	}
}

func TestNormalize(t *testing.T) {
	a, b := mustMAC("02:00:00:00:00:0a"), mustMAC("02:00:00:00:00:0b")
	got, err := normalize([]Forward{
		{VIP: netip.MustParseAddr("2001:db8::2"), OldMAC: b},
		{VIP: netip.MustParseAddr("::ffff:192.0.2.2"), OldMAC: a}, // IPv4-mapped: IPv4
		{VIP: netip.MustParseAddr("192.0.2.1"), OldMAC: a},
		{VIP: netip.MustParseAddr("192.0.2.2"), OldMAC: a}, // the same forward again
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Forward{
		{VIP: netip.MustParseAddr("192.0.2.1"), OldMAC: a},
		{VIP: netip.MustParseAddr("192.0.2.2"), OldMAC: a},
		{VIP: netip.MustParseAddr("2001:db8::2"), OldMAC: b},
	}
	if !slices.EqualFunc(got, want, sameForward) {
		t.Errorf("normalize = %v, want %v", got, want)
	}
	if el := ipv4.elements(got); len(el) != 2 || len(el[0].Key) != 4 || len(el[0].Val) != 6 {
		t.Errorf("IPv4 map elements %v", el)
	}
	if el := ipv6.elements(got); len(el) != 1 || len(el[0].Key) != 16 {
		t.Errorf("IPv6 map elements %v", el)
	}
	if got, err := normalize(nil); err != nil || len(got) != 0 {
		t.Errorf("normalize(nil) = %v, %v", got, err)
	}
}

func TestCheckIfname(t *testing.T) {
	for _, ok := range []string{"eth0", "bond0.100", "enp1s0f1np1", "a23456789012345"} {
		if err := checkIfname(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a b", "a:1", "a234567890123456"} {
		if err := checkIfname(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestFlowKeyRegisters checks the register layout of the flow keys: the
// loads must fill exactly the set's key length from NFT_REG32_00 on, in
// consecutive registers, without passing the last register; otherwise the
// kernel would compare a key made partly of stale register contents.
func TestFlowKeyRegisters(t *testing.T) {
	for _, f := range families {
		next := uint32(unix.NFT_REG32_00)
		var bytes uint32
		for _, e := range f.loadFlow() {
			p := e.(*expr.Payload)
			if p.DestRegister != next {
				t.Errorf("%s: load of %d bytes into register %d, want %d", f.local, p.Len, p.DestRegister, next)
			}
			words := (p.Len + 3) / 4
			next += words
			bytes += 4 * words
		}
		if want := f.flowType().Bytes; bytes != want {
			t.Errorf("%s: flow key loads fill %d bytes, the set key is %d", f.local, bytes, want)
		}
		if last := next - 1; last > unix.NFT_REG32_15 {
			t.Errorf("%s: flow key reaches register %d, past NFT_REG32_15", f.local, last)
		}
	}
}

// TestRulesShape checks what keeps the rules correct whatever the
// forwards: every rule first requires a TCP packet of its family addressed
// to this host, and then a destination in the map of forwarded IPs (the
// lookup reads the destination loaded just before it); only the last rule
// of a family sends anything on, and it drops the original after the dup.
func TestRulesShape(t *testing.T) {
	own := mustMAC("02:00:00:00:00:0e")
	tb := newTable("eth0")
	for _, f := range families {
		o := f.objects(tb.nft)
		rules := f.rules(o, own)
		if len(rules) != len(ruleComments) {
			t.Fatalf("%d rules, %d comments", len(rules), len(ruleComments))
		}
		m := f.match()
		for i, r := range rules {
			if len(r) <= len(m) || !reflect.DeepEqual(r[:len(m)], m) {
				t.Fatalf("%s rule %d does not start with the family's match", f.vips, i)
			}
			lookup := slices.IndexFunc(r, func(e expr.Any) bool {
				l, ok := e.(*expr.Lookup)
				return ok && l.SetName == o.vips.Name
			})
			if lookup < 1 || !reflect.DeepEqual(r[lookup-1], f.loadDaddr()) ||
				r[lookup].(*expr.Lookup).SourceRegister != regScratch || r[lookup].(*expr.Lookup).Invert {
				t.Errorf("%s rule %d does not look the destination up in %s", f.vips, i, o.vips.Name)
			}
			dups := 0
			for _, e := range r {
				if _, ok := e.(*expr.Dup); ok {
					dups++
				}
			}
			last := i == len(rules)-1
			if (dups == 1) != last || dups > 1 {
				t.Errorf("%s rule %d has %d dup expressions", f.vips, i, dups)
			}
			if v, ok := r[len(r)-1].(*expr.Verdict); last && (!ok || v.Kind != expr.VerdictDrop) {
				t.Errorf("the forward rule ends with %T, want a drop verdict", r[len(r)-1])
			}
		}
	}
}
