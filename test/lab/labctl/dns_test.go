package labctl

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

func TestDNSFQDN(t *testing.T) {
	for in, want := range map[string]string{
		"web": "web.lb.lab.", "web.lb.lab": "web.lb.lab.", "web.lb.lab.": "web.lb.lab.",
		"a.b": "a.b.lb.lab.", "lb.lab": "lb.lab.",
	} {
		if got := DNSFQDN(in); got != want {
			t.Errorf("DNSFQDN(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNamedConfig checks the lab's named configuration and zone with BIND's own checkers
// (named-checkconf, named-checkzone; package bind9-utils, which bind9 pulls in), for the
// dual-stack and the IPv4-only lab. Without them it skips, and fails in CI, where
// hack/ensure-packages.sh installs bind9.
func TestNamedConfig(t *testing.T) {
	for _, tool := range []string{"named-checkconf", "named-checkzone"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("needs %s (hack/ensure-packages.sh installs bind9): %v", tool, err)
			}
			t.Skipf("skipping: needs %s (apt-get install bind9): %v", tool, err)
		}
	}
	for _, family := range []string{labnet.FamilyDual, labnet.FamilyIPv4} {
		l := New(t.TempDir(), &bytes.Buffer{})
		topo, err := labnet.NewWithPrefix(1, labnet.NSPrefix, family)
		if err != nil {
			t.Fatal(err)
		}
		topo.AddDNS()
		h, _ := topo.Host(labnet.DNSName)
		if err := os.MkdirAll(l.DNSDir(), 0o755); err != nil {
			t.Fatal(err)
		}
		secret, err := l.tsigSecret()
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := l.tsigSecret(); again != secret || len(secret) != 44 {
			t.Errorf("tsigSecret: %q then %q, want one 44-character secret", secret, again)
		}
		conf := filepath.Join(l.DNSDir(), "named.conf")
		zone := filepath.Join(l.DNSDir(), DNSZone+".zone")
		if err := os.WriteFile(conf, []byte(l.namedConfig(h, secret)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(zone, []byte(namedZone(h)), 0o644); err != nil {
			t.Fatal(err)
		}
		// -z also loads the zones the configuration names.
		if out, err := exec.Command("named-checkconf", "-z", conf).CombinedOutput(); err != nil {
			t.Errorf("%s: named-checkconf: %v\n%s\n%s", family, err, out, l.namedConfig(h, secret))
		}
		out, err := exec.Command("named-checkzone", DNSZone, zone).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "OK") {
			t.Errorf("%s: named-checkzone: %v\n%s", family, err, out)
		}
		if got := strings.Contains(namedZone(h), "AAAA"); got != (family == labnet.FamilyDual) {
			t.Errorf("%s: zone has an AAAA record: %v", family, got)
		}
	}
	if rc := resolvConf(); !strings.HasPrefix(rc, resolvConfMarker+"\n") || !strings.Contains(rc, "nameserver 172.18.0.103\n") {
		t.Errorf("resolvConf() =\n%s", rc)
	}
}
