package labctl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ironlb/ironlb/test/lab/agent"
)

func TestFindRoot(t *testing.T) {
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "test", "lab", "labctl")); err != nil {
		t.Errorf("FindRoot = %s, which has no test/lab/labctl", root)
	}
	if _, err := FindRoot("/"); err == nil {
		t.Errorf("FindRoot(/) succeeded")
	}
}

func TestPidFileDetectsReuse(t *testing.T) {
	l := New(t.TempDir(), &bytes.Buffer{})
	if err := os.MkdirAll(l.PidDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	write := func(name, content string) {
		if err := os.WriteFile(l.pidFile(name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("me", fmt.Sprintf("%d %d\n", self, startTime(self)))
	write("recycled", fmt.Sprintf("%d %d\n", self, startTime(self)+1))
	procs, err := l.Procs()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ProcInfo{}
	for _, p := range procs {
		got[p.Name] = p
	}
	if p := got["me"]; !p.Alive || p.Pid != self || p.RSSKB == 0 {
		t.Errorf("own pid file: %+v, want alive with RSS", p)
	}
	if p := got["recycled"]; p.Alive || p.Pid != 0 {
		t.Errorf("pid file with another start time: %+v, want not alive", p)
	}
	if d := descendants([]int{os.Getppid()}); !contains(d, self) {
		t.Errorf("descendants of our parent %v do not include us (%d)", d, self)
	}
}

func TestLogs(t *testing.T) {
	l := New(t.TempDir(), &bytes.Buffer{})
	if err := os.MkdirAll(l.PodLogDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"default_web_app.log": "app line\n", "default_web_sidecar.log": "sidecar line\n",
		"metallb-system_speaker-x_speaker.log": "speaker line\n",
	} {
		if err := os.WriteFile(filepath.Join(l.PodLogDir(), name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := l.Logs("web", "", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "app line") || !strings.Contains(out.String(), "sidecar line") {
		t.Errorf("logs of all containers = %q", out.String())
	}
	out.Reset()
	if err := l.Logs("metallb-system/speaker-x", "speaker", &out); err != nil || out.String() != "speaker line\n" {
		t.Errorf("logs = %q, %v", out.String(), err)
	}
	if err := l.Logs("nope", "", &out); err == nil {
		t.Errorf("logs of a missing pod succeeded")
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// The node agents run ironlb from the image `make image` writes, and stand-ins for the
// images the lab cannot build; the table parses as the agent parses it.
func TestImageTable(t *testing.T) {
	l := New(t.TempDir(), io.Discard)
	if err := os.MkdirAll(l.StateDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := l.writeImageTable(); err != nil {
		t.Fatal(err)
	}
	tbl, err := agent.LoadImageTable(l.imagesPath())
	if err != nil {
		t.Fatal(err)
	}
	if got := tbl.Images[IronlbImage]; got.Layout != filepath.Join(l.Root, "bin", "image", "oci") || got.Program != "" {
		t.Errorf("%s: %+v, want the layout bin/image/oci", IronlbImage, got)
	}
	for _, img := range []string{"traefik/whoami", "nicolaka/netshoot"} {
		if tbl.Images[img].Program == "" {
			t.Errorf("%s: %+v, want a stand-in program", img, tbl.Images[img])
		}
	}
	// MetalLB's images run its commands from bin/ once `make metallb` has built them.
	if _, ok := tbl.Images["quay.io/metallb/speaker"]; ok {
		t.Errorf("quay.io/metallb/speaker is in the table without bin/metallb-speaker: %+v", tbl.Images["quay.io/metallb/speaker"])
	}
	for _, name := range []string{"controller", "speaker"} {
		if err := os.MkdirAll(l.BinDir(), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(l.bin("metallb-"+name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.writeImageTable(); err != nil {
		t.Fatal(err)
	}
	if tbl, err = agent.LoadImageTable(l.imagesPath()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"controller", "speaker"} {
		img, err := tbl.Lookup("quay.io/metallb/" + name + ":v0.16.2")
		if err != nil {
			t.Fatal(err)
		}
		prog, args, err := img.Resolve(&corev1.Container{Name: name, Args: []string{"--port=9120"}}, nil)
		if err != nil || prog != l.bin("metallb-"+name) || len(args) != 1 || args[0] != "--port=9120" {
			t.Errorf("quay.io/metallb/%s resolves to %q %q (%v), want bin/metallb-%s --port=9120", name, prog, args, err, name)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"TERM": syscall.SIGTERM, "sigterm": syscall.SIGTERM, "KILL": syscall.SIGKILL, "SIGKILL": syscall.SIGKILL} {
		if got, err := ParseSignal(in); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "HUP", "9", "STOP"} {
		if _, err := ParseSignal(in); err == nil || !strings.Contains(err.Error(), "want TERM or KILL") {
			t.Errorf("ParseSignal(%q) error = %v, want one naming TERM and KILL", in, err)
		}
	}
}

// StopProcess stops the process a lab pid file names and waits for it; StartProcess refuses a
// running one; unknown names are rejected with the list of the lab's processes.
func TestStopStartProcess(t *testing.T) {
	l := New(t.TempDir(), io.Discard)
	if err := os.MkdirAll(l.PidDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A process that ignores SIGTERM would take stopGrace; sleep does not.
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	go func() { _ = cmd.Wait() }() // reap it, as lab up's start does
	pid := cmd.Process.Pid
	if err := os.WriteFile(l.pidFile(ProcEtcd), fmt.Appendf(nil, "%d %d\n", pid, startTime(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.StartProcess(ctx, ProcEtcd); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("StartProcess of a running process: %v, want already running", err)
	}
	if err := l.StopProcess(ctx, ProcEtcd, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("pid %d still alive after StopProcess", pid)
	}
	if err := l.StopProcess(ctx, ProcEtcd, syscall.SIGTERM); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("StopProcess of a stopped process: %v, want not running", err)
	}
	if err := l.StopProcess(ctx, ProcAPIServer, syscall.SIGTERM); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("StopProcess without a pid file: %v, want not running", err)
	}
	for _, name := range []string{"forward", "kube-proxy-nonode", "sshd"} {
		err := l.StopProcess(ctx, name, syscall.SIGKILL)
		if err == nil || !strings.Contains(err.Error(), "no lab process") || !strings.Contains(err.Error(), "lab-agent-myk8s-worker3") {
			t.Errorf("StopProcess(%q): %v, want an error listing the lab's processes", name, err)
		}
		if err := l.StartProcess(ctx, name); err == nil || !strings.Contains(err.Error(), "no lab process") {
			t.Errorf("StartProcess(%q): %v, want no lab process", name, err)
		}
	}
	if err := l.StopProcess(ctx, ProcEtcd, syscall.SIGHUP); err == nil {
		t.Errorf("StopProcess with SIGHUP succeeded")
	}
}

// The neighbour limits are raised only for a service CIDR whose IPs would not fit the
// kernel's default cap, to two entries per IP (up to 65,536 IPs) above it.
func TestNeighLimitsFor(t *testing.T) {
	for _, tc := range []struct {
		subnet string
		want   int
	}{
		{"10.200.1.0/24", 0},
		{"10.200.0.0/22", 0},
		{"10.200.0.0/21", 2*2048 + 1024},
		{"10.200.0.0/16", 2*65536 + 1024},
		{"10.0.0.0/8", 2*65536 + 1024},
		{"fd00:200::/118", 0},
		{"fd00:200::/108", 2*65536 + 1024},
	} {
		if got := neighLimitsFor(netip.MustParsePrefix(tc.subnet)); got != tc.want {
			t.Errorf("neighLimitsFor(%s) = %d, want %d", tc.subnet, got, tc.want)
		}
	}
}
