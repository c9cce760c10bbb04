// Package textlimit bounds user-supplied text before it is quoted in an error, an
// event or a log line. Kubernetes refuses an event whose note exceeds 1 KiB, so an
// annotation holding a megabyte of garbage, quoted in full, would produce no event
// at all; in a log line it would drown the rest.
package textlimit

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// MaxQuoted is how many bytes of a user-supplied value Quote keeps: enough to
// recognise any real address, name or selector, short enough that several quoted
// values fit in one event.
const MaxQuoted = 96

// MaxEventNote is the longest event message (note) the API server accepts
// (events.k8s.io/v1 validation: 1 KiB).
const MaxEventNote = 1024

// Quote returns s quoted as %q does. A value longer than MaxQuoted bytes is cut on a
// rune boundary and followed by its full length, e.g. "abc..."(+5000 bytes), so the
// reader sees both that it was cut and how big it was.
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return strconv.Quote(s)
	}
	head := Cut(s, MaxQuoted)
	return fmt.Sprintf("%s...(%d bytes in all)", strconv.Quote(head), len(s))
}

// Cut returns the longest prefix of s of at most n bytes that does not split a
// UTF-8 sequence.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// Note bounds a finished message (which may quote several values) to max bytes,
// marking the cut with a trailing "...", so it is accepted as an event note or
// stays readable as a log field.
func Note(msg string, limit int) string {
	const mark = "..."
	if len(msg) <= limit {
		return msg
	}
	return Cut(msg, limit-len(mark)) + mark
}
