package labctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// UpOptions configure Lab.Up.
type UpOptions struct {
	// Workers is the number of worker nodes (the walkthrough has 3).
	Workers int
	// NoAgent starts no node agents: only the network and the control plane come up and no
	// node registers. For debugging the lab itself.
	NoAgent bool
	// ProxyMode is kube-proxy's mode: ProxyIptables (default, as the walkthrough) or
	// ProxyNftables.
	ProxyMode string
	// NodesTimeout bounds the wait for every node to be Ready (default 90 s).
	NodesTimeout time.Duration
	// ServiceCIDR is the service CIDR ("": labnet.DefaultServiceSubnet); a
	// bigger one makes room for thousands of Services (bench-failover-scale).
	ServiceCIDR string
	// IPFamily is labnet.FamilyDual (""; the default) or labnet.FamilyIPv4.
	IPFamily string
	// Prometheus also runs Prometheus on its own host (labnet.PrometheusName), scraping
	// ironlb's pods (see startPrometheus). Asked of a running lab without it, it is added.
	Prometheus bool
	// DNS also runs the DNS host (labnet.DNSName): BIND authoritative for DNSZone and
	// external-dns publishing LoadBalancer Services there; mypc and mypc2 resolve through
	// it (see startDNS). Asked of a running lab without it, it is added.
	DNS bool
}

// Up brings the lab up. If a complete lab with the same worker count is running, it only
// reports it; leftovers of a crashed run are removed first.
func (l *Lab) Up(ctx context.Context, opts UpOptions) error {
	start := time.Now()
	if opts.NodesTimeout == 0 {
		opts.NodesTimeout = 90 * time.Second
	}
	switch opts.ProxyMode {
	case "":
		opts.ProxyMode = ProxyIptables
	case ProxyIptables, ProxyNftables:
	default:
		return fmt.Errorf("kube-proxy mode %q: the lab runs %q or %q", opts.ProxyMode, ProxyIptables, ProxyNftables)
	}
	topo, err := labnet.NewWithPrefix(opts.Workers, labnet.NSPrefix, opts.IPFamily)
	if err != nil {
		return err
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = labnet.DefaultServiceSubnet.String()
	}
	if topo.ServiceSubnet, err = labnet.ParseServiceSubnet(opts.ServiceCIDR); err != nil {
		return err
	}
	if opts.Prometheus {
		topo.AddPrometheus()
	}
	if opts.DNS {
		topo.AddDNS()
	}
	if err := l.EnsurePrerequisites(ctx); err != nil {
		return err
	}
	if err := l.CheckKubeBinaries(); err != nil {
		return err
	}

	if other := l.otherOwner(ctx); other != "" {
		return errOtherOwner(other, "not starting a second one")
	}
	st, err := l.ReadState()
	if err != nil {
		return err
	}
	if st != nil && st.Ready {
		herr := l.Healthy(ctx)
		if herr == nil {
			if st.Workers != opts.Workers || (st.ProxyMode != "" && st.ProxyMode != opts.ProxyMode) || st.serviceSubnet() != topo.ServiceSubnet || st.ipFamily() != topo.Family {
				return fmt.Errorf("a lab with %d workers, kube-proxy in %s mode, service CIDR %s and IP family %s is running; run `make lab-down` (or `bin/lab down`) first to start one with %d workers, %s mode, service CIDR %s and IP family %s",
					st.Workers, st.ProxyMode, st.serviceSubnet(), st.ipFamily(), opts.Workers, opts.ProxyMode, topo.ServiceSubnet, topo.Family)
			}
			l.printf("The lab is already running (since %s).\n\n", st.StartedAt.Local().Format(time.Kitchen))
			if opts.Prometheus && !st.Prometheus {
				if err := l.addPrometheus(ctx, topo, st); err != nil {
					return err
				}
			}
			if opts.DNS && (!st.DNS || !l.DNSRunning()) {
				if err := l.addDNS(ctx, topo, st); err != nil {
					return err
				}
			}
			return l.Status(ctx)
		}
		l.printf("The recorded lab is not healthy (%v); recreating it.\n", herr)
	}
	if l.hasLeftovers(ctx) {
		done := l.step("removing leftovers of a previous lab")
		if err := l.Down(ctx, DownOptions{KeepLogs: true, Quiet: true}); err != nil {
			return fmt.Errorf("cleaning up the previous lab: %w", err)
		}
		done()
	}
	// Logs of the previous run would mix with this one's.
	if err := os.RemoveAll(l.LogDir()); err != nil {
		return err
	}

	if err := l.BuildPrograms(ctx, opts.NoAgent); err != nil {
		return err
	}
	if err := l.claimOwner(); err != nil {
		return err
	}
	if err := l.up(ctx, topo, opts); err != nil {
		l.printf("\nlab up failed: %v\n", err)
		l.reportDeadProcs()
		l.printf("\nLogs are in %s. Fix the cause, then run `make lab-up` again (it cleans up first),\nor `make lab-down` to remove everything.\n", l.LogDir())
		return err
	}
	l.printf("\nLab up in %.1fs.\n\n", time.Since(start).Seconds())
	return l.Status(ctx)
}

func (l *Lab) up(ctx context.Context, topo *labnet.Topology, opts UpOptions) error {
	done := l.step("creating network namespaces: %s, %d nodes, %s and %s", labnet.SwitchNS, len(topo.Nodes()), labnet.ClientName, labnet.SecondClientName)
	if err := os.MkdirAll(l.StateDir(), 0o755); err != nil {
		return err
	}
	if err := l.raiseNeighbourLimits(topo.ServiceSubnet); err != nil {
		return err
	}
	if err := topo.Build(ctx); err != nil {
		return err
	}
	if err := checkIptables(ctx, topo.ControlPlane().NS()); err != nil {
		return err
	}
	done()

	done = l.step("generating certificates and kubeconfigs")
	lis, err := listenForwarder()
	if err != nil {
		return err
	}
	hostServer := "https://" + lis.Addr().String()
	if err := l.writePKI(topo, hostServer); err != nil {
		_ = lis.Close() // the error above is the one to report
		return err
	}
	if err := l.writeImageTable(); err != nil {
		_ = lis.Close() // the error above is the one to report
		return err
	}
	state := &State{Workers: opts.Workers, ProxyMode: opts.ProxyMode, ServiceCIDR: topo.ServiceSubnet.String(), IPFamily: topo.Family, ForwardAddr: lis.Addr().String(),
		StartedAt: time.Now(), Prometheus: opts.Prometheus, DNS: opts.DNS}
	if err := l.writeState(state); err != nil {
		_ = lis.Close() // the error above is the one to report
		return err
	}
	done()

	done = l.step("starting the API forwarder on %s", lis.Addr())
	err = l.startForwarder(lis, topo)
	_ = lis.Close() // the forwarder has its own copy
	if err != nil {
		return err
	}
	done()

	done = l.step("starting etcd and kube-apiserver in %s", topo.ControlPlane().NS())
	cp := l.controlPlaneProcs(topo)
	for _, p := range cp[:2] {
		if err := l.startAndWait(ctx, p); err != nil {
			return err
		}
	}
	client, err := l.Client()
	if err != nil {
		return err
	}
	done()

	done = l.step("starting kube-controller-manager, kube-scheduler, and kube-proxy + lab-agent on every node")
	for _, p := range cp[2:] {
		if _, err := l.start(p); err != nil {
			return err
		}
	}
	for _, n := range topo.Nodes() {
		for _, p := range l.nodeProcs(topo, n) {
			if opts.NoAgent && strings.HasPrefix(p.Name, "lab-agent-") {
				continue
			}
			if _, err := l.start(p); err != nil {
				return err
			}
		}
	}
	done()

	if !opts.NoAgent {
		done = l.step("waiting for %d nodes to be Ready", len(topo.Nodes()))
		var names []string
		for _, n := range topo.Nodes() {
			names = append(names, n.Name)
		}
		nctx, cancel := context.WithTimeout(ctx, opts.NodesTimeout)
		err = l.waitNodesReady(nctx, client, names)
		cancel()
		if err != nil {
			return err
		}
		if err := ensureControlPlaneRole(ctx, client, topo.ControlPlane().Name); err != nil {
			return err
		}
		done()
	}

	done = l.step("waiting for the default service account")
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = waitDefaultServiceAccount(sctx, client)
	cancel()
	if err != nil {
		return err
	}
	done()

	done = l.step("waiting for kube-proxy's service rules (%s) on every node", opts.ProxyMode)
	if err := waitKubeProxyRules(ctx, topo, opts.ProxyMode); err != nil {
		return err
	}
	done()

	if opts.Prometheus {
		done = l.step("starting Prometheus on %s (%s)", labnet.PrometheusName, PrometheusURL())
		if err := l.startPrometheus(ctx, topo, client); err != nil {
			return err
		}
		done()
	}

	if opts.DNS {
		done = l.step("starting named and external-dns on %s (%s, zone %s)", labnet.DNSName, DNSServer(), DNSZone)
		if err := l.startDNS(ctx, topo, client); err != nil {
			return err
		}
		done()
	}

	state.Ready = true
	return l.writeState(state)
}

// addPrometheus adds the monitoring host and Prometheus to a running lab.
func (l *Lab) addPrometheus(ctx context.Context, topo *labnet.Topology, st *State) error {
	return l.addHost(ctx, topo, st, labnet.PrometheusName, fmt.Sprintf("Prometheus (%s)", PrometheusURL()),
		l.startPrometheus, func(s *State) { s.Prometheus = true })
}

// addHost adds an opt-in host to a running lab: builds its namespace if it
// is missing, starts what runs there (start leaves a running process
// alone), and records it in the state (mark).
func (l *Lab) addHost(ctx context.Context, topo *labnet.Topology, st *State, host, what string,
	start func(context.Context, *labnet.Topology, kubernetes.Interface) error, mark func(*State)) error {
	done := l.step("adding the %s host and starting %s", host, what)
	h, _ := topo.Host(host)
	if !labnet.NSExists(h.NS()) {
		if err := topo.BuildHost(ctx, h); err != nil {
			return err
		}
	}
	client, err := l.Client()
	if err != nil {
		return err
	}
	if err := start(ctx, topo, client); err != nil {
		return err
	}
	mark(st)
	if err := l.writeState(st); err != nil {
		return err
	}
	done()
	return nil
}

// hasLeftovers reports whether anything of a previous lab exists.
func (l *Lab) hasLeftovers(ctx context.Context) bool {
	if nss, _ := labnet.LabNamespaces(ctx); len(nss) > 0 {
		return true
	}
	if procs, _ := l.Procs(); len(procs) > 0 {
		return true
	}
	if links, _ := labnet.RootLinks(ctx); len(links) > 0 {
		return true
	}
	_, err := os.Stat(l.statePath())
	return err == nil
}

// Healthy checks that the recorded lab is complete: namespaces, processes and API server.
func (l *Lab) Healthy(ctx context.Context) error {
	st, err := l.ReadState()
	if err != nil {
		return err
	}
	if st == nil {
		return errors.New("no lab is recorded in .lab/state.json")
	}
	topo, err := l.Topology()
	if err != nil {
		return err
	}
	if err := topo.Check(ctx); err != nil {
		return err
	}
	procs, err := l.Procs()
	if err != nil {
		return err
	}
	var dead []string
	for _, p := range procs {
		if !p.Alive {
			dead = append(dead, p.Name)
		}
	}
	if len(dead) > 0 {
		return fmt.Errorf("processes not running: %s", strings.Join(dead, ", "))
	}
	c, err := l.Client()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := waitAPIReady(cctx, c); err != nil {
		return err
	}
	return nil
}

// reportDeadProcs prints the log tail of every lab process that is not running.
func (l *Lab) reportDeadProcs() {
	procs, _ := l.Procs()
	for _, p := range procs {
		if p.Alive {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(l.LogDir(), p.Name+".log"))
		l.printf("\n%s is not running; last lines of its log:\n%s\n", p.Name, tail(string(b), 15))
	}
}

// listenForwarder opens the host end of the API forwarder on loopback: the port kind users
// would not collide with if free, otherwise any free port.
func listenForwarder() (net.Listener, error) {
	if l, err := net.Listen("tcp4", "127.0.0.1:36443"); err == nil {
		return l, nil
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on 127.0.0.1 for the API forwarder: %w", err)
	}
	return l, nil
}

// forwarderCommand is the lab command itself (`lab forward`): the running executable when it
// is bin/lab, otherwise bin/lab (e.g. when a test drives this package directly).
func (l *Lab) forwarderCommand() (string, error) {
	exe, err := os.Executable()
	if err == nil && filepath.Base(exe) == "lab" {
		return exe, nil
	}
	if _, err := os.Stat(l.bin("lab")); err != nil {
		return "", fmt.Errorf("the API forwarder runs as `bin/lab forward`: build it with `go build -o bin/lab ./test/lab/cmd/lab` (%w)", err)
	}
	return l.bin("lab"), nil
}

func (l *Lab) startForwarder(lis net.Listener, topo *labnet.Topology) error {
	exe, err := l.forwarderCommand()
	if err != nil {
		return err
	}
	f, err := lis.(*net.TCPListener).File()
	if err != nil {
		return fmt.Errorf("passing the forwarder's socket: %w", err)
	}
	defer func() { _ = f.Close() }() // a duplicate: the forwarder has its own copy
	target := netip.AddrPortFrom(topo.ControlPlane().IP, APIPort)
	_, err = l.start(Proc{Name: "forward", Args: []string{exe, "forward", "--listen-fd=3",
		"--netns=" + topo.ControlPlane().NS(), "--target=" + target.String()}, ExtraFiles: []*os.File{f}})
	return err
}

// waitEtcd polls etcd's /health inside the control-plane namespace.
func waitEtcd(ctx context.Context, ns string) error {
	if err := waitHTTPOK(ctx, ns, "http://127.0.0.1:2379/health", 30*time.Second); err != nil {
		return fmt.Errorf("etcd not healthy: %w", err)
	}
	return nil
}

// waitHTTPOK polls url from inside namespace ns until it answers 200 OK.
func waitHTTPOK(ctx context.Context, ns, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return labnet.DialInNS(ctx, ns, ap)
		},
	}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		resp, err := hc.Get(url)
		if err == nil {
			_ = resp.Body.Close() // the status is the answer
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not OK after %s: %w", url, timeout, last)
}

// checkIptables verifies that the iptables kube-proxy will use works inside a namespace.
func checkIptables(ctx context.Context, ns string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "iptables", "-w", "-t", "nat", "-S").CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables does not work inside a network namespace (kube-proxy needs it): %w: %s; check `iptables --version` and that the nf_tables (or ip_tables) kernel modules are available", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// KubeProxyRulesCommand is the command that lists kube-proxy's service dispatch on a node:
// the KUBE-SERVICES chain in iptables mode, the services chain of table ip kube-proxy in
// nftables mode. It fails until kube-proxy has synced once.
func KubeProxyRulesCommand(mode string) []string {
	if mode == ProxyNftables {
		return []string{"nft", "list", "chain", "ip", "kube-proxy", "services"}
	}
	return []string{"iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"}
}

// waitKubeProxyRules polls until every node has kube-proxy's service dispatch.
func waitKubeProxyRules(ctx context.Context, topo *labnet.Topology, mode string) error {
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range topo.Nodes() {
		for {
			args := append([]string{"netns", "exec", n.NS()}, KubeProxyRulesCommand(mode)...)
			err := exec.CommandContext(ctx, "ip", args...).Run()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube-proxy on %s has not programmed its service rules after 60s (`%s` fails; see .lab/logs/kube-proxy-%s.log)",
					n.Name, strings.Join(KubeProxyRulesCommand(mode), " "), n.Name)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
	return nil
}
