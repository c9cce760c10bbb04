package agent

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"traefik/whoami":                         "traefik/whoami",
		"traefik/whoami:v1.10":                   "traefik/whoami",
		"docker.io/traefik/whoami:latest":        "traefik/whoami",
		"docker.io/library/busybox:1.36":         "busybox",
		"busybox@sha256:abcd":                    "busybox",
		"ghcr.io/ironlb/ironlb:v0.1.0@sha256:ff": "ghcr.io/ironlb/ironlb",
		"localhost:5000/foo/bar":                 "localhost:5000/foo/bar",
		"localhost:5000/foo/bar:1":               "localhost:5000/foo/bar",
		"quay.io/metallb/speaker:v0.14.9":        "quay.io/metallb/speaker",
	} {
		if got := NormalizeImage(in); got != want {
			t.Errorf("NormalizeImage(%q) = %q, want %q", in, got, want)
		}
	}
}

func testTable(t *testing.T) (*ImageTable, string) {
	t.Helper()
	dir := t.TempDir()
	prog := filepath.Join(dir, "lab-whoami")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := `
images:
  docker.io/traefik/whoami:
    program: ` + prog + `
    args: ["--port", "80"]
    commands:
      /whoami: ` + prog + `
  nicolaka/netshoot:
    program: sleep
    args: ["infinity"]
  ghcr.io/ironlb/ironlb:
    program: ` + prog + `
`
	tbl, err := ParseImageTable([]byte(yaml))
	if err != nil {
		t.Fatalf("ParseImageTable: %v", err)
	}
	return tbl, prog
}

func TestResolve(t *testing.T) {
	tbl, prog := testTable(t)
	env := map[string]string{"PORT": "8080", "NODE": "w1"}
	cases := []struct {
		name     string
		c        corev1.Container
		wantProg string
		wantArgs []string
	}{
		{"defaults", corev1.Container{Image: "traefik/whoami:v1.10"}, prog, []string{"--port", "80"}},
		{"args replace default args", corev1.Container{Image: "traefik/whoami", Args: []string{"--port", "$(PORT)"}}, prog, []string{"--port", "8080"}},
		{"empty args list replaces default args", corev1.Container{Image: "traefik/whoami", Args: []string{}}, prog, []string{}},
		{"command from the table's commands", corev1.Container{Image: "traefik/whoami", Command: []string{"/whoami"}}, prog, []string{}},
		{"command in PATH, args expanded, escapes kept", corev1.Container{Image: "nicolaka/netshoot", Command: []string{"sleep"}, Args: []string{"$(NODE)", "$$(NODE)", "$(UNSET)"}}, mustLook(t, "sleep"), []string{"w1", "$(NODE)", "$(UNSET)"}},
		{"command with the program's base name", corev1.Container{Image: "ghcr.io/ironlb/ironlb:dev", Command: []string{"/lab-whoami"}, Args: []string{"speaker"}}, prog, []string{"speaker"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, args, err := tbl.Resolve(&tc.c, env)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if p != tc.wantProg || !reflect.DeepEqual(args, tc.wantArgs) {
				t.Errorf("Resolve = %q %q, want %q %q", p, args, tc.wantProg, tc.wantArgs)
			}
		})
	}
}

func mustLook(t *testing.T, name string) string {
	p, err := lookProgram(name)
	if err != nil {
		t.Skipf("%s not in PATH: %v", name, err)
	}
	return p
}

func TestResolveErrors(t *testing.T) {
	tbl, _ := testTable(t)
	_, _, err := tbl.Resolve(&corev1.Container{Image: "nginx:1.27"}, nil)
	var ie *ImageError
	if !errors.As(err, &ie) {
		t.Fatalf("unknown image: got %v, want *ImageError", err)
	}
	want := "image nginx:1.27 is not in the lab's image table (known: ghcr.io/ironlb/ironlb, nicolaka/netshoot, traefik/whoami)"
	if err.Error() != want {
		t.Errorf("message = %q, want %q", err.Error(), want)
	}
	_, _, err = tbl.Resolve(&corev1.Container{Image: "traefik/whoami", Command: []string{"/no/such/entrypoint"}}, nil)
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "/no/such/entrypoint") {
		t.Errorf("unknown command: got %v, want *CommandError naming it", err)
	}
	if _, err := ParseImageTable([]byte("images:\n  foo: {}\n")); err == nil {
		t.Error("entry without program: want an error")
	}
	if _, err := ParseImageTable([]byte("images:\n  foo: {program: x, bogus: 1}\n")); err == nil {
		t.Error("unknown field: want an error")
	}
}
