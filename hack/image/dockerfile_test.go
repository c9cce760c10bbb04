package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDockerfileDescribesImage holds the Dockerfile (for people with Docker) to the image
// this tool builds: same entrypoint, user, PATH, base files and labels.
func TestDockerfileDescribesImage(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Instructions of the final stage, continuation lines joined.
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	var final []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "FROM "):
			final = nil
			fallthrough
		default:
			final = append(final, line)
		}
	}
	has := func(instr string) bool {
		for _, l := range final {
			if l == instr {
				return true
			}
		}
		return false
	}
	entry, _ := json.Marshal([]string{Entrypoint})
	for _, want := range []string{
		"FROM scratch", "COPY --from=build /rootfs/ /", "ENTRYPOINT " + string(entry),
		"USER " + User, "ENV " + Path, "WORKDIR /",
	} {
		if !has(want) {
			t.Errorf("the Dockerfile's final stage has no %q:\n%s", want, strings.Join(final, "\n"))
		}
	}
	for _, want := range []string{"COPY hack/image/rootfs/etc/ /rootfs/etc/", "mkdir -m 1777 /rootfs/tmp", "-o /rootfs" + Entrypoint + " "} {
		if !strings.Contains(text, want) {
			t.Errorf("the Dockerfile's build stage has no %q", want)
		}
	}
	var labels string
	for _, l := range final {
		if strings.HasPrefix(l, "LABEL ") {
			labels += l
		}
	}
	got := map[string]string{}
	for _, m := range regexp.MustCompile(`([a-z.]+)="([^"]*)"`).FindAllStringSubmatch(labels, -1) {
		got[m[1]] = m[2]
	}
	s := Spec{Source: DefaultSource, Licenses: DefaultLicenses, Version: "$VERSION", Revision: "$COMMIT", Created: time.Unix(0, 0)}
	want := s.Labels()
	want["org.opencontainers.image.created"] = "$BUILD_DATE"
	if len(got) != len(want) {
		t.Errorf("Dockerfile labels %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("Dockerfile label %s = %q, want %q", k, got[k], v)
		}
	}
}
