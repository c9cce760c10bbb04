// Command e2e-probe is the e2e suite's client on the external host. By
// default it sends one HTTP request every interval on a new connection and
// prints one line per request; with --arp it instead asks for an IPv4 address
// by ARP every interval and prints every ARP packet the address's holder sends
// (see package probe).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

func main() {
	var (
		o     probe.Options
		ao    probe.ARPOptions
		arpIP string
	)
	flag.StringVar(&o.URL, "url", "", "URL to GET")
	flag.StringVar(&arpIP, "arp", "", "instead of HTTP, ask for this IPv4 address by ARP")
	flag.StringVar(&ao.Interface, "iface", "", "--arp: interface (default: the one whose subnet holds the address)")
	flag.DurationVar(&o.Interval, "interval", 0, "time between request starts (default 20ms; --arp: 10ms)")
	flag.DurationVar(&o.Timeout, "timeout", 0, "per-request timeout (default 1s)")
	flag.StringVar(&o.StopFile, "stop-file", "", "stop once this file exists")
	flag.DurationVar(&o.Duration, "duration", 0, "stop after this long (0: until the stop file or SIGTERM)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch {
	case arpIP != "":
		ao.Target, err = netip.ParseAddr(arpIP)
		if err != nil {
			fail(2, fmt.Errorf("--arp %q: %w", arpIP, err))
		}
		ao.Interval, ao.StopFile, ao.Duration = o.Interval, o.StopFile, o.Duration
		recs, runErr := probe.RunARP(ctx, ao)
		err = probe.WriteARP(os.Stdout, recs)
		if runErr != nil {
			err = runErr
		}
	case o.URL != "":
		err = probe.Write(os.Stdout, probe.Run(ctx, o))
	default:
		fail(2, fmt.Errorf("one of --url or --arp is required"))
	}
	if err != nil {
		fail(1, err)
	}
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "e2e-probe:", err)
	os.Exit(code)
}
