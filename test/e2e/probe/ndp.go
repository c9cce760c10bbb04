package probe

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/ndp"
)

// runNDP is RunARP for an IPv6 target: a Neighbor Solicitation to the target's
// solicited-node group every Interval, from the client's link-local address as a host
// resolving the address sends it, recording every Neighbor Advertisement for the target
// (answers to us and unsolicited ones sent to all nodes) with its flags, so a test can
// check Router is never set, Override is, and when the answers start and whose MAC they
// carry.
func runNDP(ctx context.Context, o ARPOptions, ifi *net.Interface) ([]ARPRecord, error) {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, fmt.Errorf("NDP socket on %s: %w", ifi.Name, err)
	}
	group, err := ndp.SolicitedNodeMulticast(o.Target)
	if err != nil {
		_ = c.Close() // the error above is the one to report
		return nil, fmt.Errorf("solicited-node group of %v: %w", o.Target, err)
	}
	read := func() (ARPRecord, bool, error) {
		m, _, _, err := c.ReadFrom()
		if err != nil {
			return ARPRecord{}, false, err
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || na.TargetAddress != o.Target {
			return ARPRecord{}, false, nil
		}
		r := ARPRecord{Reply: true, NDP: true, Router: na.Router, Solicited: na.Solicited, Override: na.Override}
		for _, opt := range na.Options {
			if lla, ok := opt.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
				r.MAC = lla.Addr
			}
		}
		return r, true, nil
	}
	ns := &ndp.NeighborSolicitation{
		TargetAddress: o.Target,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
	}
	ask := func() error {
		if err := c.WriteTo(ns, nil, group); err != nil {
			return fmt.Errorf("sending a Neighbor Solicitation for %v on %s: %w", o.Target, ifi.Name, err)
		}
		return nil
	}
	return collect(ctx, o, read, ask, c.Close)
}

// ndpFlags renders an advertisement's flags as WriteARP prints them: R, S and O, "-" for none.
func ndpFlags(r ARPRecord) string {
	s := ""
	for _, f := range []struct {
		set  bool
		name string
	}{{r.Router, "R"}, {r.Solicited, "S"}, {r.Override, "O"}} {
		if f.set {
			s += f.name
		}
	}
	if s == "" {
		return "-"
	}
	return s
}

// isIPv6 is the family test RunARP dispatches on.
func isIPv6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }
