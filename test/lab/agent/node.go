package agent

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

const (
	// KubeletVersion is what the Node reports; it matches the lab's control plane.
	KubeletVersion    = "v1.37.1"
	controlPlaneLabel = "node-role.kubernetes.io/control-plane"
	leaseNamespace    = "kube-node-lease"
	leaseDuration     = 40
	leaseRenewPeriod  = 10 * time.Second
	nodeStatusPeriod  = 10 * time.Second
	maxPods           = 110
)

// registerNode creates the Node or brings an existing one in line with the
// configuration (labels, taint, pod CIDR), then reports its status.
func (a *Agent) registerNode(ctx context.Context) error {
	nodes := a.client.CoreV1().Nodes()
	return wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		node, err := nodes.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName}}
			a.desiredNodeSpec(node)
			if _, err = nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
				a.log.Error(err, "Registering node failed, retrying", "node", a.cfg.NodeName)
				return false, nil
			}
			a.log.Info("Registered node", "node", a.cfg.NodeName)
			return true, nil
		}
		if err != nil {
			a.log.Error(err, "Reading node failed, retrying", "node", a.cfg.NodeName)
			return false, nil
		}
		a.desiredNodeSpec(node)
		if _, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			a.log.Error(err, "Updating node failed, retrying", "node", a.cfg.NodeName)
			return false, nil
		}
		a.log.Info("Node already registered, updated it", "node", a.cfg.NodeName)
		return true, nil
	})
}

func (a *Agent) desiredNodeSpec(node *corev1.Node) {
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	node.Labels["kubernetes.io/hostname"] = a.cfg.NodeName
	node.Labels["kubernetes.io/os"] = "linux"
	node.Labels["kubernetes.io/arch"] = runtime.GOARCH
	node.Labels["beta.kubernetes.io/os"] = "linux"
	node.Labels["beta.kubernetes.io/arch"] = runtime.GOARCH
	if a.cfg.ControlPlane {
		node.Labels[controlPlaneLabel] = ""
		has := false
		for _, t := range node.Spec.Taints {
			if t.Key == controlPlaneLabel && t.Effect == corev1.TaintEffectNoSchedule {
				has = true
			}
		}
		if !has {
			node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: controlPlaneLabel, Effect: corev1.TaintEffectNoSchedule})
		}
	}
	if node.Spec.PodCIDR == "" && a.cfg.PodCIDR.IsValid() {
		node.Spec.PodCIDR = a.cfg.PodCIDR.String()
		node.Spec.PodCIDRs = []string{a.cfg.PodCIDR.String()}
		if a.cfg.PodCIDR6.IsValid() {
			node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, a.cfg.PodCIDR6.String())
		}
	}
}

// heartbeat renews the node's Lease and refreshes its status until ctx ends.
// On shutdown it simply stops: the node lifecycle controller notices the
// stale lease and marks the node NotReady, as with a dead kubelet.
func (a *Agent) heartbeat(ctx context.Context) {
	leaseTick := time.NewTicker(leaseRenewPeriod)
	defer leaseTick.Stop()
	statusTick := time.NewTicker(nodeStatusPeriod)
	defer statusTick.Stop()
	a.renewLease(ctx)
	a.updateNodeStatus(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-leaseTick.C:
			a.renewLease(ctx)
		case <-statusTick.C:
			a.updateNodeStatus(ctx)
		}
	}
}

func (a *Agent) renewLease(ctx context.Context) {
	leases := a.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, Namespace: leaseNamespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(a.cfg.NodeName),
				LeaseDurationSeconds: ptr.To[int32](leaseDuration),
				RenewTime:            &now,
			},
		}
		if node, nerr := a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{}); nerr == nil {
			lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		}
		if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			a.log.Error(err, "Creating node lease failed", "lease", leaseNamespace+"/"+a.cfg.NodeName)
		}
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			a.log.Error(err, "Reading node lease failed", "lease", leaseNamespace+"/"+a.cfg.NodeName)
		}
		return
	}
	lease.Spec.HolderIdentity = ptr.To(a.cfg.NodeName)
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](leaseDuration)
	lease.Spec.RenewTime = &now
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		a.log.Error(err, "Renewing node lease failed", "lease", leaseNamespace+"/"+a.cfg.NodeName)
	}
}

func (a *Agent) updateNodeStatus(ctx context.Context) {
	nodes := a.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		if ctx.Err() == nil {
			a.log.Error(err, "Reading node for a status update failed", "node", a.cfg.NodeName)
		}
		return
	}
	a.fillNodeStatus(&node.Status, time.Now())
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		a.log.Error(err, "Updating node status failed", "node", a.cfg.NodeName)
	}
}

func (a *Agent) fillNodeStatus(st *corev1.NodeStatus, now time.Time) {
	ts := metav1.NewTime(now)
	setCond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) {
		for i := range st.Conditions {
			c := &st.Conditions[i]
			if c.Type != t {
				continue
			}
			if c.Status != s {
				c.LastTransitionTime = ts
			}
			c.Status, c.Reason, c.Message, c.LastHeartbeatTime = s, reason, msg, ts
			return
		}
		st.Conditions = append(st.Conditions, corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: ts, LastTransitionTime: ts})
	}
	setCond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available")
	setCond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
	setCond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available")
	setCond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "lab node agent is posting ready status")
	setCond(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated", "the lab routes pod CIDRs between nodes")

	st.Addresses = nil
	for _, ip := range a.nodeIPs() {
		st.Addresses = append(st.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	st.Addresses = append(st.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: a.cfg.NodeName})
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(maxPods, resource.DecimalSI),
	}
	st.Capacity = capacity
	st.Allocatable = capacity.DeepCopy()
	st.DaemonEndpoints.KubeletEndpoint.Port = int32(a.cfg.KubeletPort)
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	machineID, _ := os.ReadFile("/etc/machine-id")
	st.NodeInfo = corev1.NodeSystemInfo{
		MachineID:               strings.TrimSpace(string(machineID)),
		SystemUUID:              strings.TrimSpace(string(machineID)),
		BootID:                  strings.TrimSpace(string(bootID)),
		KernelVersion:           strings.TrimSpace(string(kernel)),
		OSImage:                 osImage(),
		ContainerRuntimeVersion: "lab-agent://" + KubeletVersion,
		KubeletVersion:          KubeletVersion,
		OperatingSystem:         "linux",
		Architecture:            runtime.GOARCH,
	}
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func osImage() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "linux"
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "linux"
}
