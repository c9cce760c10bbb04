package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// requireRoot skips a test that needs root and ip and curl when they are missing, and
// fails it in CI (CI=true), where they must be there.
func requireRoot(t *testing.T) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("skipping: needs root to create network namespaces, veths and mounts (run as root, as CI does)")
	}
	for _, p := range []string{"ip", "curl"} {
		if _, err := exec.LookPath(p); err != nil {
			skip("skipping: %s not installed", p)
		}
	}
}

// TestPodProcessInNetns runs a whoami pod process the way the agent does (ip
// netns exec + pod-exec with a read-only bind mount) in a pod namespace
// behind a veth of a throw-away node namespace, and curls it from the node.
func TestPodProcessInNetns(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	nodeNS := fmt.Sprintf("ilb-t%d-node", os.Getpid())
	if err := runIP(ctx, "netns", "add", nodeNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := runIP(context.Background(), "netns", "del", nodeNS); err != nil {
			t.Logf("deleting netns %s: %v", nodeNS, err)
		}
	})
	// The node needs an address of its own (the lab gives it 172.18.0.x on eth0).
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", "192.0.2.1/32", "dev", "lo"},
		{"addr", "add", "2001:db8::1/128", "dev", "lo"},
	} {
		if err := runIP(ctx, append([]string{"-n", nodeNS}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	uid := types.UID(fmt.Sprintf("%08x-0000-4000-8000-000000000000", os.Getpid()))
	podNS, veth := PodNetNames(uid)
	n := Net{NodeNS: nodeNS}
	podIP, podIP6 := netip.MustParseAddr("10.244.77.2"), netip.MustParseAddr("fd00:10:244:77::2")
	if err := n.Setup(ctx, uid, []netip.Addr{podIP, podIP6}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Teardown(context.Background(), uid) })
	// Setup is idempotent (an agent restart redoes it).
	if err := n.Setup(ctx, uid, []netip.Addr{podIP, podIP6}); err != nil {
		t.Fatalf("second Setup: %v", err)
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w := &podWorker{a: &Agent{cfg: Config{Self: self}}, uid: uid, pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "test-pod"}}}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "token"), []byte("tok-123"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "secrets", "serviceaccount")
	binds := []Bind{{Src: src, Dst: dst, ReadOnly: true}}

	cmd := w.command(PodExec{Binds: binds}, self, nil)
	cmd.Env = []string{"ILB_AGENT_TEST_ROLE=whoami", "PATH=" + os.Getenv("PATH")}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait() // "signal: killed"
	})

	for _, c := range []struct{ url, remote string }{
		{"http://" + podIP.String() + ":8080/hello", "RemoteAddr: 192.0.2.1:"},
		{"http://[" + podIP6.String() + "]:8080/hello", "RemoteAddr: [2001:db8::1]:"},
	} {
		var body string
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, err := exec.Command("ip", "netns", "exec", nodeNS, "curl", "-sS", "--noproxy", "*", "--max-time", "2", c.url).CombinedOutput()
			body = string(b)
			if err == nil && strings.Contains(body, "Hostname: test-pod") {
				break
			}
			if time.Now().After(deadline) {
				routes, _ := exec.Command("ip", "-n", nodeNS, "route", "show", "table", "all").CombinedOutput()
				addrs, _ := exec.Command("ip", "-n", podNS, "addr").CombinedOutput()
				t.Fatalf("curl %s from the node never got the whoami answer: %v\n%s\nprocess output:\n%s\nnode routes:\n%s\npod addresses:\n%s", c.url, err, body, out.String(), routes, addrs)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, want := range []string{"IP: " + podIP.String(), "IP: " + podIP6.String(), "GET /hello HTTP/1.1", c.remote} {
			if !strings.Contains(body, want) {
				t.Errorf("whoami answer to %s lacks %q:\n%s", c.url, want, body)
			}
		}
	}
	if _, err := exec.Command("ip", "-n", nodeNS, "link", "show", veth).CombinedOutput(); err != nil {
		t.Errorf("node-side veth %s missing: %v", veth, err)
	}

	// The container sees its volume, read-only, and the host does not see the mount.
	run := func(prog string, args ...string) (string, error) {
		c := w.command(PodExec{Binds: binds}, prog, args)
		c.Env = []string{"PATH=" + os.Getenv("PATH")}
		b, err := c.CombinedOutput()
		return string(b), err
	}
	if got, err := run("cat", filepath.Join(dst, "token")); err != nil || got != "tok-123" {
		t.Errorf("reading the mounted token: %q %v", got, err)
	}
	if got, err := run("sh", "-c", "echo x > "+filepath.Join(dst, "token")); err == nil {
		t.Errorf("writing to a read-only mount succeeded: %q", got)
	}
	if got, err := run("ip", "-o", "addr", "show", "dev", "eth0"); err != nil || !strings.Contains(got, podIP.String()+"/32") {
		t.Errorf("the container's eth0: %q %v", got, err)
	}
	if got, err := run("hostname"); err != nil || strings.TrimSpace(got) != "test-pod" {
		t.Errorf("the container's host name: %q %v, want test-pod", got, err)
	}
	if entries, _ := os.ReadDir(dst); len(entries) != 0 {
		t.Errorf("the bind mount leaked into the host mount namespace: %v", entries)
	}

	n.Teardown(ctx, uid)
	if NetnsExists(podNS) {
		t.Errorf("pod namespace %s still exists after Teardown", podNS)
	}
}
