package agent

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
)

func TestIPAMAllocatePersistRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	prefix := netip.MustParsePrefix("10.10.1.0/24")
	m, err := NewIPAM(prefix, path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := m.Allocate("pod-a")
	b, _ := m.Allocate("pod-b")
	if a.String() != "10.10.1.2" || b.String() != "10.10.1.3" {
		t.Fatalf("got %s %s, want 10.10.1.2 10.10.1.3", a, b)
	}
	if again, _ := m.Allocate("pod-a"); again != a {
		t.Errorf("second Allocate for pod-a = %s, want %s", again, a)
	}

	// An agent restart keeps the allocations.
	m2, err := NewIPAM(prefix, path)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := m2.Lookup("pod-b"); !ok || got != b {
		t.Errorf("after reload pod-b = %s %v, want %s", got, ok, b)
	}
	if err := m2.Release("pod-a"); err != nil {
		t.Fatal(err)
	}
	c, _ := m2.Allocate("pod-c")
	if c != a {
		t.Errorf("pod-c = %s, want the freed %s", c, a)
	}
	m3, _ := NewIPAM(prefix, path)
	if got := m3.Keys(); len(got) != 2 || got[0] != "pod-b" || got[1] != "pod-c" {
		t.Errorf("keys after reload = %v, want [pod-b pod-c]", got)
	}

	// A different CIDR ignores the old file.
	m4, _ := NewIPAM(netip.MustParsePrefix("10.10.2.0/24"), path)
	if len(m4.Keys()) != 0 {
		t.Errorf("different CIDR kept allocations %v", m4.Keys())
	}
}

func TestIPAMExhaustion(t *testing.T) {
	m, err := NewIPAM(netip.MustParsePrefix("10.10.9.0/29"), filepath.Join(t.TempDir(), "ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	// .2 .. .6 are usable (.0 network, .1 node, .7 broadcast).
	var got []string
	for i := 0; i < 5; i++ {
		a, err := m.Allocate(string(rune('a' + i)))
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		got = append(got, a.String())
	}
	if got[0] != "10.10.9.2" || got[4] != "10.10.9.6" {
		t.Errorf("allocated %v", got)
	}
	if _, err := m.Allocate("f"); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("6th allocation: %v, want ErrPoolExhausted", err)
	}
	if _, err := NewIPAM(netip.MustParsePrefix("fd00::/127"), filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "fd00::/127") {
		t.Errorf("IPv6 /127: %v, want an error naming the CIDR", err)
	}
}

func TestIPAMIPv6(t *testing.T) {
	m, err := NewIPAM(netip.MustParsePrefix("fd00:10:10:3::/126"), filepath.Join(t.TempDir(), "ipam6.json"))
	if err != nil {
		t.Fatal(err)
	}
	// ::2 and ::3 are usable (::0 is the subnet-router anycast address, ::1 the node's);
	// IPv6 has no broadcast address, but lastAddr is still the top of the range.
	for i, want := range []string{"fd00:10:10:3::2", "fd00:10:10:3::3"} {
		if a, err := m.Allocate(string(rune('a' + i))); err != nil || a.String() != want {
			t.Errorf("allocation %d: %v %v, want %s", i, a, err, want)
		}
	}
	for p, want := range map[string]string{
		"fd00:10:10:3::/64": "fd00:10:10:3:ffff:ffff:ffff:ffff",
		"10.10.9.0/29":      "10.10.9.7",
		"10.10.0.0/16":      "10.10.255.255",
	} {
		if got := lastAddr(netip.MustParsePrefix(p)).String(); got != want {
			t.Errorf("lastAddr(%s) = %s, want %s", p, got, want)
		}
	}
}
