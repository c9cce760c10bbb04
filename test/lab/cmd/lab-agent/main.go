// Command lab-agent is the lab's node agent, a stand-in for the kubelet; see
// package test/lab/agent. `lab-agent pod-exec ...` is the helper it runs
// pod processes through.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr/funcr"

	"github.com/ironlb/ironlb/test/lab/agent"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pod-exec" {
		err := agent.PodExecMain(os.Args[2:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	var cfg agent.Config
	var nodeIPs, podCIDRs string
	fs := flag.NewFlagSet("lab-agent", flag.ExitOnError)
	fs.StringVar(&cfg.NodeName, "node-name", "", "name of the Node to register")
	fs.StringVar(&nodeIPs, "node-ip", "", "the node's InternalIP: IPv4, or IPv4,IPv6 for a dual-stack node")
	fs.StringVar(&podCIDRs, "pod-cidr", "", "the node's pod CIDR: IPv4, or IPv4,IPv6 for a dual-stack node; pod addresses start at .2 (::2)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig for the API server")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory for the agent's state (IP allocations, pod volumes, pidfiles)")
	fs.StringVar(&cfg.NetNS, "netns", "", "the node's network namespace (pod veths and hostNetwork pods go there)")
	fs.StringVar(&cfg.Images, "images", "", "image table file (YAML or JSON): image repository -> program and default args")
	fs.BoolVar(&cfg.ControlPlane, "control-plane", false, "label and taint the node as a control-plane node")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "directory for container logs (default <state-dir>/../logs/pods)")
	fs.IntVar(&cfg.KubeletPort, "kubelet-port", 10250, "HTTPS port for the kubelet endpoint (kubectl logs)")
	fs.StringVar(&cfg.KubernetesServiceHost, "kubernetes-service-host", "10.200.1.1", "KUBERNETES_SERVICE_HOST when the default/kubernetes Service cannot be read")
	verbosity := fs.Int("v", 0, "log verbosity")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: a bad flag exits

	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(os.Stderr, obj) }, funcr.Options{LogTimestamp: true, Verbosity: *verbosity})
	cfg.Log = log
	if err := parseFamilies(&cfg, nodeIPs, podCIDRs); err != nil {
		fmt.Fprintf(os.Stderr, "lab-agent: %v\n", err)
		os.Exit(2)
	}
	a, err := agent.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lab-agent: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := a.Run(ctx); err != nil {
		log.Error(err, "Agent failed")
		os.Exit(1)
	}
}

// parseFamilies reads the dual-stack pairs of --node-ip and --pod-cidr into cfg: the first
// entry is the primary (IPv4) one, an optional second one the IPv6 one.
func parseFamilies(cfg *agent.Config, nodeIPs, podCIDRs string) error {
	ips := strings.Split(nodeIPs, ",")
	cfg.NodeIP = ips[0]
	if len(ips) > 2 {
		return fmt.Errorf("--node-ip %q: at most one IPv4 and one IPv6 address", nodeIPs)
	}
	if len(ips) == 2 {
		cfg.NodeIP6 = ips[1]
	}
	if podCIDRs == "" {
		return nil
	}
	cidrs := strings.Split(podCIDRs, ",")
	if len(cidrs) > 2 {
		return fmt.Errorf("--pod-cidr %q: at most one IPv4 and one IPv6 prefix", podCIDRs)
	}
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("--pod-cidr %q: %w", podCIDRs, err)
		}
		if p.Addr().Is4() != (i == 0) {
			return fmt.Errorf("--pod-cidr %q: the first prefix must be IPv4 and the second IPv6", podCIDRs)
		}
		if i == 0 {
			cfg.PodCIDR = p
		} else {
			cfg.PodCIDR6 = p
		}
	}
	return nil
}
