package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPodExecArgsRoundTrip(t *testing.T) {
	binds := []Bind{{Src: "/s/a", Dst: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}, {Src: "/s/b", Dst: "/data"}}
	pe := PodExec{Binds: binds, Hostname: "web-1", Workdir: "/work", User: &Cred{UID: 65534, GID: 65534, Groups: []int64{65534, 10}}}
	got := PodExecArgs(pe, "/bin/prog", []string{"--flag", "--"})
	want := []string{"pod-exec", "--hostname", "web-1",
		"--bind", "/s/a:/var/run/secrets/kubernetes.io/serviceaccount:ro", "--bind", "/s/b:/data",
		"--workdir", "/work", "--user", "65534:65534:65534,10", "--", "/bin/prog", "--flag", "--"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("PodExecArgs =\n%q\nwant\n%q", got, want)
	}
	for _, s := range []string{"/s/a:/d:ro", "/s/b:/d", "/s/c:/d:rw"} {
		b, err := ParseBind(s)
		if err != nil {
			t.Errorf("ParseBind(%q): %v", s, err)
			continue
		}
		if b.String() != s && s != "/s/c:/d:rw" {
			t.Errorf("ParseBind(%q).String() = %q", s, b.String())
		}
	}
	for _, bad := range []string{"/only", "/a:/b:bogus", "/a:/b:ro:x"} {
		if _, err := ParseBind(bad); err == nil {
			t.Errorf("ParseBind(%q): want an error", bad)
		}
	}
	for s, want := range map[string]Cred{"0:0": {}, "65532:65532": {UID: 65532, GID: 65532}, "1:2:3,4": {UID: 1, GID: 2, Groups: []int64{3, 4}}} {
		c, err := ParseCred(s)
		if err != nil || !reflect.DeepEqual(c, want) {
			t.Errorf("ParseCred(%q) = %+v, %v, want %+v", s, c, err, want)
		}
		if err == nil && c.String() != s {
			t.Errorf("ParseCred(%q).String() = %q", s, c.String())
		}
	}
	for _, bad := range []string{"", "65532", "a:b", "1:2:", "1:2:x", "-1:0", "1:2:3:4"} {
		if _, err := ParseCred(bad); err == nil {
			t.Errorf("ParseCred(%q): want an error", bad)
		}
	}
	if err := PodExecMain([]string{"--user", "root"}); err == nil {
		t.Error("PodExecMain with --user root: want an error")
	}
	if err := PodExecMain([]string{"--bind"}); err == nil {
		t.Error("PodExecMain with a dangling --bind: want an error")
	}
	if err := PodExecMain([]string{"--bogus"}); err == nil {
		t.Error("PodExecMain with an unknown flag: want an error")
	}
	if err := PodExecMain([]string{"--"}); err == nil {
		t.Error("PodExecMain without a program: want an error")
	}
}

// TestPodExecNestedReadOnlyMounts runs a container process through pod-exec with a
// read-only volume mounted inside another read-only one, listed child first (MetalLB's
// speaker mounts /etc/metallb/memberlist inside /etc/metallb): both are readable, neither
// writable, and the parent does not hide the child.
func TestPodExecNestedReadOnlyMounts(t *testing.T) {
	requireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parent, child := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(parent, "excludel2.yaml"), []byte("parent-file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(child, "config"), []byte("child-file"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "etc-metallb")
	w := &podWorker{a: &Agent{cfg: Config{Self: self}}, pod: &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: true}}}
	binds := []Bind{{Src: child, Dst: dst + "/memberlist", ReadOnly: true}, {Src: parent, Dst: dst, ReadOnly: true}}
	script := `cat "$D/excludel2.yaml"; echo; cat "$D/memberlist/config"; echo; ` +
		`touch "$D/x" 2>/dev/null || echo parent-read-only; touch "$D/memberlist/x" 2>/dev/null || echo child-read-only`
	cmd := w.command(PodExec{Binds: binds}, "/bin/sh", []string{"-c", script})
	cmd.Env = []string{"D=" + dst, "PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "parent-file\nchild-file\nparent-read-only\nchild-read-only\n"
	if string(out) != want {
		t.Errorf("the container's output is\n%s\nwant\n%s", out, want)
	}
	// The child's mount point was made in the parent volume's directory, as the kubelet's
	// runtime makes it; the parent's content is otherwise untouched.
	if st, err := os.Stat(filepath.Join(parent, "memberlist")); err != nil || !st.IsDir() {
		t.Errorf("mount point memberlist in the parent volume: %v", err)
	}
}
