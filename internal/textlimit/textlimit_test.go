package textlimit

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"10.0.0.1", `"10.0.0.1"`},
		{`a"b%c`, `"a\"b%c"`},
		{strings.Repeat("x", MaxQuoted), `"` + strings.Repeat("x", MaxQuoted) + `"`},
		{strings.Repeat("x", MaxQuoted+1), `"` + strings.Repeat("x", MaxQuoted) + `"...(97 bytes in all)`},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%.20q) = %s, want %s", tc.in, got, tc.want)
		}
	}
	huge := strings.Repeat("é", 1<<20) // 2 MiB, two bytes per rune
	got := Quote(huge)
	if len(got) > MaxQuoted+40 || !strings.Contains(got, "(2097152 bytes in all)") {
		t.Errorf("Quote(2 MiB) = %s", got)
	}
}

func TestCutKeepsRunes(t *testing.T) {
	s := "aé€😀"
	for n := 0; n <= len(s)+1; n++ {
		got := Cut(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasPrefix(s, got) {
			t.Errorf("Cut(%q, %d) = %q", s, n, got)
		}
	}
}

func TestNote(t *testing.T) {
	if got := Note("short", MaxEventNote); got != "short" {
		t.Errorf("Note(short) = %q", got)
	}
	got := Note(strings.Repeat("€", 2000), MaxEventNote)
	if len(got) > MaxEventNote || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Errorf("Note(6000 bytes) has %d bytes, suffix %q", len(got), got[len(got)-5:])
	}
}
