// Command kubectl-ironlb is ironlb's kubectl plugin: put it on the PATH and run
// `kubectl ironlb status`. The command itself lives in internal/statuscmd (also
// `ironlb status`); this package only names it.
package main

import (
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/ironlb/ironlb/internal/statuscmd"
)

// version is set by the release build (-X main.version=...).
var version = ""

func main() {
	root := &cobra.Command{
		Use:   "kubectl-ironlb",
		Short: "ironlb's kubectl plugin",
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl ironlb",
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       pluginVersion(),
	}
	root.AddCommand(statuscmd.NewCommand(), statuscmd.NewDrainCommand(), statuscmd.NewUndrainCommand(), statuscmd.NewRebalanceCommand(),
		statuscmd.NewMigrateCommand())
	statuscmd.Main(root, "kubectl-ironlb")
}

func pluginVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return "unknown"
}
