// Package lab_test is the lab's smoke test: it brings the lab up with bin/lab, checks that the
// cluster does what the walkthrough needs (nodes, pods, ClusterIP and NodePort Services of
// both families, kube-proxy's chains in iptables and nftables mode) and that `lab down`
// leaves nothing behind.
package lab_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ironlb/ironlb/test/lab/labctl"
	"github.com/ironlb/ironlb/test/lab/labnet"
	"github.com/ironlb/ironlb/test/procstat"
)

const (
	smokeNS   = "default"
	whoamiApp = "lab-smoke-whoami"
)

func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the lab smoke test needs root (network namespaces, iptables); run `sudo make test-lab`")
	}
	root, err := labctl.FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	l := labctl.New(root, &testWriter{t: t})
	if err := l.CheckKubeBinaries(); err != nil {
		t.Skipf("the lab smoke test needs the Kubernetes binaries: %v", err)
	}
	for _, pkg := range []string{"test/lab/cmd/lab-agent", "test/lab/cmd/lab-whoami"} {
		if _, err := os.Stat(filepath.Join(root, pkg)); err != nil {
			t.Skipf("the lab smoke test needs the node agent (%s is not in this checkout)", pkg)
		}
	}
	if st, _ := l.ReadState(); st != nil && st.Ready && l.Healthy(context.Background()) == nil {
		t.Skip("a lab is running; the smoke test brings its own up and down: run `make lab-down` first")
	}

	labBin := filepath.Join(root, "bin", "lab")
	run(t, root, "go", "build", "-o", labBin, "./test/lab/cmd/lab")

	// Both kube-proxy modes, each a dual-stack lab of its own; LAB_PROXY_MODE=iptables or
	// nftables runs one.
	modes := []string{labctl.ProxyIptables, labctl.ProxyNftables}
	if m := os.Getenv("LAB_PROXY_MODE"); m != "" {
		modes = []string{m}
	}
	for _, mode := range modes {
		if !t.Run(mode, func(t *testing.T) { smoke(t, root, l, labBin, mode) }) {
			return // the failed lab was torn down; the next mode would only repeat the failure
		}
	}
}

// smoke brings a lab up with kube-proxy in mode, checks it and takes it down.
func smoke(t *testing.T, root string, l *labctl.Lab, labBin, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	upOut, upErr := command(root, labBin, "up", "--proxy-mode", mode)
	t.Logf("lab up (%.1fs):\n%s", time.Since(start).Seconds(), upOut)

	var client kubernetes.Interface // set once the lab is up, for the failure dump
	down := func(keepLogs bool) {
		args := []string{"down"}
		if keepLogs {
			args = append(args, "--keep-logs")
		}
		out, err := command(root, labBin, args...)
		t.Logf("lab %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Errorf("lab down: %v", err)
		}
	}
	// On failure explain it, then tear down keeping the logs.
	defer func() {
		if !t.Failed() {
			return
		}
		var buf bytes.Buffer
		if client != nil {
			dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
			labctl.DumpCluster(dctx, client, &buf)
			dcancel()
		}
		dumpLogs(&buf, l.LogDir())
		t.Logf("state of the failed lab:\n%s", buf.String())
		down(true)
	}()
	if upErr != nil {
		t.Fatalf("lab up: %v", upErr)
	}
	client, err := l.Client()
	if err != nil {
		t.Fatal(err)
	}
	topo, err := l.Topology()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("NodesReady", func(t *testing.T) {
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready != 4 {
			t.Fatalf("%d of %d nodes Ready, want 4", ready, len(nodes.Items))
		}
	})

	replicas := int32(2)
	labels := map[string]string{"app": whoamiApp}
	_, err = client.AppsV1().Deployments(smokeNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: whoamiApp},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "whoami", Image: "traefik/whoami",
					Ports: []corev1.ContainerPort{{ContainerPort: 80}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}}, PeriodSeconds: 1},
				}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	poll(t, ctx, 120*time.Second, "2 whoami pods Running and Ready", func() (bool, string) {
		list, err := client.CoreV1().Pods(smokeNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + whoamiApp})
		if err != nil {
			return false, err.Error()
		}
		pods = nil
		var states []string
		for _, p := range list.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			states = append(states, fmt.Sprintf("%s %s ready=%v ip=%s", p.Name, p.Status.Phase, ready, p.Status.PodIP))
			if p.Status.Phase == corev1.PodRunning && ready && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == 2, strings.Join(states, "; ")
	})

	requireDualStack := corev1.IPFamilyPolicyRequireDualStack
	svc := func(name string, typ corev1.ServiceType) *corev1.Service {
		s, err := client.CoreV1().Services(smokeNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			// Both families: the lab is dual-stack, so kube-proxy must program both.
			Spec: corev1.ServiceSpec{Type: typ, Selector: labels, IPFamilyPolicy: &requireDualStack,
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	clusterIP := svc("lab-smoke-clusterip", corev1.ServiceTypeClusterIP)
	nodePort := svc("lab-smoke-nodeport", corev1.ServiceTypeNodePort)

	t.Run("ClusterIPFromNode", func(t *testing.T) {
		url := fmt.Sprintf("http://%s/", clusterIP.Spec.ClusterIP)
		pollHostname(t, ctx, l, "myk8s-worker", url)
	})
	t.Run("ClusterIPFromPod", func(t *testing.T) {
		// The pod's own namespace is the agent's ilb-p-* namespace holding its IP.
		ns := podNamespace(t, ctx, l, pods[0].Status.PodIP)
		url := fmt.Sprintf("http://%s/", clusterIP.Spec.ClusterIP)
		pollHostname(t, ctx, l, ns, url)
	})
	t.Run("NodePortFromMypc", func(t *testing.T) {
		worker, _ := topo.Host("myk8s-worker2")
		url := fmt.Sprintf("http://%s:%d/", worker.IP, nodePort.Spec.Ports[0].NodePort)
		pollHostname(t, ctx, l, labnet.ClientName, url)
	})
	t.Run("IPv6", func(t *testing.T) {
		if len(clusterIP.Spec.ClusterIPs) != 2 || len(pods[0].Status.PodIPs) != 2 {
			t.Fatalf("not dual-stack: ClusterIPs %v, pod IPs %v", clusterIP.Spec.ClusterIPs, pods[0].Status.PodIPs)
		}
		ns := podNamespace(t, ctx, l, pods[0].Status.PodIP)
		pollHostname(t, ctx, l, ns, fmt.Sprintf("http://[%s]/", clusterIP.Spec.ClusterIPs[1]))
		worker, _ := topo.Host("myk8s-worker2")
		pollHostname(t, ctx, l, labnet.ClientName, fmt.Sprintf("http://[%s]:%d/", worker.IP6, nodePort.Spec.Ports[0].NodePort))
		// Pod to pod across nodes over IPv6 (the lab's direct routes).
		pollHostname(t, ctx, l, ns, fmt.Sprintf("http://[%s]/", pods[1].Status.PodIPs[1].IP))
	})
	t.Run("KubeProxyRules", func(t *testing.T) {
		// iptables: KUBE-SERVICES has a rule commented with the Service's name; nftables:
		// the service-ips map has its ClusterIP.
		// Each family: ip6tables' KUBE-SERVICES and nftables' ip6 table for the IPv6 ClusterIP.
		type check struct {
			list []string
			want string
		}
		checks := []check{
			{labctl.KubeProxyRulesCommand(mode), smokeNS + "/lab-smoke-clusterip"},
			{[]string{"ip6tables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"}, clusterIP.Spec.ClusterIPs[len(clusterIP.Spec.ClusterIPs)-1] + "/128"},
		}
		if mode == labctl.ProxyNftables {
			checks = []check{
				{[]string{"nft", "list", "map", "ip", "kube-proxy", "service-ips"}, clusterIP.Spec.ClusterIP + " "},
				{[]string{"nft", "list", "map", "ip6", "kube-proxy", "service-ips"}, clusterIP.Spec.ClusterIPs[len(clusterIP.Spec.ClusterIPs)-1] + " "},
			}
		}
		for _, n := range topo.Nodes() {
			for _, c := range checks {
				poll(t, ctx, 30*time.Second, fmt.Sprintf("kube-proxy rules for the smoke Service on %s (%s)", n.Name, strings.Join(c.list, " ")), func() (bool, string) {
					out, err := command(root, "ip", append([]string{"netns", "exec", n.NS()}, c.list...)...)
					return err == nil && strings.Contains(out, c.want), out
				})
			}
		}
	})
	t.Run("SecondUpReportsRunningLab", func(t *testing.T) {
		out, err := command(root, labBin, "up", "--proxy-mode", mode)
		if err != nil || !strings.Contains(out, "already running") {
			t.Errorf("second lab up: %v\n%s", err, out)
		}
	})
	t.Run("KillAndRestoreNode", func(t *testing.T) {
		node, _ := topo.Host("myk8s-worker3")
		run(t, root, labBin, "kill-node", node.Name)
		if pids, _ := labnet.NSPids(ctx, node.NS()); len(pids) > 0 {
			t.Errorf("processes left in %s after kill-node: %v", node.NS(), pids)
		}
		if out, _ := labnet.IP(ctx, "-n", node.NS(), "-br", "link", "show", "eth0"); !strings.Contains(out, "DOWN") {
			t.Errorf("eth0 of %s after kill-node: %s", node.Name, out)
		}
		run(t, root, labBin, "restore-node", node.Name)
		url := fmt.Sprintf("http://%s:%d/", node.IP, nodePort.Spec.Ports[0].NodePort)
		pollHostname(t, ctx, l, labnet.ClientName, url)
	})
	if t.Failed() {
		return
	}

	// Everything the lab runs, to check that down leaves no process behind.
	labPids := labProcesses(t, ctx, l)
	podNSs := l.PodNamespaces(ctx)
	if len(podNSs) < 2 {
		t.Errorf("found %d pod namespaces of the lab (%v), want at least the 2 whoami pods'", len(podNSs), podNSs)
	}
	down(false)
	t.Run("DownLeavesNothing", func(t *testing.T) {
		if nss, _ := labnet.LabNamespaces(ctx); len(nss) > 0 {
			t.Errorf("namespaces left: %v", nss)
		}
		for _, ns := range podNSs {
			if labnet.NSExists(ns) {
				t.Errorf("pod namespace %s left", ns)
			}
		}
		if links, _ := labnet.RootLinks(ctx); len(links) > 0 {
			t.Errorf("links left in the root namespace: %v", links)
		}
		for _, p := range labPids {
			if st, err := procstat.Read(p); err == nil && st.State != "Z" {
				t.Errorf("process %d still running: %+v", p, st)
			}
		}
		if _, err := os.Stat(l.StateDir()); err == nil {
			t.Errorf("%s still exists", l.StateDir())
		}
	})
}

// pollHostname curls url from a lab host until a whoami pod answers.
func pollHostname(t *testing.T, ctx context.Context, l *labctl.Lab, host, url string) {
	t.Helper()
	poll(t, ctx, 60*time.Second, fmt.Sprintf("whoami answering %s from %s", url, host), func() (bool, string) {
		var out, errOut bytes.Buffer
		code, err := l.Exec(ctx, host, []string{"curl", "-sS", "--max-time", "3", url}, nil, &out, &errOut)
		if err != nil {
			return false, err.Error()
		}
		return code == 0 && strings.Contains(out.String(), "Hostname: "+whoamiApp), fmt.Sprintf("exit %d: %s%s", code, out.String(), errOut.String())
	})
}

// podNamespace finds the pod network namespace that holds ip.
func podNamespace(t *testing.T, ctx context.Context, l *labctl.Lab, ip string) string {
	t.Helper()
	nss := l.PodNamespaces(ctx)
	for _, ns := range nss {
		out, _ := labnet.IP(ctx, "-n", ns, "-br", "addr")
		if strings.Contains(out, " "+ip+"/") {
			return ns
		}
	}
	t.Fatalf("no pod namespace holds %s (namespaces: %v)", ip, nss)
	return ""
}

// labProcesses lists every process of the lab: pid files and everything in its namespaces.
func labProcesses(t *testing.T, ctx context.Context, l *labctl.Lab) []int {
	var pids []int
	procs, err := l.Procs()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.Alive {
			pids = append(pids, p.Pid)
		}
	}
	nss, _ := labnet.LabNamespaces(ctx)
	for _, ns := range append(nss, l.PodNamespaces(ctx)...) {
		p, _ := labnet.NSPids(ctx, ns)
		pids = append(pids, p...)
	}
	if len(pids) == 0 {
		t.Fatal("found no lab process while the lab is up")
	}
	return pids
}

func poll(t *testing.T, ctx context.Context, timeout time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, state := f()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func command(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func run(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	if out, err := command(dir, name, args...); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// dumpLogs appends the last lines of every lab process log.
func dumpLogs(buf *bytes.Buffer, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	pods, _ := filepath.Glob(filepath.Join(dir, "pods", "*.log"))
	for _, f := range append(files, pods...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		fmt.Fprintf(buf, "---- %s (last %d lines)\n%s\n", f, len(lines), strings.Join(lines, "\n"))
	}
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
