package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the build (make build, make image, the Dockerfile) with
// -ldflags "-X main.version=... -X main.commit=... -X main.date=...": the version is the
// chart's appVersion, so chart, image tag and binary agree; date is the commit's time
// (SOURCE_DATE_EPOCH), which keeps builds reproducible.
var (
	version = ""
	commit  = ""
	date    = ""
)

// versionInfo returns what `ironlb --version` prints. A plain `go build` or `go run` sets
// no ldflags: the commit and date then come from the VCS stamp Go embeds, if any.
func versionInfo(bi *debug.BuildInfo, ok bool) string {
	v, c, d := version, commit, date
	if ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && c == "":
				c = s.Value
			case s.Key == "vcs.time" && d == "":
				d = s.Value
			case s.Key == "vcs.modified" && s.Value == "true" && commit == "" && c != "":
				c += "-dirty"
			}
		}
	}
	or := func(s, def string) string {
		if s == "" {
			return def
		}
		return s
	}
	return fmt.Sprintf("ironlb version %s, commit %s, built %s, %s %s/%s\n",
		or(v, "dev"), or(c, "unknown"), or(d, "unknown"), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
