// Command ironlb is both halves of the load balancer: `ironlb controller` allocates
// Service IPs, `ironlb speaker` announces them on the local network. One binary, one image.
//
// This package only parses flags and hands them to the controllers and speaker
// packages; no domain logic lives here.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:   "ironlb",
		Short: "ironlb is a MetalLB-compatible Layer-2 LoadBalancer for bare-metal Kubernetes",
		Long: `ironlb gives Services of type LoadBalancer an IP from an IPAddressPool and makes
one node answer ARP (IPv4) and NDP (IPv6) for it, as MetalLB's layer-2 mode does.

Run "ironlb controller" once per cluster (a Deployment) and "ironlb speaker" on every
node (a DaemonSet with host networking and NET_RAW).`,
		SilenceUsage:  true,
		SilenceErrors: true, // main prints the error once
		// Non-empty, so that cobra adds --version; the template prints the whole line.
		Version: "-",
	}
	root.SetVersionTemplate(versionInfo(debug.ReadBuildInfo()))
	root.AddCommand(newControllerCommand(), newSpeakerCommand(), newCleanupCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "ironlb:", err)
		os.Exit(1)
	}
}
