package config

import (
	"fmt"
	"testing"

	"github.com/ironlb/ironlb/api/v1beta1"
)

// BenchmarkParse parses 1,000 pools of four entries each (CIDRs, ranges, IPv6) and
// 100 advertisements: the webhook runs this on every pool or advertisement change.
func BenchmarkParse(b *testing.B) {
	var pools []v1beta1.IPAddressPool
	for i := range 1000 {
		pools = append(pools, pool(fmt.Sprintf("pool-%04d", i),
			fmt.Sprintf("10.%d.%d.0/26", i/256, i%256),
			fmt.Sprintf("10.%d.%d.64-10.%d.%d.127", i/256, i%256, i/256, i%256),
			fmt.Sprintf("10.%d.%d.128/25", i/256, i%256),
			fmt.Sprintf("2001:db8:%x::/64", i)))
	}
	var ads []v1beta1.L2Advertisement
	for i := range 100 {
		ads = append(ads, ad(fmt.Sprintf("ad-%03d", i), v1beta1.L2AdvertisementSpec{
			IPAddressPools: []string{fmt.Sprintf("pool-%04d", i), fmt.Sprintf("pool-%04d", i+100)},
		}))
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(pools, ads, nil); err != nil {
			b.Fatal(err)
		}
	}
}
