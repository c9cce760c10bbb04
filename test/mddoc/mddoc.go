// Package mddoc reads the project's Markdown reference (docs/configuration.md)
// for the tests that keep it in step with the code: a section's text and a
// table row's cells.
package mddoc

import (
	"fmt"
	"os"
	"strings"
)

// Section returns the text of the "## heading" section of the Markdown file
// at path, from its heading line up to the next "## " heading (its "###"
// subsections included).
func Section(path, heading string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	doc := string(b)
	start := strings.Index(doc, "\n## "+heading+"\n")
	if start < 0 {
		return "", fmt.Errorf("%s has no section %q", path, "## "+heading)
	}
	doc = doc[start+1:]
	if end := strings.Index(doc[3:], "\n## "); end >= 0 {
		doc = doc[:end+3]
	}
	return doc, nil
}

// Cells splits a table row ("| a | b |") into its cells, untrimmed; `\|` is
// a pipe inside a cell.
func Cells(row string) []string {
	cells := strings.Split(strings.Trim(strings.ReplaceAll(row, `\|`, "\x00"), "|"), "|")
	for i := range cells {
		cells[i] = strings.ReplaceAll(cells[i], "\x00", "|")
	}
	return cells
}
