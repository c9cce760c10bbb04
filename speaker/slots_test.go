package speaker

import (
	"net/netip"
	"slices"
	"testing"
)

func TestSlots(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		name string
		ips  []string
		want [][]string // each slot's addresses; its key is the first
	}{
		{"none", nil, nil},
		{"one IPv4", []string{"10.0.0.5"}, [][]string{{"10.0.0.5"}}},
		{"dual-stack, IPv6 listed first: one slot, keyed by the IPv4 address (Key)", []string{"fd00::5", "10.0.0.5"},
			[][]string{{"10.0.0.5", "fd00::5"}}},
		{"three IPv4, in status order", []string{"10.0.0.9", "10.0.0.2", "10.0.0.5"},
			[][]string{{"10.0.0.2"}, {"10.0.0.5"}, {"10.0.0.9"}}},
		{"two per family", []string{"fd00::2", "10.0.0.2", "fd00::1", "10.0.0.1"},
			[][]string{{"10.0.0.1", "fd00::1"}, {"10.0.0.2", "fd00::2"}}},
		{"more IPv6 than IPv4", []string{"fd00::2", "10.0.0.1", "fd00::1"},
			[][]string{{"10.0.0.1", "fd00::1"}, {"fd00::2"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var in Input
			for _, s := range c.ips {
				in.IPs = append(in.IPs, a(s))
			}
			got := in.Slots()
			if len(got) != len(c.want) {
				t.Fatalf("slots %v, want %v", got, c.want)
			}
			for i, w := range c.want {
				var wa []netip.Addr
				for _, s := range w {
					wa = append(wa, a(s))
				}
				if !slices.Equal(got[i].IPs, wa) || got[i].Key != w[0] {
					t.Fatalf("slot %d = %+v, want %v keyed %s", i, got[i], w, w[0])
				}
			}
			if len(got) > 0 && got[0].Key != in.Key() {
				t.Fatalf("first slot's key %s, want the Service's key %s", got[0].Key, in.Key())
			}
		})
	}
}
