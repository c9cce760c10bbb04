//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/ironlb/ironlb/test/lab/labctl"
	"github.com/ironlb/ironlb/test/lab/labnet"
)

// ClientHost is the external client's host name (the walkthrough's mypc).
const ClientHost = labnet.ClientName

// SecondClientHost is the lab's second client on the segment, where the
// nemesis's checker runs beside ClientHost.
const SecondClientHost = labnet.SecondClientName

// Result is a command's output and exit code.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Hosts runs commands on the machines of the cluster under test: the external
// client (ClientHost) and the nodes (by node name).
type Hosts interface {
	// Run runs argv on host. The error is only for failing to run it at all;
	// a non-zero exit is in Result.Code.
	Run(ctx context.Context, host string, argv ...string) (Result, error)
}

// NodeKiller is implemented by Hosts that can crash a node hard and bring it
// back (the lab). Tests that need it skip without it.
type NodeKiller interface {
	KillNode(ctx context.Context, node string) error
	RestoreNode(ctx context.Context, node string) error
}

// ContainerSignaller is implemented by Hosts that can signal a container's
// process directly, behind the kubelet's back (the lab): SIGKILL a speaker as
// a crash would, freeze it with SIGSTOP. Tests that need it skip without it.
type ContainerSignaller interface {
	SignalContainer(ctx context.Context, pod *corev1.Pod, container string, sig syscall.Signal) error
}

// LinkCutter is implemented by Hosts that can take a node's link down at the
// switch, so that the node's NIC loses carrier while its processes keep
// running, and bring it back (the lab). Tests that need it skip without it.
type LinkCutter interface {
	SetNodeLink(ctx context.Context, node string, up bool) error
}

// DaemonStopper is implemented by Hosts that can stop one of the cluster's
// own daemons and start it again as the cluster started it (the lab: its
// process names, labctl.ProcAPIServer, labctl.ProcEtcd...). Tests that need
// it skip without it.
type DaemonStopper interface {
	// StopDaemon stops it with sig (SIGTERM or SIGKILL) and returns once it
	// has exited.
	StopDaemon(ctx context.Context, name string, sig syscall.Signal) error
	// StartDaemon starts it and returns once it serves (etcd healthy, the
	// API server ready).
	StartDaemon(ctx context.Context, name string) error
}

// PodLogger is implemented by Hosts that read container logs themselves (the
// lab's node agent has no log endpoint for kubectl logs).
type PodLogger interface {
	PodLogs(namespace, name string) (string, error)
}

// LabHosts runs commands in the lab's network namespaces (labctl.Lab.Exec).
type LabHosts struct{ Lab *labctl.Lab }

func (h LabHosts) Run(ctx context.Context, host string, argv ...string) (Result, error) {
	var out, errb bytes.Buffer
	code, err := h.Lab.Exec(ctx, host, argv, nil, &out, &errb)
	return Result{Stdout: out.String(), Stderr: errb.String(), Code: code}, err
}

func (h LabHosts) KillNode(ctx context.Context, node string) error { return h.Lab.KillNode(ctx, node) }

func (h LabHosts) RestoreNode(ctx context.Context, node string) error {
	return h.Lab.RestoreNode(ctx, node)
}

// SignalContainer signals the container's process: the lab's node agent runs
// containers as processes of this machine and reports "lab://<pid>" as the
// container ID. The process must run a program of the lab's bin/ or of an
// image the lab unpacked (under its state directory), so that a stale status
// never makes it signal anything else.
func (h LabHosts) SignalContainer(_ context.Context, pod *corev1.Pod, container string, sig syscall.Signal) error {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != container {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(cs.ContainerID, "lab://"))
		if err != nil || pid <= 1 || cs.State.Running == nil {
			return fmt.Errorf("pod %s/%s container %s: no running process (container ID %q, state %+v)", pod.Namespace, pod.Name, container, cs.ContainerID, cs.State)
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			return fmt.Errorf("pod %s/%s container %s: process %d: %w", pod.Namespace, pod.Name, container, pid, err)
		}
		if filepath.Dir(exe) != h.Lab.BinDir() && !strings.HasPrefix(exe, h.Lab.StateDir()+string(filepath.Separator)) {
			return fmt.Errorf("pod %s/%s container %s: process %d runs %s, not a program of %s or an image under %s",
				pod.Namespace, pod.Name, container, pid, exe, h.Lab.BinDir(), h.Lab.StateDir())
		}
		if err := syscall.Kill(pid, sig); err != nil {
			return fmt.Errorf("pod %s/%s container %s: kill -%d %d: %w", pod.Namespace, pod.Name, container, sig, pid, err)
		}
		return nil
	}
	return fmt.Errorf("pod %s/%s has no status for container %s", pod.Namespace, pod.Name, container)
}

// SetNodeLink sets the node's switch port (the bridge end of its veth) down
// or up: the node's eth0 loses or regains carrier, as with a cable pulled at
// the switch; unlike KillNode, nothing on the node is stopped.
func (h LabHosts) SetNodeLink(ctx context.Context, node string, up bool) error {
	topo, err := h.Lab.Topology()
	if err != nil {
		return err
	}
	host, ok := topo.Host(node)
	if !ok || !host.Node {
		return fmt.Errorf("no node %q in the lab", node)
	}
	state := "down"
	if up {
		state = "up"
	}
	_, err = labnet.IP(ctx, "-n", topo.SwitchNS(), "link", "set", host.SwitchPort(), state)
	return err
}

// SetNodePortLoss makes node's switch port and its eth0 drop percent of the
// packets they send (tc netem; 0 removes it): loss both ways on its segment.
// It fails on a kernel without sch_netem ("Specified qdisc kind is unknown").
func (h LabHosts) SetNodePortLoss(ctx context.Context, node string, percent int) error {
	topo, err := h.Lab.Topology()
	if err != nil {
		return err
	}
	host, ok := topo.Host(node)
	if !ok || !host.Node {
		return fmt.Errorf("no node %q in the lab", node)
	}
	var errs []error
	for _, dev := range [][2]string{{topo.SwitchNS(), host.SwitchPort()}, {host.NS(), "eth0"}} {
		args := []string{"ip", "netns", "exec", dev[0], "tc", "qdisc", "replace", "dev", dev[1], "root", "netem", "loss", fmt.Sprintf("%d%%", percent)}
		if percent == 0 {
			args = []string{"ip", "netns", "exec", dev[0], "tc", "qdisc", "del", "dev", dev[1], "root"}
		}
		if out, err := runLocal(ctx, args...); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

// runLocal runs a command on this machine and returns its combined output.
func runLocal(ctx context.Context, argv ...string) (string, error) {
	var b bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func (h LabHosts) StopDaemon(ctx context.Context, name string, sig syscall.Signal) error {
	return h.Lab.StopProcess(ctx, name, sig)
}

func (h LabHosts) StartDaemon(ctx context.Context, name string) error {
	return h.Lab.StartProcess(ctx, name)
}

func (h LabHosts) PodLogs(namespace, name string) (string, error) {
	var b bytes.Buffer
	err := h.Lab.Logs(namespace+"/"+name, "", &b)
	return b.String(), err
}

// DockerHosts runs commands with docker exec: kind's nodes are containers named
// after the nodes; Client is the client container (attached to kind's network).
type DockerHosts struct{ Client string }

func (h DockerHosts) Run(ctx context.Context, host string, argv ...string) (Result, error) {
	if host == ClientHost && h.Client != "" {
		host = h.Client
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", append([]string{"exec", host}, argv...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return Result{Stdout: out.String(), Stderr: errb.String(), Code: ee.ExitCode()}, nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("docker exec %s %v: %w", host, argv, err)
	}
	return Result{Stdout: out.String(), Stderr: errb.String()}, nil
}
