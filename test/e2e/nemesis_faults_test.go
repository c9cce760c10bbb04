//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/controllers"
	"github.com/ironlb/ironlb/test/e2e/nemesis"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// The nemesis's faults (issue 25), one small function each on top of what the
// lab offers (hosts.go) and the iptables rules of faults_test.go. Each apply
// returns the function that heals it; a heal must be safe to call when the
// apply failed half-way, and every rule a fault adds carries a comment with
// nemesisComment, so that one sweep (clearRules with that prefix) removes whatever an
// interrupted run left.

// nemesisComment prefixes the comment of every iptables rule the nemesis adds.
const nemesisComment = "ironlb-e2e-nemesis"

// nemesisHosts are the Hosts' capabilities the nemesis needs (the lab's).
type nemesisHosts interface {
	Hosts
	NodeKiller
	ContainerSignaller
	LinkCutter
	DaemonStopper
}

// lossPercent is the packet loss of the PacketLoss fault.
const lossPercent = 30

// faultEnv is what applying a fault needs beyond Env: the nodes' addresses,
// the hosts' capabilities and how packet loss is applied here.
type faultEnv struct {
	e     *Env
	h     nemesisHosts
	nodes []string
	ips   map[string]string // node -> InternalIP (IPv4: memberlist's address)
	// netem: the kernel has sch_netem (lossWith says what is used instead).
	netem    bool
	lossWith string

	mu    sync.Mutex
	notes []string // what happened besides the plan, for the report
}

// note records (and prints at once) something that happened besides the plan.
func (fe *faultEnv) note(format string, args ...any) {
	msg := time.Now().Format("15:04:05.000 ") + fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "nemesis: "+msg)
	fe.mu.Lock()
	defer fe.mu.Unlock()
	fe.notes = append(fe.notes, msg)
}

// apply starts fault f and returns its heal.
func (fe *faultEnv) apply(ctx context.Context, f nemesis.Fault) (heal func(context.Context) error, err error) {
	node := ""
	if len(f.Nodes) > 0 {
		node = f.Nodes[0]
	}
	switch f.Kind {
	case nemesis.CablePull:
		return fe.cablePull(ctx, node)
	case nemesis.MemberlistCut:
		return fe.memberlistLoss(ctx, node, true, true)
	case nemesis.MemberlistDeaf:
		return fe.memberlistLoss(ctx, node, true, false)
	case nemesis.MemberlistMute:
		return fe.memberlistLoss(ctx, node, false, true)
	case nemesis.Partition22, nemesis.Partition13:
		return fe.partition(ctx, f.Nodes, without(fe.nodes, f.Nodes...))
	case nemesis.SpeakerStop:
		return fe.speakerStop(ctx, node)
	case nemesis.SpeakerKill:
		return fe.speakerKill(ctx, node)
	case nemesis.NodeKill:
		return fe.nodeKill(ctx, node)
	case nemesis.APIServerDown:
		return fe.apiServerDown(ctx)
	case nemesis.PacketLoss:
		return fe.packetLoss(ctx, node)
	case nemesis.KeyRotation:
		return fe.rotateKey(ctx)
	case nemesis.KubeProxyDown:
		return fe.kubeProxyDown(ctx, node)
	}
	return nil, fmt.Errorf("fault kind %q: not implemented in the lab", f.Kind)
}

// cablePull takes node's switch port down: its eth0 loses carrier.
func (fe *faultEnv) cablePull(ctx context.Context, node string) (func(context.Context) error, error) {
	heal := func(ctx context.Context) error { return fe.h.SetNodeLink(ctx, node, true) }
	return heal, fe.h.SetNodeLink(ctx, node, false)
}

// memberlistLoss drops node's incoming (in) and/or outgoing (out)
// memberlist traffic, UDP and TCP; clients' traffic is untouched.
func (fe *faultEnv) memberlistLoss(ctx context.Context, node string, in, out bool) (func(context.Context) error, error) {
	tag := nemesisComment + "-ml"
	var rules [][]string
	for _, proto := range []string{"tcp", "udp"} {
		if in {
			rules = append(rules, mlRule("INPUT", proto, "", "", tag))
		}
		if out {
			rules = append(rules, mlRule("OUTPUT", proto, "", "", tag))
		}
	}
	heal := func(ctx context.Context) error { return fe.clearRules(ctx, node, tag) }
	return heal, fe.addRules(ctx, node, "iptables", "filter", rules)
}

// partition cuts memberlist between the nodes of a and those of b, both
// ways, by rules on every node naming the other side's addresses: each side
// still talks among itself.
func (fe *faultEnv) partition(ctx context.Context, a, b []string) (func(context.Context) error, error) {
	tag := nemesisComment + "-part"
	heal := func(ctx context.Context) error {
		var errs []error
		for _, n := range fe.nodes {
			errs = append(errs, fe.clearRules(ctx, n, tag))
		}
		return errors.Join(errs...)
	}
	for _, sides := range [][2][]string{{a, b}, {b, a}} {
		for _, n := range sides[0] {
			var rules [][]string
			for _, peer := range sides[1] {
				for _, proto := range []string{"tcp", "udp"} {
					rules = append(rules, mlRule("INPUT", proto, "-s", fe.ips[peer], tag), mlRule("OUTPUT", proto, "-d", fe.ips[peer], tag))
				}
			}
			if err := fe.addRules(ctx, n, "iptables", "filter", rules); err != nil {
				return heal, err
			}
		}
	}
	return heal, nil
}

// mlRule is an iptables rule (for -I) dropping memberlist traffic in chain,
// from or to peer when addrFlag ("-s", "-d") is set.
func mlRule(chain, proto, addrFlag, peer, tag string) []string {
	r := []string{chain}
	if addrFlag != "" {
		r = append(r, addrFlag, peer)
	}
	return append(r, "-p", proto, "-m", "multiport", "--ports", strconv.Itoa(memberlistPort), "-m", "comment", "--comment", tag, "-j", "DROP")
}

// speakerStop freezes node's speaker (SIGSTOP); the heal thaws it. A frozen
// speaker may be killed meanwhile (its liveness probe fails, as a kubelet's
// would): a process that is gone needs no thaw, and its restart is awaited
// before the next episode.
func (fe *faultEnv) speakerStop(ctx context.Context, node string) (func(context.Context) error, error) {
	pod := findSpeakerPod(fe.e, node)
	if pod == nil {
		return nil, fmt.Errorf("no speaker pod on %s", node)
	}
	pid := strings.TrimPrefix(containerID(pod, "speaker"), "lab://")
	heal := func(ctx context.Context) error {
		if _, err := os.Stat("/proc/" + pid); pid != "" && errors.Is(err, fs.ErrNotExist) {
			fe.note("the frozen speaker on %s (pid %s) was killed before its thaw", node, pid)
			return nil
		}
		return fe.h.SignalContainer(ctx, pod, "speaker", syscall.SIGCONT)
	}
	return heal, fe.h.SignalContainer(ctx, pod, "speaker", syscall.SIGSTOP)
}

// speakerKill SIGKILLs node's speaker, as a crash; the node agent restarts
// it (the driver waits for that before the next episode).
func (fe *faultEnv) speakerKill(ctx context.Context, node string) (func(context.Context) error, error) {
	pod := findSpeakerPod(fe.e, node)
	if pod == nil {
		return nil, fmt.Errorf("no speaker pod on %s", node)
	}
	return func(context.Context) error { return nil }, fe.h.SignalContainer(ctx, pod, "speaker", syscall.SIGKILL)
}

// kubeProxyDown kills node's kube-proxy, its rules left in place; the heal
// starts it again.
func (fe *faultEnv) kubeProxyDown(ctx context.Context, node string) (func(context.Context) error, error) {
	heal := func(ctx context.Context) error { return fe.h.StartDaemon(ctx, kubeProxyProc(node)) }
	return heal, fe.h.StopDaemon(ctx, kubeProxyProc(node), syscall.SIGKILL)
}

// nodeKill kills node hard (every process, link down); the heal restores it.
func (fe *faultEnv) nodeKill(ctx context.Context, node string) (func(context.Context) error, error) {
	heal := func(ctx context.Context) error { return fe.h.RestoreNode(ctx, node) }
	return heal, fe.h.KillNode(ctx, node)
}

// apiServerDown kills the API server; the heal starts it again. As in
// TestFaultAPIServerDown, kube-controller-manager is stopped with it and
// started after it, as a leader-elected one would exit and restart, so that
// the lab's node lifecycle controller does not judge the nodes by heartbeats
// it could not see.
func (fe *faultEnv) apiServerDown(ctx context.Context) (func(context.Context) error, error) {
	kcmStopped, apiStopped := false, false
	heal := func(ctx context.Context) error {
		var errs []error
		if apiStopped {
			errs = append(errs, fe.h.StartDaemon(ctx, labctl.ProcAPIServer))
		}
		if kcmStopped {
			errs = append(errs, fe.h.StartDaemon(ctx, labctl.ProcControllerManager))
		}
		return errors.Join(errs...)
	}
	if err := fe.h.StopDaemon(ctx, labctl.ProcAPIServer, syscall.SIGKILL); err != nil {
		return heal, err
	}
	apiStopped = true
	if err := fe.h.StopDaemon(ctx, labctl.ProcControllerManager, syscall.SIGTERM); err != nil {
		return heal, err
	}
	kcmStopped = true
	return heal, nil
}

// packetLoss drops lossPercent of node's packets: with tc netem on its
// switch port and its eth0 where the kernel has netem, else with iptables'
// statistic match on every IP packet in and out of its eth0 (mangle
// PREROUTING and POSTROUTING, so forwarded Service traffic too; ARP and NDP
// are not IP and pass).
func (fe *faultEnv) packetLoss(ctx context.Context, node string) (func(context.Context) error, error) {
	if fe.netem {
		lab, _ := fe.h.(LabHosts)
		heal := func(ctx context.Context) error { return lab.SetNodePortLoss(ctx, node, 0) }
		return heal, lab.SetNodePortLoss(ctx, node, lossPercent)
	}
	tag := nemesisComment + "-loss"
	p := fmt.Sprintf("%.2f", float64(lossPercent)/100)
	rules := [][]string{
		{"PREROUTING", "-i", "eth0", "-m", "statistic", "--mode", "random", "--probability", p, "-m", "comment", "--comment", tag, "-j", "DROP"},
		{"POSTROUTING", "-o", "eth0", "-m", "statistic", "--mode", "random", "--probability", p, "-m", "comment", "--comment", tag, "-j", "DROP"},
	}
	heal := func(ctx context.Context) error { return fe.clearRules(ctx, node, tag) }
	if err := fe.addRules(ctx, node, "iptables", "mangle", rules); err != nil {
		return heal, err
	}
	return heal, fe.addRules(ctx, node, "ip6tables", "mangle", rules)
}

// rotateKey replaces the memberlist key in its Secret with 32 new random
// bytes (the controller's format), as a user rotating it does; the speakers
// read it from their mounted Secret and rotate in phases.
func (fe *faultEnv) rotateKey(ctx context.Context) (func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return none, err
	}
	name := Release + "-memberlist"
	var sec corev1.Secret
	if err := fe.e.C.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, &sec); err != nil {
		return none, fmt.Errorf("reading the memberlist Secret %s/%s: %w", Namespace, name, err)
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[controllers.MemberlistSecretKey] = key
	if err := fe.e.C.Update(ctx, &sec); err != nil {
		return none, fmt.Errorf("rotating the memberlist key in %s/%s: %w", Namespace, name, err)
	}
	return none, nil
}

// addRules inserts rules (first in their chains) with cmd (iptables,
// ip6tables) in table on node.
func (fe *faultEnv) addRules(ctx context.Context, node, cmd, table string, rules [][]string) error {
	for _, r := range rules {
		if _, err := fe.e.runOK(ctx, node, append([]string{cmd, "-w", "-t", table, "-I"}, r...)...); err != nil {
			return err
		}
	}
	return nil
}

// clearRules removes every rule on node whose comment starts with tag, in
// every table, IPv4 and IPv6: what iptables-save lists, deleted by spec.
func (fe *faultEnv) clearRules(ctx context.Context, node, tag string) error {
	script := fmt.Sprintf(`set -e
for cmd in iptables ip6tables; do for t in filter mangle; do
  $cmd-save -t $t | grep -e '--comment %[1]s' | sed 's/^-A /-D /' | while read -r rule; do $cmd -w -t $t $rule; done
done; done
left=$( { iptables-save; ip6tables-save; } | grep -c -e '--comment %[1]s' || true)
[ "$left" = 0 ] || { echo "$left rules with comment %[1]s left" >&2; exit 1; }`, tag)
	_, err := fe.e.runOK(ctx, node, "sh", "-c", script)
	return err
}

// probeNetem says whether tc netem works on this kernel, trying it on the
// switch port of node and removing it again, and why not.
func (fe *faultEnv) probeNetem(ctx context.Context, node string) {
	lab, ok := fe.h.(LabHosts)
	if !ok {
		fe.lossWith = "iptables statistic on the node (these hosts have no switch to run tc on)"
		return
	}
	err := lab.SetNodePortLoss(ctx, node, 1)
	if err == nil {
		fe.netem = true
		fe.lossWith = "tc netem on the node's switch port and eth0"
		if err := lab.SetNodePortLoss(ctx, node, 0); err != nil {
			fe.lossWith += fmt.Sprintf(" (removing the probe's 1 %% loss: %v)", err)
		}
		return
	}
	// A half-applied probe (one of the two devices) is removed; on a kernel
	// without netem there is nothing to remove and that error says nothing.
	_ = lab.SetNodePortLoss(ctx, node, 0)
	fe.lossWith = fmt.Sprintf("iptables statistic on the node's eth0 (IP in and out; ARP/NDP untouched), because tc netem is not available in this kernel: %v", err)
}
