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
	var podCIDR string
	fs := flag.NewFlagSet("lab-agent", flag.ExitOnError)
	fs.StringVar(&cfg.NodeName, "node-name", "", "name of the Node to register")
	fs.StringVar(&cfg.NodeIP, "node-ip", "", "the node's InternalIP")
	fs.StringVar(&podCIDR, "pod-cidr", "", "the node's pod CIDR (IPv4); pod addresses start at .2")
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
	if podCIDR != "" {
		p, err := netip.ParsePrefix(podCIDR)
		if err != nil {
			fmt.Fprintf(os.Stderr, "lab-agent: --pod-cidr %q: %v\n", podCIDR, err)
			os.Exit(2)
		}
		cfg.PodCIDR = p
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
