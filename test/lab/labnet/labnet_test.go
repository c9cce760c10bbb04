package labnet

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestTopologyNames(t *testing.T) {
	topo, err := New(4)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, ip, mac, cidr string }{
		{"myk8s-control-plane", "172.18.0.2", "02:42:ac:12:00:02", "10.10.0.0/24"},
		{"myk8s-worker", "172.18.0.3", "02:42:ac:12:00:03", "10.10.1.0/24"},
		{"myk8s-worker2", "172.18.0.4", "02:42:ac:12:00:04", "10.10.2.0/24"},
		{"myk8s-worker3", "172.18.0.5", "02:42:ac:12:00:05", "10.10.3.0/24"},
		{"myk8s-worker4", "172.18.0.6", "02:42:ac:12:00:06", "10.10.4.0/24"},
		{"mypc", "172.18.0.100", "02:42:ac:12:00:64", "invalid Prefix"},
		{"mypc2", "172.18.0.102", "02:42:ac:12:00:66", "invalid Prefix"},
	}
	if len(topo.Hosts) != len(want) {
		t.Fatalf("got %d hosts, want %d", len(topo.Hosts), len(want))
	}
	for i, w := range want {
		h := topo.Hosts[i]
		if h.Name != w.name || h.IP.String() != w.ip || h.MAC != w.mac || h.PodCIDR.String() != w.cidr {
			t.Errorf("host %d = %s %s %s %s, want %v", i, h.Name, h.IP, h.MAC, h.PodCIDR, w)
		}
		if !IsLabNS(h.NS()) {
			t.Errorf("IsLabNS(%q) = false", h.NS())
		}
	}
	if got := len(topo.Nodes()); got != 5 {
		t.Errorf("Nodes() has %d hosts, want 5", got)
	}
	if !topo.Hosts[0].ControlPlane || topo.Hosts[1].ControlPlane {
		t.Errorf("only the first host is the control plane")
	}
	if _, err := New(MaxWorkers + 1); err == nil {
		t.Errorf("New(%d) succeeded, want an error", MaxWorkers+1)
	}

	topo.AddPrometheus()
	topo.AddPrometheus() // idempotent
	p, ok := topo.Host(PrometheusName)
	if !ok || len(topo.Hosts) != len(want)+1 || p.IP.String() != "172.18.0.101" || p.MAC != "02:42:ac:12:00:65" ||
		p.Node || !p.ReachesPods || !IsLabNS(p.NS()) {
		t.Errorf("after AddPrometheus: %d hosts, prometheus host %+v (found %v)", len(topo.Hosts), p, ok)
	}
	if got := len(topo.Nodes()); got != 5 {
		t.Errorf("after AddPrometheus Nodes() has %d hosts, want 5", got)
	}

	topo.AddDNS()
	topo.AddDNS() // idempotent
	d, ok := topo.Host(DNSName)
	if !ok || len(topo.Hosts) != len(want)+2 || d.IP != DNSIP || d.IP.String() != "172.18.0.103" || d.MAC != "02:42:ac:12:00:67" ||
		d.IP6.String() != "fc00:f853:ccd:e793::103" || d.Node || d.ReachesPods || d.NS() != "ilb-dns" || !IsLabNS(d.NS()) {
		t.Errorf("after AddDNS: %d hosts, dns host %+v (found %v)", len(topo.Hosts), d, ok)
	}
}

func TestOwnership(t *testing.T) {
	for name, want := range map[string]bool{
		"ilb-sw": true, "ilb-mypc": true, "ilb-mypc2": true, "ilb-mypc3": false, "ilb-prometheus": true, "ilb-dns": true, "ilb-dnsx": false, "ilb-myk8s-worker12": true, "ilb-p-0123abcd": false,
		"ilb-l2test": false, "ilb-p-xyz": false, "ilb-swx": false, "other": false,
	} {
		if got := IsLabNS(name); got != want {
			t.Errorf("IsLabNS(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{
		"veth0123abcd": false, "ilbp3": true, "ilbbr0": true, "eth0": false, "veth0": false, "ilb0": false,
	} {
		if got := IsLabLink(name); got != want {
			t.Errorf("IsLabLink(%q) = %v, want %v", name, got, want)
		}
	}
	if got := PodNSOfVeth("veth0123abcd"); got != "ilb-p-0123abcd" || !IsPodNS(got) {
		t.Errorf("PodNSOfVeth(veth0123abcd) = %q", got)
	}
	if got := PodNSOfVeth("veth0"); got != "" {
		t.Errorf("PodNSOfVeth(veth0) = %q, want none", got)
	}
}

// TestBuildAndForward builds a one-worker topology and checks addressing, pod routes, the
// root namespace's isolation and DialInNS. It needs root and no running lab.
func TestBuildAndForward(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2 (ip)")
	}
	ctx := context.Background()
	// Names of our own, so the test runs next to a lab (or the lab's smoke test).
	prefix := fmt.Sprintf("ilb-nt%d-", os.Getpid()%100000)
	topo, err := NewWithPrefix(1, prefix, FamilyDual)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, h := range topo.Hosts {
			_, _ = IP(ctx, "netns", "del", h.NS())
		}
		_, _ = IP(ctx, "netns", "del", topo.SwitchNS())
	})
	if err := topo.Build(ctx); err != nil {
		t.Fatal(err)
	}
	if err := topo.Check(ctx); err != nil {
		t.Fatal(err)
	}
	worker, _ := topo.Host("myk8s-worker")
	out, err := IP(ctx, "-n", worker.NS(), "route", "show", "10.10.0.0/24")
	if err != nil || !strings.Contains(out, "via 172.18.0.2 dev eth0") {
		t.Errorf("worker's route to the control plane's pod CIDR = %q (%v)", out, err)
	}
	out, err = IP(ctx, "-n", worker.NS(), "-6", "route", "show", "fd00:10:10::/64")
	if err != nil || !strings.Contains(out, "via fc00:f853:ccd:e793::2 dev eth0") {
		t.Errorf("worker's route to the control plane's IPv6 pod CIDR = %q (%v)", out, err)
	}
	out, err = IP(ctx, "-n", worker.NS(), "link", "show", "eth0")
	if err != nil || !strings.Contains(out, worker.MAC) {
		t.Errorf("worker eth0 = %q (%v), want MAC %s", out, err, worker.MAC)
	}
	out, _ = IP(ctx, "route", "get", "172.18.0.2")
	if strings.Contains(out, "ilb") {
		t.Errorf("the root namespace routes into the lab: %s", out)
	}

	// A TCP server on the control plane, reached from the root namespace through DialInNS,
	// from mypc's namespace across the bridge, on both addresses (IPv6: no DAD delay, nodad).
	mypc, _ := topo.Host(ClientName)
	if IsLabNS(mypc.NS()) {
		t.Fatalf("test namespace %s would be taken for the lab's", mypc.NS())
	}
	cp := topo.ControlPlane()
	for _, a := range cp.IPs() {
		checkDial(ctx, t, cp.NS(), mypc.NS(), netip.AddrPortFrom(a, 7777))
	}
}

// checkDial serves one greeting on addr in serverNS and reads it from clientNS.
func checkDial(ctx context.Context, t *testing.T, serverNS, clientNS string, addr netip.AddrPort) {
	t.Helper()
	var lis net.Listener
	if err := InNS(serverNS, func() error {
		var err error
		lis, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		_, _ = c.Write([]byte("hello from the control plane\n"))
	}()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := DialInNS(dctx, clientNS, addr)
	if err != nil {
		t.Fatalf("dialling %s from %s: %v", addr, clientNS, err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hello from the control plane\n" {
		t.Errorf("%s: read %q, %v", addr, line, err)
	}
}

func TestDualStackAddresses(t *testing.T) {
	topo, err := New(12)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][3]string{
		"myk8s-control-plane": {"172.18.0.2", "fc00:f853:ccd:e793::2", "fd00:10:10::/64"},
		"myk8s-worker":        {"172.18.0.3", "fc00:f853:ccd:e793::3", "fd00:10:10:1::/64"},
		"myk8s-worker12":      {"172.18.0.14", "fc00:f853:ccd:e793::14", "fd00:10:10:c::/64"},
		"mypc":                {"172.18.0.100", "fc00:f853:ccd:e793::100", "invalid Prefix"},
		"mypc2":               {"172.18.0.102", "fc00:f853:ccd:e793::102", "invalid Prefix"},
	} {
		h, _ := topo.Host(name)
		if got := [3]string{h.IP.String(), h.IP6.String(), h.PodCIDR6.String()}; got != want {
			t.Errorf("%s: addresses %v, want %v", name, got, want)
		}
	}
	if got := Join(topo.ServiceSubnets()); got != "10.200.1.0/24,fd00:10:200::/112" {
		t.Errorf("service CIDRs %s", got)
	}
	v4, err := NewWithPrefix(1, NSPrefix, FamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	if h := v4.Hosts[1]; h.IP6.IsValid() || h.PodCIDR6.IsValid() || len(v4.ServiceSubnets()) != 1 || len(h.IPs()) != 1 {
		t.Errorf("IPv4-only lab has IPv6 addresses: %+v", h)
	}
	if _, err := ParseIPFamily("ipv6"); err == nil || !strings.Contains(err.Error(), `"ipv6"`) {
		t.Errorf("ParseIPFamily(ipv6) = %v, want an error naming the value", err)
	}
}

func TestParseServiceSubnet(t *testing.T) {
	for _, c := range []struct {
		in, wantErr string
	}{
		{in: "10.200.1.0/24"},
		{in: "10.200.0.0/16"},
		{in: "10.200.1.5/24", wantErr: "did you mean 10.200.1.0/24"},
		{in: "fd00::/112", wantErr: "IPv4 only"},
		{in: "10.0.0.0/8", wantErr: "between 12 and 28"},
		{in: "10.200.0.0/29", wantErr: "between 12 and 28"},
		{in: "10.10.0.0/20", wantErr: "overlaps"},
		{in: "172.18.5.0/24", wantErr: "overlaps"},
		{in: "ten", wantErr: `"ten"`},
	} {
		p, err := ParseServiceSubnet(c.in)
		if c.wantErr == "" {
			if err != nil || p.String() != c.in {
				t.Errorf("ParseServiceSubnet(%q) = %v, %v", c.in, p, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), c.in) {
			t.Errorf("ParseServiceSubnet(%q): error %v, want one naming the value and saying %q", c.in, err, c.wantErr)
		}
	}
	topo, err := New(3)
	if err != nil {
		t.Fatal(err)
	}
	if got := topo.KubernetesServiceIP().String(); got != "10.200.1.1" {
		t.Errorf("default kubernetes Service IP %s, want 10.200.1.1", got)
	}
	topo.ServiceSubnet = netip.MustParsePrefix("10.200.0.0/16")
	if got := topo.KubernetesServiceIP().String(); got != "10.200.0.1" {
		t.Errorf("kubernetes Service IP in 10.200.0.0/16: %s, want 10.200.0.1", got)
	}
}
