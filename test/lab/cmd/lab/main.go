// Command lab runs the ironlb lab: a real Kubernetes cluster in network namespaces (see
// package labctl). It only parses flags; the work is done by test/lab/labctl and labnet.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"

	"github.com/ironlb/ironlb/test/lab/labctl"
	"github.com/ironlb/ironlb/test/lab/labnet"
)

// exitError carries a command's exit code through cobra (lab exec).
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newRoot().ExecuteContext(ctx)
	var ee exitError
	if errors.As(err, &ee) {
		os.Exit(int(ee))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var root string
	lab := func() (*labctl.Lab, error) {
		dir := root
		if dir == "" {
			// The checkout we are run from; bin/ may be shared between checkouts (a symlink),
			// so the executable's location only serves when run from elsewhere.
			if r, err := labctl.FindRoot("."); err == nil {
				return labctl.New(r, os.Stdout), nil
			}
			exe, err := os.Executable()
			if err != nil {
				return nil, err
			}
			dir = filepath.Dir(exe)
		}
		r, err := labctl.FindRoot(dir)
		if err != nil {
			return nil, err
		}
		return labctl.New(r, os.Stdout), nil
	}
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "run a real Kubernetes cluster in network namespaces for ironlb's tests",
		Long: `lab brings up the walkthrough's cluster without a container engine: a control plane
(172.18.0.2) and workers (172.18.0.3...) as network namespaces on a bridge, real etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy, the lab's node agent
in place of the kubelet, and a client host mypc (172.18.0.100) on the same segment; with
--prometheus, a host "prometheus" (172.18.0.101) running Prometheus; with --dns, a host "dns"
(172.18.0.103) running BIND for the zone lb.lab and external-dns, which publishes annotated
LoadBalancer Services there; mypc and mypc2 resolve through it.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.PersistentFlags().StringVar(&root, "root", "", "repository root (default: found from bin/lab or the working directory)")

	var up labctl.UpOptions
	upCmd := &cobra.Command{
		Use:   "up",
		Short: "bring the lab up (reports the running lab if it is up already)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.Up(c.Context(), up)
		},
	}
	upCmd.Flags().IntVar(&up.Workers, "workers", labctl.DefaultWorkers, "number of worker nodes")
	upCmd.Flags().StringVar(&up.ServiceCIDR, "service-cidr", labnet.DefaultServiceSubnet.String(), "service CIDR (IPv4, /12 to /28); bigger than the default for thousands of Services")
	upCmd.Flags().StringVar(&up.IPFamily, "ip-family", labnet.FamilyDual, "IP family of nodes, pods and Services: dual (IPv4 and IPv6, like kind's network) or ipv4")
	upCmd.Flags().StringVar(&up.ProxyMode, "proxy-mode", labctl.ProxyIptables, "kube-proxy mode: iptables or nftables")
	upCmd.Flags().BoolVar(&up.NoAgent, "no-agent", false, "start no node agents (network and control plane only; for debugging the lab)")
	upCmd.Flags().DurationVar(&up.NodesTimeout, "nodes-timeout", 0, "how long to wait for the nodes to be Ready (default 90s)")
	upCmd.Flags().BoolVar(&up.Prometheus, "prometheus", os.Getenv("LAB_PROMETHEUS") == "1",
		"also run Prometheus on its own host (172.18.0.101:9090), scraping ironlb's pods (default from LAB_PROMETHEUS=1)")
	upCmd.Flags().BoolVar(&up.DNS, "dns", os.Getenv("LAB_DNS") == "1",
		"also run a DNS server (BIND, zone lb.lab) and external-dns on their own host (172.18.0.103); mypc resolves through it, and a LoadBalancer Service annotated external-dns.alpha.kubernetes.io/hostname=web.lb.lab. is published there (default from LAB_DNS=1)")

	var down labctl.DownOptions
	downCmd := &cobra.Command{
		Use:   "down",
		Short: "remove every namespace, link, process and file of the lab",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.Down(c.Context(), down)
		},
	}
	downCmd.Flags().BoolVar(&down.KeepLogs, "keep-logs", false, "keep .lab/logs")
	downCmd.Flags().BoolVar(&down.Force, "force", false, "remove the lab even if another checkout's lab owns it")

	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "show hosts, processes, memory and nodes",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.Status(c.Context())
		},
	}

	execCmd := &cobra.Command{
		Use:   "exec HOST -- CMD [ARGS...]",
		Short: "run a command on a lab host (mypc, mypc2, prometheus, dns or a node name) in its network namespace",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			code, err := l.Exec(c.Context(), args[0], args[1:], os.Stdin, os.Stdout, os.Stderr)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitError(code)
			}
			return nil
		},
	}

	killCmd := &cobra.Command{
		Use:   "kill-node NODE",
		Short: "crash a node: SIGKILL its processes and pods, take its link down",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.KillNode(c.Context(), args[0])
		},
	}
	restoreCmd := &cobra.Command{
		Use:   "restore-node NODE",
		Short: "bring a killed node back: link up, restart its processes",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.RestoreNode(c.Context(), args[0])
		},
	}

	var signal string
	stopCmd := &cobra.Command{
		Use:   "stop PROCESS",
		Short: "stop one lab process (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy-NODE, lab-agent-NODE) and wait until it has exited",
		Long: `stop sends the process its signal (TERM: a clean stop; KILL: a crash) and waits until it
has exited (SIGKILL after 30 s if TERM is not enough). Nothing restarts it: ` + "`lab start PROCESS`" + ` does,
as lab up started it. The e2e suite uses it to take the API server or etcd away while traffic runs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			sig, err := labctl.ParseSignal(signal)
			if err != nil {
				return err
			}
			l, err := lab()
			if err != nil {
				return err
			}
			return l.StopProcess(c.Context(), args[0], sig)
		},
	}
	stopCmd.Flags().StringVarP(&signal, "signal", "s", "TERM", "TERM or KILL")
	startCmd := &cobra.Command{
		Use:   "start PROCESS",
		Short: "start a stopped lab process as lab up does (waits until etcd is healthy, the API server ready)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.StartProcess(c.Context(), args[0])
		},
	}

	var container string
	logsCmd := &cobra.Command{
		Use:   "logs [NAMESPACE/]POD",
		Short: "print a pod's container logs (as written by the node agent)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			return l.Logs(args[0], container, os.Stdout)
		},
	}
	logsCmd.Flags().StringVarP(&container, "container", "c", "", "container name (default: all)")

	envCmd := &cobra.Command{
		Use:   "env",
		Short: "print the shell line that points kubectl at the lab",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			l, err := lab()
			if err != nil {
				return err
			}
			fmt.Printf("export KUBECONFIG=%s\n", l.Kubeconfig())
			return nil
		},
	}

	var fwd struct {
		fd     int
		listen string
		netns  string
		target string
	}
	forwardCmd := &cobra.Command{
		Use:    "forward",
		Short:  "relay TCP from the root namespace to an address inside a lab namespace (started by lab up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			target, err := netip.ParseAddrPort(fwd.target)
			if err != nil {
				return fmt.Errorf("--target %q: %w", fwd.target, err)
			}
			var lis net.Listener
			if fwd.fd > 0 {
				lis, err = net.FileListener(os.NewFile(uintptr(fwd.fd), "listener"))
			} else {
				lis, err = net.Listen("tcp", fwd.listen)
			}
			if err != nil {
				return fmt.Errorf("opening the listener: %w", err)
			}
			logger := funcr.New(func(prefix, args string) {
				fmt.Fprintln(os.Stderr, time.Now().UTC().Format(time.RFC3339), prefix, args)
			}, funcr.Options{})
			logger.Info("Relaying", "listen", lis.Addr().String(), "target", target.String(), "netns", fwd.netns)
			f := &labnet.Forwarder{NS: fwd.netns, Target: target, Log: logger}
			return f.Serve(c.Context(), lis)
		},
	}
	forwardCmd.Flags().IntVar(&fwd.fd, "listen-fd", 0, "inherited listening socket")
	forwardCmd.Flags().StringVar(&fwd.listen, "listen", "127.0.0.1:36443", "address to listen on when no --listen-fd is given")
	forwardCmd.Flags().StringVar(&fwd.netns, "netns", "", "network namespace to dial from")
	forwardCmd.Flags().StringVar(&fwd.target, "target", "", "address to dial, IP:PORT")

	cmd.AddCommand(upCmd, downCmd, statusCmd, execCmd, killCmd, restoreCmd, stopCmd, startCmd, logsCmd, envCmd, forwardCmd)
	return cmd
}
