//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// poll calls cond every second until it returns true or timeout passes; then
// the test fails with what cond last said.
func poll(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if detail != "" {
			last = detail
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(time.Second)
	}
}

// ctxT is a context for one test step.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// dumpOnFailure registers a cleanup that, when the test failed, prints what
// explains it: nodes, pods, events, ironlb's pod logs, mypc's neighbours and
// the nat rules of the nodes named by nodes() (the announcers).
func dumpOnFailure(t testing.TB, e *Env, nodes func() []string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var b strings.Builder
		labctl.DumpCluster(ctx, e.CS, &b)
		var l2 v1beta1.ServiceL2StatusList
		if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err == nil {
			fmt.Fprintln(&b, "---- servicel2statuses")
			for _, s := range l2.Items {
				fmt.Fprintf(&b, "%s %s/%s node=%s owner=%v conditions=%v\n", s.Name, s.Status.ServiceNamespace, s.Status.ServiceName, s.Status.Node, ownerNames(s.OwnerReferences), s.Status.Conditions)
			}
		}
		var svcs corev1.ServiceList
		if err := e.C.List(ctx, &svcs); err == nil {
			fmt.Fprintln(&b, "---- services")
			for _, s := range svcs.Items {
				fmt.Fprintf(&b, "%s/%s type=%s ingress=%v annotations=%v\n", s.Namespace, s.Name, s.Spec.Type, s.Status.LoadBalancer.Ingress, s.Annotations)
			}
		}
		var pods corev1.PodList
		if err := e.C.List(ctx, &pods, client.InNamespace(Namespace)); err == nil {
			for _, p := range pods.Items {
				fmt.Fprintf(&b, "---- logs %s/%s (node %s, last 40 lines)\n%s\n", p.Namespace, p.Name, p.Spec.NodeName, tailLines(e.podLogs(ctx, p.Namespace, p.Name), 40))
			}
		}
		if r, err := e.Hosts.Run(ctx, ClientHost, "ip", "neigh", "show"); err == nil {
			fmt.Fprintf(&b, "---- %s: ip neigh\n%s", ClientHost, r.Stdout)
		}
		if nodes != nil {
			for _, n := range nodes() {
				for _, save := range []string{"iptables-save", "ip6tables-save"} {
					r, err := e.Hosts.Run(ctx, n, save, "-t", "nat")
					if err != nil {
						continue
					}
					fmt.Fprintf(&b, "---- %s: %s -t nat (KUBE-SERVICES, KUBE-EXT, KUBE-SVC lines)\n", n, save)
					for _, line := range strings.Split(r.Stdout, "\n") {
						if strings.Contains(line, "KUBE-EXT") || strings.Contains(line, "-A KUBE-SERVICES") || strings.Contains(line, "KUBE-SVC") {
							fmt.Fprintln(&b, line)
						}
					}
				}
			}
		}
		t.Logf("failure dump:\n%s", b.String())
	})
}

func ownerNames(refs []metav1.OwnerReference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Kind+"/"+r.Name)
	}
	return out
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// podLogs reads a pod's logs through the Hosts (the lab) or kubectl logs.
func (e *Env) podLogs(ctx context.Context, ns, name string) string {
	if pl, ok := e.Hosts.(PodLogger); ok {
		s, err := pl.PodLogs(ns, name)
		if err != nil {
			return fmt.Sprintf("(logs: %v)", err)
		}
		return s
	}
	out, err := e.kubectl(ctx, "", "logs", "-n", ns, name, "--all-containers", "--tail=200")
	if err != nil {
		return fmt.Sprintf("(logs: %v)", err)
	}
	return out
}

// client runs a shell command on the external client.
func (e *Env) client(ctx context.Context, script string) (Result, error) {
	return e.Hosts.Run(ctx, ClientHost, "sh", "-c", script)
}

// curlMany sends n requests from the client to ip, one connection each, and
// returns the Hostname lines seen (pod name -> count) and which requests
// (1-based) failed.
func (e *Env) curlMany(ctx context.Context, ip string, n int) (map[string]int, []int, error) {
	script := fmt.Sprintf(`for i in $(seq %d); do h=$(curl -s -m 2 %s | grep '^Hostname:'); if [ -n "$h" ]; then echo "$h"; else echo FAILED; fi; done`, n, serviceURL(ip))
	r, err := e.client(ctx, script)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]int{}
	var which []int
	for i, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if h, ok := strings.CutPrefix(line, "Hostname: "); ok {
			seen[strings.TrimSpace(h)]++
		} else {
			which = append(which, i+1)
		}
	}
	return seen, which, nil
}

// serviceURL is the URL of a Service IP's port 80, for IPv4 and IPv6 addresses.
func serviceURL(ip string) string {
	return "http://" + net.JoinHostPort(ip, "80") + "/"
}

// curlOnce reports whether one request from the client to ip succeeds, and
// the Hostname it returned.
func (e *Env) curlOnce(ctx context.Context, ip string) (string, bool) {
	r, err := e.client(ctx, fmt.Sprintf("curl -s -m 1 %s | grep '^Hostname:'", serviceURL(ip)))
	if err != nil || r.Code != 0 {
		return "", false
	}
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(r.Stdout), "Hostname:")), true
}

var lladdrRE = regexp.MustCompile(`lladdr ([0-9a-f:]{17})`)

// neighMAC returns the client's neighbour entry for ip ("" when none or
// without a link-layer address, e.g. FAILED/INCOMPLETE).
func (e *Env) neighMAC(ctx context.Context, ip string) (mac, line string, err error) {
	r, err := e.Hosts.Run(ctx, ClientHost, "ip", "neigh", "show", "to", ip)
	if err != nil {
		return "", "", err
	}
	line = strings.TrimSpace(r.Stdout)
	if m := lladdrRE.FindStringSubmatch(line); m != nil {
		return m[1], line, nil
	}
	return "", line, nil
}

// nodeMACs returns each node's MAC on the interface holding its InternalIP.
func (e *Env) nodeMACs(ctx context.Context) (map[string]string, error) {
	var nodes corev1.NodeList
	if err := e.C.List(ctx, &nodes); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		ip := nodeIP(&n)
		r, err := e.Hosts.Run(ctx, n.Name, "sh", "-c", fmt.Sprintf(`cat /sys/class/net/$(ip -o addr show to %s | awk '{print $2}' | head -1)/address`, ip))
		if err != nil {
			return nil, err
		}
		mac := strings.TrimSpace(r.Stdout)
		if r.Code != 0 || len(mac) != 17 {
			return nil, fmt.Errorf("node %s: MAC of the interface with %s: %q %q", n.Name, ip, r.Stdout, r.Stderr)
		}
		out[n.Name] = mac
	}
	return out, nil
}

// requireIPv6 skips a test on a cluster whose nodes have no IPv6 address (an IPv4-only
// lab or kind cluster); in CI the lab is dual-stack, so such a skip fails the run.
func (e *Env) requireIPv6(t testing.TB) {
	t.Helper()
	if e.hasIPv6(t) {
		return
	}
	t.Skip("the cluster is IPv4-only (no node has an IPv6 InternalIP); the lab is dual-stack unless LAB_IP_FAMILY=ipv4")
}

func nodeIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// ingressIP returns the Service's first ingress IP ("" when pending).
func (e *Env) ingressIP(ctx context.Context, ns, name string) (string, error) {
	var svc corev1.Service
	if err := e.C.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		return "", err
	}
	if len(svc.Status.LoadBalancer.Ingress) == 0 {
		return "", nil
	}
	return svc.Status.LoadBalancer.Ingress[0].IP, nil
}

// waitIngressIP waits for the Service's first ingress IP.
func (e *Env) waitIngressIP(t testing.TB, ns, name string) string {
	t.Helper()
	var ip string
	poll(t, 2*time.Minute, "an ingress IP on service "+ns+"/"+name, func() (bool, string) {
		var err error
		ip, err = e.ingressIP(context.Background(), ns, name)
		if err != nil {
			return false, err.Error()
		}
		return ip != "", "no ingress IP yet"
	})
	return ip
}

// announcers returns the nodes named by the ServiceL2Status objects of a Service.
func (e *Env) announcers(ctx context.Context, ns, name string) ([]string, error) {
	var l2 v1beta1.ServiceL2StatusList
	if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range l2.Items {
		if s.Status.ServiceName == name && s.Status.ServiceNamespace == ns {
			out = append(out, s.Status.Node)
		}
	}
	sort.Strings(out)
	return out, nil
}

// waitAnnouncer waits until exactly one ServiceL2Status names the Service and
// returns its node; if want is not "", it must be that node.
func (e *Env) waitAnnouncer(t testing.TB, ns, name, want string) string {
	t.Helper()
	var node string
	poll(t, 2*time.Minute, fmt.Sprintf("one ServiceL2Status for %s/%s (want node %q)", ns, name, want), func() (bool, string) {
		nodes, err := e.announcers(context.Background(), ns, name)
		if err != nil {
			return false, err.Error()
		}
		if len(nodes) != 1 || (want != "" && nodes[0] != want) {
			return false, fmt.Sprintf("announcers %v", nodes)
		}
		node = nodes[0]
		return true, ""
	})
	return node
}

// serviceEvents returns the events of a Service with reason, oldest first.
func (e *Env) serviceEvents(ctx context.Context, ns, name, reason string) ([]corev1.Event, error) {
	var evs corev1.EventList
	if err := e.C.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Kind == "Service" && ev.InvolvedObject.Name == name && (reason == "" || ev.Reason == reason) {
			out = append(out, ev)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return evTime(&out[i]).Before(evTime(&out[j])) })
	return out, nil
}

// evTime is when an event was last observed: a recorder using the events.k8s.io
// API folds a repeat into the first event's series (its eventTime stays the first).
func evTime(e *corev1.Event) time.Time {
	if e.Series != nil && !e.Series.LastObservedTime.IsZero() {
		return e.Series.LastObservedTime.Time
	}
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time, e.CreationTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// podNode returns the node a pod runs on.
func (e *Env) podNode(ctx context.Context, ns, name string) (string, error) {
	var p corev1.Pod
	if err := e.C.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		return "", err
	}
	return p.Spec.NodeName, nil
}

// poolAddr returns the n-th address of the walkthrough's pool (0 = .200).
func poolAddr(n int) string {
	a := netip.MustParseAddr("172.18.255.200")
	for range n {
		a = a.Next()
	}
	return a.String()
}

func atoiOr(s string, def int) int {
	if v, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
		return v
	}
	return def
}

func getenvInt(name string, def int) int { return atoiOr(os.Getenv(name), def) }
