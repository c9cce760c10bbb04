// Command e2e-probe sends one HTTP request every interval on a new connection
// and prints one line per request (see package probe). The e2e suite runs it
// on the external client.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

func main() {
	var o probe.Options
	flag.StringVar(&o.URL, "url", "", "URL to GET")
	flag.DurationVar(&o.Interval, "interval", 0, "time between request starts (default 20ms)")
	flag.DurationVar(&o.Timeout, "timeout", 0, "per-request timeout (default 1s)")
	flag.StringVar(&o.StopFile, "stop-file", "", "stop once this file exists")
	flag.DurationVar(&o.Duration, "duration", 0, "stop after this long (0: until the stop file or SIGTERM)")
	flag.Parse()
	if o.URL == "" {
		fmt.Fprintln(os.Stderr, "e2e-probe: --url is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := probe.Write(os.Stdout, probe.Run(ctx, o)); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-probe:", err)
		os.Exit(1)
	}
}
