package agent

import (
	"reflect"
	"testing"
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
