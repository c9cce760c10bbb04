package statusview

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// maxChangesShown bounds the owner changes the table lists (JSON and YAML
// carry them all).
const maxChangesShown = 20

// WriteTable writes the report for people: one block per Service with its
// nodes in election order, the membership views, recent owner changes and
// the problems.
func WriteTable(w io.Writer, r Report) error {
	var buf bytes.Buffer
	if err := writeTable(&buf, r); err != nil {
		return err
	}
	// Every cell is written, so that tabwriter aligns whole columns; the
	// padding it leaves after empty last cells is trimmed.
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+strings.Repeat("\n", strings.Count(line, "\n"))); err != nil {
			return err
		}
	}
	return nil
}

func writeTable(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(tw, format, args...) }
	if len(r.Services) == 0 {
		p("no LoadBalancer Service matched\n")
	} else {
		p("SERVICE\tIPS\tANNOUNCER\tNODE\tSTATE\tDETAIL\n")
	}
	for _, s := range r.Services {
		announcer := orNone(s.Announcer)
		lead := fmt.Sprintf("%s\t%s\t%s\t", s.Name, strings.Join(s.IPs, ","), announcer)
		if s.Reason != "" {
			p("%s-\tnot announced\t%s\n", lead, s.Reason)
			lead = "\t\t\t"
		}
		for _, n := range s.Nodes {
			p("%s%s\t%s\t%s\n", lead, n.Node, n.State, n.Detail)
			lead = "\t\t\t"
		}
		if s.Reason == "" && len(s.Nodes) == 0 {
			p("%s-\tno node known\t\n", lead)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	p("\nSPEAKER\tPOD\tSYNCED\tMEMBERS (its memberlist view)\n")
	views := map[string]View{}
	for _, v := range r.Membership.Views {
		views[v.Node] = v
	}
	for _, s := range r.Speakers {
		members := "-"
		if v, ok := views[s.Node]; ok {
			members = strings.Join(v.Members, " ")
			if len(v.Suspect) > 0 {
				members += " (suspect: " + strings.Join(v.Suspect, " ") + ")"
			}
		}
		if s.Error != "" {
			members = "error: " + s.Error
		}
		p("%s\t%s\t%s\t%s\n", s.Node, s.Pod, yesNo(s.Synced), members)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Membership.Agree {
		p("memberlist views agree\n")
	} else {
		p("memberlist views DIFFER\n")
	}

	if len(r.Changes) > 0 {
		p("\nRECENT OWNER CHANGES\tIP\tSERVICES\tFROM\tTO\tREASON\n")
		for i, c := range r.Changes {
			if i == maxChangesShown {
				p("(%d older, see -o json)\n", len(r.Changes)-maxChangesShown)
				break
			}
			p("%s\t%s\t%s\t%s\t%s\t%s\n", c.Time.UTC().Format(time.RFC3339), c.Key, strings.Join(c.Services, ","), orNone(c.From), c.To, c.Reason)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(r.Drains) > 0 {
		p("\nDRAINING (planned moves)\tIPS\tFORWARDED TO\tCONNECTIONS\tUNTIL\n")
		for _, d := range r.Drains {
			p("%s\t%s\t%s\t%d\t%s\n", d.Node, strings.Join(d.IPs, ","), d.From, d.ForwardedFlows, d.Until.UTC().Format(time.RFC3339))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(r.Problems) == 0 {
		p("\nno problem found\n")
	} else {
		p("\nPROBLEMS\n")
		for _, pr := range r.Problems {
			if pr.Service != "" {
				p("%s: %s: %s\n", pr.Kind, pr.Service, pr.Message)
			} else {
				p("%s: %s\n", pr.Kind, pr.Message)
			}
		}
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
