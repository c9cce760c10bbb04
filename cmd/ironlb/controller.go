package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// TODO(controller): replace with the real subcommand (owner: the controller work).
func newControllerCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "controller",
		Short: "run the controller (not built yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("controller: not built yet") },
	}
}
