package config

import (
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
)

func TestReservedAddressClasses(t *testing.T) {
	for _, tc := range []struct {
		addr, want string // want "" means accepted
	}{
		{"0.0.0.0/0", `"this network"`},
		{"::/0", "unspecified address (::)"},
		{"0.0.0.0/32", `"this network"`},
		{"::/128", "unspecified"},
		{"127.0.0.1/32", "loopback (127.0.0.0/8)"},
		{"::1/128", "loopback (::1)"},
		{"169.254.10.0/24", "link-local (169.254.0.0/16)"},
		{"fe80::1-fe80::5", "link-local (fe80::/10)"},
		{"224.0.0.1/32", "multicast (224.0.0.0/4)"},
		{"239.255.255.250/32", "multicast"},
		{"ff02::1/128", "multicast (ff00::/8)"},
		{"255.255.255.255/32", "limited broadcast"},
		{"126.255.255.250-127.0.0.1", "loopback"}, // one bad address is enough
		{"192.168.10.0/24", ""},
		{"100.64.0.0/24", ""},
		{"198.18.0.0/24", ""},
		{"fc00::/120", ""},
		{"2001:db8::/120", ""},
		{"1.0.0.0/8", ""},
		{"223.255.255.0/24", ""},
	} {
		_, err := Parse([]v1beta1.IPAddressPool{pool("p", tc.addr)}, nil, nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.addr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"p": spec.addresses[0]: "`+tc.addr+`"`)):
			t.Errorf("%s: error %v, want one naming the pool, field, value and %q", tc.addr, err, tc.want)
		}
	}
}

func TestNegativePriority(t *testing.T) {
	p := pool("p", "192.168.10.0/24")
	p.Spec.ServiceAllocation = &v1beta1.ServiceAllocation{Priority: -5}
	_, err := Parse([]v1beta1.IPAddressPool{p}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), `IPAddressPool "p": spec.serviceAllocation.priority: priority -5 is negative`) {
		t.Fatalf("err = %v", err)
	}
	p.Spec.ServiceAllocation.Priority = 0
	if _, err := Parse([]v1beta1.IPAddressPool{p}, nil, nil); err != nil {
		t.Fatalf("priority 0: %v", err)
	}
}

func TestCheckClusterNetworks(t *testing.T) {
	nets := []ClusterNetwork{
		{netip.MustParsePrefix("10.96.0.0/12"), `Service network (ServiceCIDR "kubernetes")`},
		{netip.MustParsePrefix("10.244.1.0/24"), `pod network of node "w1"`},
	}
	p := pool("p", "10.0.0.0/8", "192.168.1.0/24", "10.244.1.200-10.244.2.3", "junk")
	errs := CheckClusterNetworks(&p, nets)
	if len(errs) != 2 {
		t.Fatalf("got %d errors, want 2: %v", len(errs), errs)
	}
	for i, want := range []string{
		`IPAddressPool "p": spec.addresses[0]: "10.0.0.0/8" overlaps the cluster's Service network (ServiceCIDR "kubernetes") 10.96.0.0/12`,
		`IPAddressPool "p": spec.addresses[2]: "10.244.1.200-10.244.2.3" overlaps the cluster's pod network of node "w1" 10.244.1.0/24`,
	} {
		if !strings.HasPrefix(errs[i].Error(), want) {
			t.Errorf("error %d = %v\nwant prefix %s", i, errs[i], want)
		}
	}
}

func TestLongValuesAreBounded(t *testing.T) {
	long := strings.Repeat("x", 100000)
	p := pool("p", "192.168.10.0/24")
	p.Spec.ServiceAllocation = &v1beta1.ServiceAllocation{Namespaces: []string{long}}
	a := ad("a", v1beta1.L2AdvertisementSpec{Interfaces: []string{long}, NodeSelectors: []metav1.LabelSelector{sel("k", long)}})
	_, err := Parse([]v1beta1.IPAddressPool{p}, []v1beta1.L2Advertisement{a}, nil)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if len(e.Error()) > 700 {
			t.Errorf("%d-byte error: %.200s...", len(e.Error()), e.Error())
		}
	}
}
