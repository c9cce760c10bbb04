package agent

import (
	"reflect"
	"testing"
)

func TestPodExecArgsRoundTrip(t *testing.T) {
	binds := []Bind{{Src: "/s/a", Dst: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}, {Src: "/s/b", Dst: "/data"}}
	got := PodExecArgs(binds, "web-1", "/work", "/bin/prog", []string{"--flag", "--"})
	want := []string{"pod-exec", "--hostname", "web-1",
		"--bind", "/s/a:/var/run/secrets/kubernetes.io/serviceaccount:ro", "--bind", "/s/b:/data",
		"--workdir", "/work", "--", "/bin/prog", "--flag", "--"}
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
