package layer2

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEligibility(t *testing.T) {
	ex, err := CompileExcludes(DefaultExcludeInterfaces)
	if err != nil {
		t.Fatal(err)
	}
	base := testLink("eth0", 2, eth0MAC, ll0)
	mod := func(f func(*Link)) Link { l := base; f(&l); return l }
	for _, tc := range []struct {
		name      string
		link      Link
		arp, ndp  bool
		reasonHas string
	}{
		{"eth0", base, true, true, ""},
		{"no link-local", mod(func(l *Link) { l.LinkLocal = netip.Addr{} }), true, false, ""},
		{"no broadcast", mod(func(l *Link) { l.Broadcast = false }), false, true, ""},
		{"down", mod(func(l *Link) { l.Up = false }), false, false, "down"},
		{"bond slave", mod(func(l *Link) { l.Slave = true }), false, false, "enslaved"},
		{"noarp", mod(func(l *Link) { l.NoARP = true }), false, false, "NOARP"},
		{"no MAC", mod(func(l *Link) { l.MAC = nil }), false, false, "Ethernet"},
		{"lo", mod(func(l *Link) { l.Name = "lo" }), false, false, "^lo$"},
		{"lo0 is not lo", mod(func(l *Link) { l.Name = "lo0" }), true, true, ""},
		{"veth", mod(func(l *Link) { l.Name = "veth1234" }), false, false, "^veth"},
		{"cali", mod(func(l *Link) { l.Name = "cali99" }), false, false, "^cali"},
		{"kube-ipvs0", mod(func(l *Link) { l.Name = "kube-ipvs0" }), false, false, "kube-ipvs"},
		{"docker0", mod(func(l *Link) { l.Name = "docker0" }), false, false, "docker"},
		{"bridge br0", mod(func(l *Link) { l.Name = "br0" }), true, true, ""},
		{"bond0", mod(func(l *Link) { l.Name = "bond0" }), true, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, n, reason := eligibility(tc.link, ex)
			if a != tc.arp || n != tc.ndp {
				t.Errorf("arp=%v ndp=%v (%s), want arp=%v ndp=%v", a, n, reason, tc.arp, tc.ndp)
			}
			if tc.reasonHas != "" && !containsStr(reason, tc.reasonHas) {
				t.Errorf("reason %q, want it to mention %q", reason, tc.reasonHas)
			}
		})
	}
	if _, err := CompileExcludes([]string{"^ok", "(["}); err == nil || !containsStr(err.Error(), `"(["`) {
		t.Errorf("bad pattern error %v, want it to name the pattern", err)
	}
}

func containsStr(s, sub string) bool { return strings.Contains(s, sub) }

func indexOf(s, sub string) int { return strings.Index(s, sub) }

func TestKernelARPFindings(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.10")
	local := map[netip.Addr][]string{
		vip:                               {"kube-ipvs0"},
		netip.MustParseAddr("192.0.2.20"): {"eth0"},
	}
	eligible := []string{"eth0", "eth1"}
	for _, tc := range []struct {
		name    string
		ips     []netip.Addr
		ignore  map[string]int
		answers map[netip.Addr][]string
	}{
		{"IPVS without strictARP: every interface answers", []netip.Addr{vip},
			map[string]int{"eth0": 0, "eth1": 0}, map[netip.Addr][]string{vip: {"eth0", "eth1"}}},
		{"strictARP (arp_ignore=1): none", []netip.Addr{vip},
			map[string]int{"eth0": 1, "eth1": 1}, nil},
		{"mixed", []netip.Addr{vip},
			map[string]int{"eth0": 1, "eth1": 0}, map[netip.Addr][]string{vip: {"eth1"}}},
		{"address on the receiving interface with arp_ignore=1 still answers", []netip.Addr{netip.MustParseAddr("192.0.2.20")},
			map[string]int{"eth0": 1, "eth1": 1}, map[netip.Addr][]string{netip.MustParseAddr("192.0.2.20"): {"eth0"}}},
		{"arp_ignore=8 never answers", []netip.Addr{netip.MustParseAddr("192.0.2.20")},
			map[string]int{"eth0": 8, "eth1": 8}, nil},
		{"IP not local: nothing", []netip.Addr{netip.MustParseAddr("192.0.2.30"), netip.MustParseAddr("2001:db8::1")},
			map[string]int{"eth0": 0, "eth1": 0}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kernelARPFindings(tc.ips, local, eligible, func(s string) (int, error) { return tc.ignore[s], nil })
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.answers) {
				t.Fatalf("findings %+v, want %v", got, tc.answers)
			}
			for _, f := range got {
				if !slices.Equal(f.AnswersOn, tc.answers[f.IP]) {
					t.Errorf("%s answers on %v, want %v", f.IP, f.AnswersOn, tc.answers[f.IP])
				}
				if indexOf(f.Message, "strictARP: true") < 0 || indexOf(f.Message, f.IP.String()) < 0 {
					t.Errorf("message %q must name the IP and the fix", f.Message)
				}
			}
		})
	}
	_, err := kernelARPFindings([]netip.Addr{vip}, local, eligible, func(string) (int, error) { return 0, errors.New("boom") })
	if err == nil {
		t.Errorf("sysctl read error not returned")
	}
}

func TestProcArpIgnore(t *testing.T) {
	root := t.TempDir()
	write := func(dir, v string) {
		t.Helper()
		if err := mkfile(root+"/"+dir+"/arp_ignore", v); err != nil {
			t.Fatal(err)
		}
	}
	write("all", "1\n")
	write("eth0", "0\n")
	write("eth1", "2\n")
	read := procArpIgnore(root)
	if v, err := read("eth0"); err != nil || v != 1 {
		t.Errorf("eth0 = %d, %v; want max(all=1, eth0=0) = 1", v, err)
	}
	if v, err := read("eth1"); err != nil || v != 2 {
		t.Errorf("eth1 = %d, %v; want 2", v, err)
	}
	if _, err := read("nope"); err == nil || indexOf(err.Error(), "nope/arp_ignore") < 0 {
		t.Errorf("missing interface error %v, want it to name the file", err)
	}
}

func mkfile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}
