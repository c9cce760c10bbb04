package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionInfo(t *testing.T) {
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "feedface"}, {Key: "vcs.time", Value: "2026-11-20T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	set := func(v, c, d string) func() {
		ov, oc, od := version, commit, date
		version, commit, date = v, c, d
		return func() { version, commit, date = ov, oc, od }
	}
	for _, tc := range []struct {
		name    string
		ldflags [3]string
		bi      *debug.BuildInfo
		want    string
	}{
		{"ldflags win", [3]string{"0.1.0", "0123abc", "2026-11-24T03:00:00Z"}, stamped, "ironlb version 0.1.0, commit 0123abc, built 2026-11-24T03:00:00Z, go"},
		{"VCS stamp without ldflags", [3]string{}, stamped, "ironlb version dev, commit feedface-dirty, built 2026-11-20T10:00:00Z, go"},
		{"nothing known", [3]string{}, nil, "ironlb version dev, commit unknown, built unknown, go"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer set(tc.ldflags[0], tc.ldflags[1], tc.ldflags[2])()
			got := versionInfo(tc.bi, tc.bi != nil)
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("versionInfo = %q, want prefix %q", got, tc.want)
			}
		})
	}
}
