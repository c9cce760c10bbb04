// Command ironlb is both halves of the load balancer: `ironlb controller` allocates
// Service IPs, `ironlb speaker` announces them on the local network. One binary, one image.
// `ironlb status` is `kubectl ironlb status` (cmd/kubectl-ironlb); `ironlb status --local`
// is what that runs in each speaker's container.
//
// This package only parses flags and hands them to the controllers and speaker
// packages; no domain logic lives here.
package main

import (
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/ironlb/ironlb/internal/statuscmd"
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
	root.AddCommand(newControllerCommand(), newSpeakerCommand(), newCleanupCommand(), statuscmd.NewCommand(), statuscmd.NewDrainCommand(), statuscmd.NewUndrainCommand(), statuscmd.NewRebalanceCommand(),
		statuscmd.NewMigrateCommand())
	statuscmd.Main(root, "ironlb") // prints the error once; `status` has its own exit codes
}
