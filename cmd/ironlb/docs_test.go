package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ironlb/ironlb/internal/statuscmd"
	"github.com/ironlb/ironlb/test/mddoc"
)

// docFlag is one row of a flags table in docs/configuration.md.
type docFlag struct{ typ, def string }

// docFlagTables reads docs/configuration.md's flag tables: for each
// "### `...`" heading under "## Command-line flags", the long flag name of
// every row with its type and default (backticks and quotes removed).
func docFlagTables(t *testing.T) map[string]map[string]docFlag {
	t.Helper()
	doc, err := mddoc.Section("../../docs/configuration.md", "Command-line flags")
	if err != nil {
		t.Fatal(err)
	}
	longFlag := regexp.MustCompile("`--([a-z0-9-]+)`")
	tables := map[string]map[string]docFlag{}
	var section map[string]docFlag
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "### ") {
			section = map[string]docFlag{}
			tables[strings.TrimSpace(strings.TrimPrefix(line, "### "))] = section
			continue
		}
		if section == nil || !strings.HasPrefix(line, "| `-") {
			continue
		}
		cells := mddoc.Cells(line)
		if len(cells) < 4 {
			t.Fatalf("docs/configuration.md: flag row with fewer than 4 cells: %s", line)
		}
		m := longFlag.FindStringSubmatch(cells[0])
		if m == nil {
			t.Fatalf("docs/configuration.md: no --flag in the first cell of: %s", line)
		}
		clean := func(s string) string { return strings.Trim(strings.TrimSpace(s), "`\"") }
		section[m[1]] = docFlag{typ: clean(cells[1]), def: clean(cells[2])}
	}
	return tables
}

// Every flag of every subcommand appears in docs/configuration.md's table
// for it with the code's default, and every documented flag exists: the
// reference cannot drift from the code.
func TestFlagsDocumented(t *testing.T) {
	for _, env := range os.Environ() {
		if name, _, _ := strings.Cut(env, "="); strings.HasPrefix(name, "METALLB_") {
			t.Setenv(name, "") // flags take their defaults from these; empty is unset to them
		}
	}
	tables := docFlagTables(t)
	for heading, cmd := range map[string]*cobra.Command{
		"`ironlb controller`":                                                   newControllerCommand(),
		"`ironlb speaker`":                                                      newSpeakerCommand(),
		"`ironlb cleanup`":                                                      newCleanupCommand(),
		"`kubectl ironlb status` (`ironlb status`)":                             statuscmd.NewCommand(),
		"`kubectl ironlb drain` (`ironlb drain`)":                               statuscmd.NewDrainCommand(),
		"`kubectl ironlb undrain` (`ironlb undrain`)":                           statuscmd.NewUndrainCommand(),
		"`kubectl ironlb rebalance` (`ironlb rebalance`)":                       statuscmd.NewRebalanceCommand(),
		"`kubectl ironlb migrate-from-metallb` (`ironlb migrate-from-metallb`)": statuscmd.NewMigrateCommand(),
	} {
		documented, ok := tables[heading]
		if !ok {
			t.Errorf("docs/configuration.md has no table under ### %s (headings: %v)", heading, keys(tables))
			continue
		}
		seen := map[string]bool{}
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			seen[f.Name] = true
			d, ok := documented[f.Name]
			switch {
			case !ok:
				t.Errorf("%s: flag --%s (default %q) is not in docs/configuration.md", heading, f.Name, f.DefValue)
			case d.def != strings.Trim(f.DefValue, "[]") && d.def != f.DefValue:
				t.Errorf("%s: --%s defaults to %q in the code, docs/configuration.md says %q", heading, f.Name, f.DefValue, d.def)
			}
		})
		for name := range documented {
			if !seen[name] {
				t.Errorf("%s: docs/configuration.md documents --%s, which the command does not have", heading, name)
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
