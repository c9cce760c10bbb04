package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// TODO(speaker): replace with the real subcommand (owner: the speaker work).
func newSpeakerCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "speaker",
		Short: "run the speaker (not built yet)",
		RunE:  func(*cobra.Command, []string) error { return errors.New("speaker: not built yet") },
	}
}
