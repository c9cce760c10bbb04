package layer2_test

import (
	"context"
	"net/netip"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ironlb/ironlb/internal/layer2"
)

// The speaker's wiring: one Announcer per node, balancers set from the
// ownership layer, conflicts and kernel ARP findings turned into events.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := logr.Discard()
	a := layer2.NewAnnouncer(log, layer2.Options{
		NodeName:   "worker-1",
		Registerer: prometheus.NewRegistry(), // crmetrics.Registry in the speaker
	})
	go func() { _ = a.Run(ctx) }()

	// This node owns the service's IPs; an L2Advertisement
	// with no interfaces means all eligible ones.
	a.Apply([]layer2.BalancerUpdate{{Name: "default/web", IPs: []netip.Addr{netip.MustParseAddr("172.18.0.200")}}})

	go func() {
		for c := range a.Conflicts() {
			// Warning event on the Service, ServiceL2Status, metric.
			log.Info("address conflict", "ip", c.IP.String(), "otherMAC", c.MAC.String(), "interface", c.Interface)
		}
	}()

	if findings, err := a.KernelARPFindings([]netip.Addr{netip.MustParseAddr("172.18.0.200")}); err == nil {
		for _, f := range findings {
			log.Info(f.Message) // and a Warning event naming the fix
		}
	}

	// Another node owns them now, or the service went away: stop answering at once.
	a.Apply([]layer2.BalancerUpdate{{Name: "default/web", Delete: true}})
}
