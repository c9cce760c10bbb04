package labctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// hostNS resolves a host name (mypc, prometheus, dns, a node name, a lab namespace name or one of the lab's
// pod namespaces) to its namespace.
func (l *Lab) hostNS(host string) (string, error) {
	if labnet.IsLabNS(host) && labnet.NSExists(host) {
		return host, nil
	}
	if labnet.IsPodNS(host) {
		for _, ns := range l.PodNamespaces(context.Background()) {
			if ns == host {
				return ns, nil
			}
		}
	}
	ns := labnet.NSPrefix + host
	if labnet.IsLabNS(ns) && labnet.NSExists(ns) {
		return ns, nil
	}
	return "", fmt.Errorf("no lab host %q (namespace %s does not exist); hosts are mypc, mypc2, the node names, (lab up --prometheus) prometheus and (lab up --dns) dns, see `lab status`", host, ns)
}

// Command returns a command that runs argv on a lab host (see Exec).
func (l *Lab) Command(ctx context.Context, host string, argv ...string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command given")
	}
	ns, err := l.hostNS(host)
	if err != nil {
		return nil, err
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...), nil
}

// Exec runs argv in a lab host's network namespace with the given stdio and returns its exit
// code (the error is only for failures to run it at all).
func (l *Lab) Exec(ctx context.Context, host string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd, err := l.Command(ctx, host, argv...)
	if err != nil {
		return 0, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("running %v on %s: %w", argv, host, err)
	}
	return 0, nil
}

// node returns the topology host for a node name.
func (l *Lab) node(name string) (*labnet.Topology, labnet.Host, error) {
	topo, err := l.Topology()
	if err != nil {
		return nil, labnet.Host{}, err
	}
	h, ok := topo.Host(name)
	if !ok || !h.Node {
		var names []string
		for _, n := range topo.Nodes() {
			names = append(names, n.Name)
		}
		return nil, labnet.Host{}, fmt.Errorf("no node %q in the lab (nodes: %s)", name, strings.Join(names, ", "))
	}
	return topo, h, nil
}

// KillNode crashes a node hard: SIGKILL to every process in its namespace and their
// descendants (its pods), then its link goes down on both ends.
func (l *Lab) KillNode(ctx context.Context, name string) error {
	topo, h, err := l.node(name)
	if err != nil {
		return err
	}
	pids, err := labnet.NSPids(ctx, h.NS())
	if err != nil {
		return err
	}
	victims := uniq(append(pids, descendants(pids)...))
	if left := killAll(victims); len(left) > 0 {
		return fmt.Errorf("processes of %s still alive after SIGKILL: %v", name, left)
	}
	if err := topo.DisconnectHost(ctx, h); err != nil {
		return err
	}
	l.printf("killed %d processes of %s and took its link down\n", len(victims), name)
	return nil
}

// RestoreNode reconnects a node and restarts its processes (for the control-plane node, the
// control plane too).
func (l *Lab) RestoreNode(ctx context.Context, name string) error {
	topo, h, err := l.node(name)
	if err != nil {
		return err
	}
	if err := topo.ConnectHost(ctx, h); err != nil {
		return err
	}
	procs := l.nodeProcs(topo, h)
	if h.ControlPlane {
		procs = append(l.controlPlaneProcs(topo), procs...)
	}
	running := map[string]bool{}
	infos, _ := l.Procs()
	for _, p := range infos {
		running[p.Name] = p.Alive
	}
	var started []string
	for _, p := range procs {
		if running[p.Name] {
			continue
		}
		if _, err := os.Stat(l.pidFile(p.Name)); err != nil && strings.HasPrefix(p.Name, "lab-agent-") {
			continue // the lab runs without agents (lab up --no-agent)
		}
		if err := l.startAndWait(ctx, p); err != nil {
			return err
		}
		started = append(started, p.Name)
	}
	l.printf("restored %s: link up, started %s\n", name, strings.Join(started, ", "))
	return nil
}

// Logs copies a pod's container logs (written by the node agents) to w. pod is NAME or
// NAMESPACE/NAME; container "" means all containers of the pod.
func (l *Lab) Logs(pod, container string, w io.Writer) error {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		ns, name = "default", pod
	}
	c := container
	if c == "" {
		c = "*"
	}
	files, err := filepath.Glob(filepath.Join(l.PodLogDir(), fmt.Sprintf("%s_%s_%s.log", ns, name, c)))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no logs for pod %s/%s (container %q) in %s", ns, name, container, l.PodLogDir())
	}
	sort.Strings(files)
	for _, f := range files {
		if len(files) > 1 {
			if _, err := fmt.Fprintf(w, "==> %s <==\n", filepath.Base(f)); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// Status prints the lab's hosts, processes (with memory) and nodes.
func (l *Lab) Status(ctx context.Context) error {
	st, err := l.ReadState()
	if err != nil {
		return err
	}
	nss, _ := labnet.LabNamespaces(ctx)
	if other := l.otherOwner(ctx); other != "" {
		l.printf("The lab on this machine belongs to the checkout %s: run `bin/lab status` there.\n", other)
		return nil
	}
	if st == nil && len(nss) == 0 {
		l.printf("No lab is running. Start one with `make lab-up`.\n")
		return nil
	}
	topo, err := l.Topology()
	if err != nil {
		return err
	}
	var rows strings.Builder
	fmt.Fprintln(&rows, "HOST\tNAMESPACE\tIPS\tMAC\tPOD CIDRS\tLINK")
	for _, h := range topo.Hosts {
		link := "missing"
		if labnet.NSExists(h.NS()) {
			out, err := labnet.IP(ctx, "-n", h.NS(), "-br", "link", "show", "dev", labnet.HostIf)
			if f := strings.Fields(out); err == nil && len(f) > 1 {
				link = f[1]
			}
		}
		cidr := "-"
		if h.Node {
			cidr = labnet.Join(h.PodCIDRs())
		}
		fmt.Fprintf(&rows, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.NS(), labnet.Join(h.IPs()), h.MAC, cidr, link)
	}
	l.printTable(rows.String())

	procs, _ := l.Procs()
	l.printf("\n")
	rows.Reset()
	fmt.Fprintln(&rows, "PROCESS\tPID\tSTATE\tRSS")
	var pids []int
	for _, p := range procs {
		state, rss := "dead", "-"
		if p.Alive {
			state, rss = "running", fmt.Sprintf("%d MiB", p.RSSKB/1024)
			pids = append(pids, p.Pid)
		}
		fmt.Fprintf(&rows, "%s\t%d\t%s\t%s\n", p.Name, p.Pid, state, rss)
	}
	l.printTable(rows.String())
	// Memory of everything the lab runs: its processes, whatever else runs in its
	// namespaces, and descendants (pods).
	for _, ns := range nss {
		p, _ := labnet.NSPids(ctx, ns)
		pids = append(pids, p...)
	}
	pids = uniq(append(pids, descendants(pids)...))
	var total int64
	for _, p := range pids {
		total += rssKB(p)
	}
	l.printf("total: %d processes, %d MiB resident\n", len(pids), total/1024)

	if st == nil {
		return nil
	}
	l.printf("\nkubeconfig: %s (API server via %s)\n", l.Kubeconfig(), st.ForwardAddr)
	c, err := l.Client()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nodes, err := c.CoreV1().Nodes().List(cctx, metav1.ListOptions{})
	if err != nil {
		l.printf("API server unreachable: %v\n", err)
		return nil
	}
	rows.Reset()
	fmt.Fprintln(&rows, "NODE\tREADY\tINTERNAL-IPS\tPOD CIDRS\tROLES")
	for i := range nodes.Items {
		n := &nodes.Items[i]
		var ips []string
		for _, a := range n.Status.Addresses {
			if a.Type == "InternalIP" {
				ips = append(ips, a.Address)
			}
		}
		role := "<none>"
		if _, ok := n.Labels[ControlPlaneRole]; ok {
			role = "control-plane"
		}
		fmt.Fprintf(&rows, "%s\t%v\t%s\t%s\t%s\n", n.Name, NodeReady(n), strings.Join(ips, ","), strings.Join(n.Spec.PodCIDRs, ","), role)
	}
	l.printTable(rows.String())
	if len(nodes.Items) == 0 {
		l.printf("no nodes registered\n")
	}
	l.printf(`
Next steps:
  export KUBECONFIG=%s      (or: eval "$(bin/lab env)")
  kubectl get nodes -o wide
  bin/lab exec mypc -- curl -s http://<node-ip>:<nodePort>/
  make lab-down
`, l.Kubeconfig())
	return nil
}
