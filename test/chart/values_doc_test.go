package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ironlb/ironlb/test/mddoc"
)

// flattenValues returns every path of values: leaves with their value, and
// maps (which a row may document as a whole) with nil.
func flattenValues(prefix string, v any, out map[string]any) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		out[prefix] = v
		return
	}
	if prefix != "" {
		out[prefix] = nil
	}
	for k, child := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		flattenValues(p, child, out)
	}
}

// docValueRow is one row of docs/configuration.md's Helm values table.
type docValueRow struct {
	paths []string // `a.b`, `.c` expands to a.c
	def   string   // the default cell when it is one backticked scalar, else ""
	line  string
}

func docValueRows(t *testing.T, root string) []docValueRow {
	t.Helper()
	doc, err := mddoc.Section(filepath.Join(root, "docs", "configuration.md"), "Helm values")
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile("`([^`]*)`")
	single := regexp.MustCompile("^`([^`]*)`$")
	var rows []docValueRow
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := mddoc.Cells(line)
		if len(cells) < 3 {
			t.Fatalf("docs/configuration.md: Helm row with fewer than 3 cells: %s", line)
		}
		r := docValueRow{line: line}
		base := ""
		for _, m := range code.FindAllStringSubmatch(cells[0], -1) {
			p := m[1]
			if strings.HasPrefix(p, ".") {
				p = base + p
			} else if i := strings.LastIndex(p, "."); i >= 0 {
				base = p[:i]
			}
			r.paths = append(r.paths, p)
		}
		if m := single.FindStringSubmatch(strings.TrimSpace(cells[1])); m != nil && len(r.paths) == 1 {
			r.def = m[1]
		}
		rows = append(rows, r)
	}
	if len(rows) < 20 {
		t.Fatalf("parsed only %d rows from docs/configuration.md's Helm values table", len(rows))
	}
	return rows
}

// Every value in charts/ironlb/values.yaml is documented in
// docs/configuration.md (by itself or by a row for a map holding it), every
// documented value exists, and a default documented as one plain value is
// the chart's.
func TestValuesDocumented(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "charts", "ironlb", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatalf("charts/ironlb/values.yaml: %v", err)
	}
	all := map[string]any{}
	flattenValues("", values, all)
	rows := docValueRows(t, root)

	var documented []string
	for _, r := range rows {
		for _, p := range r.paths {
			documented = append(documented, p)
			v, ok := all[p]
			if !ok {
				t.Errorf("docs/configuration.md documents Helm value %s, which values.yaml does not have (row: %s)", p, r.line)
				continue
			}
			if r.def == "" || v == nil {
				continue
			}
			if got := scalarString(v); got != r.def && (r.def != `""` || got != "") {
				t.Errorf("Helm value %s defaults to %q in values.yaml, docs/configuration.md says %q", p, got, r.def)
			}
		}
	}
	for p, v := range all {
		if v == nil && hasChild(all, p) {
			continue // a map: its leaves are checked
		}
		covered := slices.ContainsFunc(documented, func(d string) bool { return p == d || strings.HasPrefix(p, d+".") })
		if !covered {
			t.Errorf("Helm value %s (default %v) is not documented in docs/configuration.md", p, v)
		}
	}
}

func hasChild(all map[string]any, p string) bool {
	for q := range all {
		if strings.HasPrefix(q, p+".") {
			return true
		}
	}
	return false
}

// scalarString prints a YAML scalar as the docs write it: [] and {} for
// empty lists and maps.
func scalarString(v any) string {
	switch x := v.(type) {
	case []any:
		if len(x) == 0 {
			return "[]"
		}
	case map[string]any:
		if len(x) == 0 {
			return "{}"
		}
	case nil:
		return "null"
	}
	return fmt.Sprint(v)
}
