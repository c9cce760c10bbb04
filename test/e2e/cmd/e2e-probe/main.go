// Command e2e-probe is the e2e suite's client on the external host. By
// default it sends one HTTP request every interval on a new connection and
// prints one line per request; with --keepalive N it also keeps N persistent
// connections busy and prints one JSON summary of both instead; with --arp it
// asks for an address by ARP (IPv4) or NDP (IPv6) every interval and prints every
// ARP packet or Neighbor Advertisement the address's holder sends (see package probe); with
// --chaos IP,IP... it is the nemesis's checker: all three at once on every IP (ARP every
// --arp-interval, --keepalive persistent connections, a new connection every --interval),
// printing every record and a JSON summary (probe.WriteChaos).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

func main() {
	var (
		o        probe.Options
		ko       probe.KeepAliveOptions
		ao       probe.ARPOptions
		arpIP    string
		newConns bool
		chaos    string
		arpEvery time.Duration
	)
	flag.StringVar(&o.URL, "url", "", "URL to GET")
	flag.StringVar(&arpIP, "arp", "", "instead of HTTP, ask for this address by ARP (IPv4) or Neighbor Solicitation (IPv6)")
	flag.StringVar(&ao.Interface, "iface", "", "--arp: interface (default: the one whose subnet holds the address)")
	flag.DurationVar(&o.Interval, "interval", 0, "time between request starts (default 20ms; --arp: 10ms)")
	flag.DurationVar(&o.Timeout, "timeout", 0, "per-request timeout of the new-connection probe (default 1s)")
	flag.StringVar(&o.StopFile, "stop-file", "", "stop once this file exists")
	flag.DurationVar(&o.Duration, "duration", 0, "stop after this long (0: until the stop file or SIGTERM)")
	flag.IntVar(&ko.Conns, "keepalive", 0, "also keep this many persistent HTTP/1.1 connections busy; print a JSON summary")
	flag.DurationVar(&ko.Interval, "keepalive-interval", 0, "--keepalive: time between the requests of one connection (default 100ms)")
	flag.DurationVar(&ko.Timeout, "keepalive-timeout", 0, "--keepalive: dial and request timeout; longer counts as a broken connection (default 2s)")
	flag.StringVar(&ko.ReadyFile, "ready-file", "", "--keepalive: create this file once every connection has answered once")
	flag.BoolVar(&newConns, "new-conns", true, "--keepalive: run the new-connection probe beside the persistent connections")
	flag.StringVar(&chaos, "chaos", "", "the nemesis's checker: comma-separated IPs, each asked for by ARP/NDP every --arp-interval, with --keepalive connections and a new connection every --interval")
	flag.DurationVar(&arpEvery, "arp-interval", 0, "--chaos: time between ARP requests for each IP (default 100ms)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch {
	case chaos != "":
		err = runChaos(ctx, chaos, arpEvery, o, ko)
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
	case o.URL != "" && ko.Conns > 0:
		err = runSummary(ctx, o, ko, newConns)
	case o.URL != "":
		err = probe.Write(os.Stdout, probe.Run(ctx, o))
	default:
		fail(2, fmt.Errorf("one of --url or --arp is required"))
	}
	if err != nil {
		fail(1, err)
	}
}

// runSummary runs the persistent connections and (if newConns) the
// new-connection probe side by side until the stop file, --duration or a
// signal, and prints the JSON summary.
func runSummary(ctx context.Context, o probe.Options, ko probe.KeepAliveOptions, newConns bool) error {
	ctx, cancel := probe.StopWhen(ctx, o.StopFile, o.Duration)
	defer cancel()
	ko.URL = o.URL
	rep := probe.Report{Start: time.Now()}
	var (
		wg   sync.WaitGroup
		recs []probe.Record
	)
	if newConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs = probe.Run(ctx, probe.Options{URL: o.URL, Interval: o.Interval, Timeout: o.Timeout})
		}()
	}
	ka, err := probe.RunKeepAlive(ctx, ko)
	cancel() // a bad keep-alive URL ends the run at once
	wg.Wait()
	if err != nil {
		return err
	}
	rep.End = time.Now()
	rep.KeepAlive = &ka
	if newConns {
		interval := o.Interval
		if interval <= 0 {
			interval = probe.DefaultInterval
		}
		rep.NewConns = probe.SummarizeNewConns(recs, interval)
	}
	return probe.WriteReport(os.Stdout, rep)
}

// runChaos runs probe.RunChaos on the comma-separated IPs until the stop
// file, --duration or a signal, and prints its records and summary.
func runChaos(ctx context.Context, ips string, arpEvery time.Duration, o probe.Options, ko probe.KeepAliveOptions) error {
	co := probe.ChaosOptions{ARPInterval: arpEvery, KeepAlive: ko.Conns, KeepAliveInterval: ko.Interval, KeepAliveTimeout: ko.Timeout,
		NewConnInterval: o.Interval, NewConnTimeout: o.Timeout}
	for _, s := range strings.Split(ips, ",") {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--chaos %q: %w", ips, err)
		}
		co.Targets = append(co.Targets, ip)
	}
	if ko.ReadyFile != "" {
		co.OnReady = func() { _ = os.WriteFile(ko.ReadyFile, nil, 0o644) } // the caller times out waiting for it and says so
	}
	ctx, cancel := probe.StopWhen(ctx, o.StopFile, o.Duration)
	defer cancel()
	rep, err := probe.RunChaos(ctx, co)
	if werr := probe.WriteChaos(os.Stdout, rep); werr != nil && err == nil {
		err = werr
	}
	return err
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "e2e-probe:", err)
	os.Exit(code)
}
