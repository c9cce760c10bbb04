//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The walkthrough's objects (examples/walkthrough, applied verbatim).
var (
	walkthroughServices = []string{"svc1", "svc2", "svc3"}
	walkthroughPods     = []string{"webpod1", "webpod2"}
)

// applyWalkthrough applies examples/walkthrough (idempotent) and waits for the
// backends to be Ready and the three services to have an IP. Every test that
// relies on the walkthrough's state calls it, so tests run alone too.
func applyWalkthrough(t testing.TB, e *Env) (ips []string) {
	t.Helper()
	ctx := ctxT(t)
	dir := filepath.Join(e.Root, "examples", "walkthrough")
	if out, err := e.kubectl(ctx, "", "apply", "-f", filepath.Join(dir, "pods.yaml")); err != nil {
		t.Fatalf("applying pods.yaml: %v\n%s", err, out)
	}
	// The webhook may still be loading its certificate right after the install.
	poll(t, time.Minute, "pool.yaml accepted", func() (bool, string) {
		out, err := e.kubectl(ctx, "", "apply", "-f", filepath.Join(dir, "pool.yaml"))
		if err != nil {
			return false, err.Error()
		}
		return true, out
	})
	if out, err := e.kubectl(ctx, "", "apply", "-f", filepath.Join(dir, "services.yaml")); err != nil {
		t.Fatalf("applying services.yaml: %v\n%s", err, out)
	}
	poll(t, 2*time.Minute, "webpod1 and webpod2 Ready", func() (bool, string) {
		for _, name := range walkthroughPods {
			var p corev1.Pod
			if err := e.C.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
				return false, err.Error()
			}
			if !podReady(&p) {
				return false, name + " not Ready: " + string(p.Status.Phase)
			}
		}
		return true, ""
	})
	for _, s := range walkthroughServices {
		ips = append(ips, e.waitIngressIP(t, "default", s))
	}
	return ips
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestWalkthrough is the users' walkthrough verbatim
// (/work/shared/scenarios/seed-walkthrough.md, examples/walkthrough).
func TestWalkthrough(t *testing.T) {
	e := requireEnv(t)
	ctx := ctxT(t)
	var announcerNodes []string
	dumpOnFailure(t, e, func() []string { return announcerNodes })

	// helm install (done by the suite's setup, as the walkthrough's first step).
	if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "status", Release, "-n", Namespace); err != nil || !strings.Contains(out, "STATUS: deployed") {
		t.Fatalf("helm status %s -n %s: %v\n%s", Release, Namespace, err, out)
	}
	for _, res := range []string{"ipaddresspools.metallb.io", "l2advertisements.metallb.io"} {
		out, err := e.kubectl(ctx, "", "explain", res)
		if err != nil {
			t.Fatalf("kubectl explain %s: %v", res, err)
		}
		if !regexp.MustCompile(`GROUP:\s+metallb.io`).MatchString(out) || !regexp.MustCompile(`VERSION:\s+v1beta1`).MatchString(out) || !strings.Contains(out, "FIELDS:") {
			t.Errorf("kubectl explain %s does not show GROUP metallb.io, VERSION v1beta1 and FIELDS:\n%s", res, out)
		}
	}

	ips := applyWalkthrough(t, e)

	// The CRs as the walkthrough shows them.
	for _, c := range []struct{ args, want string }{
		{"get ipaddresspools -n metallb-system", "" +
			"NAME        AUTO ASSIGN   AVOID BUGGY IPS   ADDRESSES\n" +
			`my-ippool   true          false             ["172.18.255.200-172.18.255.250"]`},
		{"get l2advertisements -n metallb-system", "" +
			"NAME              IPADDRESSPOOLS   IPADDRESSPOOL SELECTORS   INTERFACES\n" +
			`my-l2-advertise   ["my-ippool"]`},
	} {
		out, err := e.kubectl(ctx, "", strings.Fields(c.args)...)
		if err != nil {
			t.Fatalf("kubectl %s: %v", c.args, err)
		}
		if got := trimLines(out); got != c.want {
			t.Errorf("kubectl %s:\n%s\nwant (the walkthrough):\n%s", c.args, got, c.want)
		}
	}

	// EXTERNAL-IPs: the first free addresses of the pool, in order.
	for i, s := range walkthroughServices {
		if want := poolAddr(i); ips[i] != want {
			t.Errorf("service %s: EXTERNAL-IP %s, want %s", s, ips[i], want)
		}
	}
	out, _ := e.kubectl(ctx, "", "get", "svc")
	t.Logf("kubectl get svc:\n%s", out)

	macs, err := e.nodeMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range walkthroughServices {
		ip := ips[i]
		node := e.waitAnnouncer(t, "default", s, "")
		announcerNodes = append(announcerNodes, node)

		// kube-proxy programs the node asynchronously after the Service and its
		// endpoints appear (as on any cluster): the walkthrough's user curls
		// once the EXTERNAL-IP shows and the path works; so does the test.
		e.waitServing(t, ip)

		// 100/100 requests from mypc, both backends seen.
		seen, failed, err := e.curlMany(ctx, ip, 100)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s (%s) announced by %s: Hostname distribution %v, %d failed", s, ip, node, seen, len(failed))
		if len(failed) != 0 {
			t.Errorf("%s (%s): %d of 100 requests from %s failed (requests %v)", s, ip, len(failed), ClientHost, failed)
		}
		for _, p := range walkthroughPods {
			if seen[p] == 0 {
				t.Errorf("%s (%s): backend %s never answered in 100 requests (%v)", s, ip, p, seen)
			}
		}

		// mypc's neighbour entry is exactly one node's MAC: the announcer's.
		mac, line, err := e.neighMAC(ctx, ip)
		if err != nil {
			t.Fatal(err)
		}
		var owners []string
		for n, m := range macs {
			if m == mac {
				owners = append(owners, n)
			}
		}
		if len(owners) != 1 || owners[0] != node {
			t.Errorf("%s (%s): %s's neighbour entry %q is the MAC of nodes %v, want exactly the announcer %s (%s)", s, ip, ClientHost, line, owners, node, macs[node])
		}

		// The latest nodeAssigned event names the same node.
		evs, err := e.serviceEvents(ctx, "default", s, "nodeAssigned")
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			t.Errorf("%s: no nodeAssigned event", s)
		} else if last := evs[len(evs)-1].Message; !strings.Contains(last, fmt.Sprintf("%q", node)) {
			t.Errorf("%s: last nodeAssigned event %q does not name the announcer %s", s, last, node)
		}

		// kube-proxy's rules on the announcer: KUBE-SERVICES -> KUBE-EXT-* for the IP -> KUBE-SVC-*.
		checkKubeProxyChain(t, e, node, ip)
	}
}

func trimLines(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		out = append(out, strings.TrimRight(l, " \t"))
	}
	return strings.Join(out, "\n")
}

// checkKubeProxyChain checks the walkthrough's packet path on node: a
// KUBE-SERVICES rule for ip/32 jumping to a KUBE-EXT-* chain, which jumps to
// the service's KUBE-SVC-* chain, which has KUBE-SEP-* endpoints.
func checkKubeProxyChain(t testing.TB, e *Env, node, ip string) {
	t.Helper()
	ctx := context.Background()
	r, err := e.Hosts.Run(ctx, node, "iptables", "-t", "nat", "-S", "KUBE-SERVICES")
	if err != nil || r.Code != 0 {
		t.Errorf("%s: iptables -t nat -S KUBE-SERVICES: %v %s", node, err, r.Stderr)
		return
	}
	var ext string
	for _, l := range strings.Split(r.Stdout, "\n") {
		if strings.Contains(l, "-d "+ip+"/32") {
			if m := regexp.MustCompile(`-j (KUBE-EXT-\S+)`).FindStringSubmatch(l); m != nil {
				ext = m[1]
			}
		}
	}
	if ext == "" {
		t.Errorf("%s: no KUBE-SERVICES rule for %s/32 jumping to a KUBE-EXT-* chain:\n%s", node, ip, r.Stdout)
		return
	}
	r, _ = e.Hosts.Run(ctx, node, "iptables", "-t", "nat", "-S", ext)
	m := regexp.MustCompile(`-j (KUBE-SVC-\S+)`).FindStringSubmatch(r.Stdout)
	if m == nil {
		t.Errorf("%s: chain %s does not jump to a KUBE-SVC-* chain:\n%s", node, ext, r.Stdout)
		return
	}
	r, _ = e.Hosts.Run(ctx, node, "iptables", "-t", "nat", "-S", m[1])
	if !strings.Contains(r.Stdout, "KUBE-SEP-") {
		t.Errorf("%s: chain %s has no KUBE-SEP-* endpoint:\n%s", node, m[1], r.Stdout)
	}
	if os.Getenv("E2E_VERBOSE") == "1" {
		t.Logf("%s: %s -> %s -> %s", node, ip, ext, m[1])
	}
}
