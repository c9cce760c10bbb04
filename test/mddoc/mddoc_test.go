package mddoc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestSectionAndCells(t *testing.T) {
	p := filepath.Join(t.TempDir(), "doc.md")
	doc := "# T\n\n## A\n\nx\n\n### A1\n\n| `--f` | never\\|always | `1` |\n\n## B\n\ny\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Section(p, "A")
	if err != nil {
		t.Fatal(err)
	}
	if want := "## A\n\nx\n\n### A1\n\n| `--f` | never\\|always | `1` |\n"; got != want {
		t.Fatalf("Section(A) = %q, want %q", got, want)
	}
	if _, err := Section(p, "C"); err == nil {
		t.Fatal("Section(C) found a section that does not exist")
	}
	if cells := Cells("| `--f` | never\\|always | `1` |"); !slices.Equal(cells, []string{" `--f` ", " never|always ", " `1` "}) {
		t.Fatalf("Cells = %q", cells)
	}
}
