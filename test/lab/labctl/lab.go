// Package labctl runs the lab: a real Kubernetes cluster (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy per node and the lab's node agent in place
// of the kubelet) inside network namespaces on this machine, with client hosts "mypc" and
// "mypc2" on the nodes' L2 segment. It mirrors the kind cluster of the walkthrough without a container engine.
//
// Lab.Up brings it up (idempotently), Lab.Down removes every namespace, link and process it
// made, Lab.Exec runs a command on a lab host, and Lab.KillNode/RestoreNode simulate a node
// crash. State lives under <repo>/.lab: kubeconfig, pki, logs, pids and state.json.
package labctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// ModulePath identifies the repository root (its go.mod declares this module).
const ModulePath = "github.com/ironlb/ironlb"

// DefaultWorkers is the walkthrough's worker count.
const DefaultWorkers = 3

// kube-proxy modes the lab runs.
const (
	ProxyIptables = "iptables"
	ProxyNftables = "nftables"
)

// Lab is the lab of one repository checkout.
type Lab struct {
	// Root is the repository root; binaries are in Root/bin, state in Root/.lab.
	Root string
	// Out receives progress and reports.
	Out io.Writer
}

// New returns the lab rooted at root, reporting to out (os.Stdout if nil).
func New(root string, out io.Writer) *Lab {
	if out == nil {
		out = os.Stdout
	}
	return &Lab{Root: root, Out: out}
}

// FindRoot returns the repository root: the nearest directory at or above dir whose go.mod
// declares ModulePath.
func FindRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module "+ModulePath+"\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of module %s at or above %s: run the lab from the ironlb repository", ModulePath, dir)
		}
	}
}

// StateDir is <repo>/.lab.
func (l *Lab) StateDir() string { return filepath.Join(l.Root, ".lab") }

// BinDir is <repo>/bin.
func (l *Lab) BinDir() string { return filepath.Join(l.Root, "bin") }

// Kubeconfig is the host's kubeconfig (API server through the forwarder on 127.0.0.1).
func (l *Lab) Kubeconfig() string { return filepath.Join(l.StateDir(), "kubeconfig") }

// LogDir holds one log per lab process; the agent writes pod logs under LogDir/pods.
func (l *Lab) LogDir() string { return filepath.Join(l.StateDir(), "logs") }

// PodLogDir is where the node agents write container logs (<ns>_<pod>_<container>.log).
func (l *Lab) PodLogDir() string { return filepath.Join(l.LogDir(), "pods") }

// PidDir holds one pid file per lab process.
func (l *Lab) PidDir() string { return filepath.Join(l.StateDir(), "pids") }

// PKIDir holds certificates, keys and the components' kubeconfigs.
func (l *Lab) PKIDir() string { return filepath.Join(l.StateDir(), "pki") }

// NodeDir is a node agent's state directory. It sits directly in .lab because the agent puts
// pod logs in <state dir>/../logs/pods, which is then PodLogDir.
func (l *Lab) NodeDir(node string) string { return filepath.Join(l.StateDir(), "node-"+node) }

func (l *Lab) bin(name string) string { return filepath.Join(l.BinDir(), name) }

func (l *Lab) statePath() string { return filepath.Join(l.StateDir(), "state.json") }

// State is what a running lab records about itself in .lab/state.json.
type State struct {
	Workers   int    `json:"workers"`
	ProxyMode string `json:"proxyMode"`
	// ServiceCIDR is the service CIDR ("" in a state written before it was
	// recorded: the default).
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// IPFamily is labnet.FamilyDual or labnet.FamilyIPv4 ("" in a state written before
	// the lab was dual-stack: IPv4).
	IPFamily    string    `json:"ipFamily,omitempty"`
	ForwardAddr string    `json:"forwardAddr"`
	StartedAt   time.Time `json:"startedAt"`
	// Ready is set once the whole lab came up; a state without it is a crashed bring-up.
	Ready bool `json:"ready"`
	// Prometheus: the lab runs the monitoring host and Prometheus (lab up --prometheus).
	Prometheus bool `json:"prometheus,omitempty"`
	// DNS: the lab runs the DNS host, BIND and external-dns (lab up --dns).
	DNS bool `json:"dns,omitempty"`
}

// serviceSubnet is the recorded service CIDR (the default if none or unreadable).
func (s *State) serviceSubnet() netip.Prefix {
	if p, err := labnet.ParseServiceSubnet(s.ServiceCIDR); err == nil {
		return p
	}
	return labnet.DefaultServiceSubnet
}

// ipFamily is the recorded IP family.
func (s *State) ipFamily() string {
	if s.IPFamily == "" {
		return labnet.FamilyIPv4
	}
	return s.IPFamily
}

// ReadState returns the recorded state, or nil if there is none.
func (l *Lab) ReadState() (*State, error) {
	b, err := os.ReadFile(l.statePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", l.statePath(), err)
	}
	return &s, nil
}

func (l *Lab) writeState(s *State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.StateDir(), 0o755); err != nil {
		return err
	}
	return os.WriteFile(l.statePath(), append(b, '\n'), 0o644)
}

// Topology returns the topology of the recorded lab (the default one if none is recorded).
func (l *Lab) Topology() (*labnet.Topology, error) {
	s, err := l.ReadState()
	if err != nil {
		return nil, err
	}
	if s == nil {
		return labnet.New(DefaultWorkers)
	}
	t, err := labnet.NewWithPrefix(s.Workers, labnet.NSPrefix, s.ipFamily())
	if err != nil {
		return nil, err
	}
	t.ServiceSubnet = s.serviceSubnet()
	if s.Prometheus {
		t.AddPrometheus()
	}
	if s.DNS {
		t.AddDNS()
	}
	return t, nil
}

// printf writes progress to the console; a failed write there has nowhere to be reported.
func (l *Lab) printf(format string, args ...any) { _, _ = fmt.Fprintf(l.Out, format, args...) }

// printTable aligns tab-separated rows into columns, like kubectl, and prints them.
func (l *Lab) printTable(rows string) {
	tw := tabwriter.NewWriter(l.Out, 0, 4, 2, ' ', 0)
	_, _ = io.WriteString(tw, rows) // console output, as printf
	_ = tw.Flush()
}

// step prints a progress line and returns a func that completes it with the elapsed time.
func (l *Lab) step(format string, args ...any) func() {
	start := time.Now()
	l.printf("==> "+format+"\n", args...)
	return func() {
		l.printf("    done in %.1fs\n", time.Since(start).Seconds())
	}
}
