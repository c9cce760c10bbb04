package labctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// ControlPlaneRole is the label and taint key kind puts on its control-plane node.
const ControlPlaneRole = "node-role.kubernetes.io/control-plane"

// Client returns a clientset for the host's kubeconfig.
func (l *Lab) Client() (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", l.Kubeconfig(), err)
	}
	cfg.Timeout = 15 * time.Second
	cfg.QPS, cfg.Burst = 50, 100
	return kubernetes.NewForConfig(cfg)
}

// waitAPIReady polls /readyz until the API server reports ready.
func waitAPIReady(ctx context.Context, c kubernetes.Interface) error {
	var last string
	for {
		body, err := c.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			return nil
		}
		last = strings.TrimSpace(string(body))
		if last == "" {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("API server not ready: %s", tail(last, 15))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// NodeReady reports whether a node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitNodesReady polls until every named node is Ready, printing the count as it grows.
func (l *Lab) waitNodesReady(ctx context.Context, c kubernetes.Interface, names []string) error {
	lastReady := -1
	for {
		list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		ready := map[string]bool{}
		if err == nil {
			for i := range list.Items {
				if NodeReady(&list.Items[i]) {
					ready[list.Items[i].Name] = true
				}
			}
		}
		var waiting []string
		for _, n := range names {
			if !ready[n] {
				waiting = append(waiting, n)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if r := len(names) - len(waiting); r != lastReady {
			l.printf("    %d/%d nodes Ready\n", r, len(names))
			lastReady = r
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("nodes not Ready: %s (last error: %w)", strings.Join(waiting, ", "), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// ensureControlPlaneRole labels and taints the control-plane node like kind does (the agent
// registers it with --control-plane and should already have done so; this makes it certain).
func ensureControlPlaneRole(ctx context.Context, c kubernetes.Interface, name string) error {
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting node %s: %w", name, err)
	}
	if _, ok := n.Labels[ControlPlaneRole]; !ok {
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:""}}}`, ControlPlaneRole)
		if _, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling node %s %s: %w", name, ControlPlaneRole, err)
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == ControlPlaneRole && t.Effect == corev1.TaintEffectNoSchedule {
			return nil
		}
	}
	taints := append(n.Spec.Taints, corev1.Taint{Key: ControlPlaneRole, Effect: corev1.TaintEffectNoSchedule})
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": taints}})
	if err != nil {
		return err
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("tainting node %s %s:NoSchedule: %w", name, ControlPlaneRole, err)
	}
	return nil
}

// DumpCluster writes what explains a failure: node conditions, pods and their container
// states, recent events. It never fails; errors are written inline.
func DumpCluster(ctx context.Context, c kubernetes.Interface, w io.Writer) {
	var b strings.Builder
	dumpCluster(ctx, c, &b)
	_, _ = io.WriteString(w, b.String()) // nowhere to report a failed write of a failure dump
}

func dumpCluster(ctx context.Context, c kubernetes.Interface, w *strings.Builder) {
	fmt.Fprintln(w, "---- nodes")
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(w, "listing nodes: %v\n", err)
	} else {
		for _, n := range nodes.Items {
			fmt.Fprintf(w, "%s podCIDR=%s taints=%v\n", n.Name, n.Spec.PodCIDR, n.Spec.Taints)
			for _, cond := range n.Status.Conditions {
				fmt.Fprintf(w, "  %s=%s %s: %s (heartbeat %s)\n", cond.Type, cond.Status, cond.Reason, cond.Message, cond.LastHeartbeatTime.Format(time.RFC3339))
			}
		}
	}
	fmt.Fprintln(w, "---- pods")
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(w, "listing pods: %v\n", err)
	} else {
		for _, p := range pods.Items {
			fmt.Fprintf(w, "%s/%s node=%s phase=%s podIP=%s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.PodIP)
			for _, cond := range p.Status.Conditions {
				fmt.Fprintf(w, "  %s=%s %s %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
			}
			for _, cs := range p.Status.ContainerStatuses {
				fmt.Fprintf(w, "  container %s ready=%v restarts=%d state=%s\n", cs.Name, cs.Ready, cs.RestartCount, containerState(cs.State))
			}
		}
	}
	fmt.Fprintln(w, "---- events")
	events, err := c.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(w, "listing events: %v\n", err)
		return
	}
	items := events.Items
	sort.Slice(items, func(i, j int) bool { return eventTime(&items[i]).Before(eventTime(&items[j])) })
	if len(items) > 60 {
		items = items[len(items)-60:]
	}
	for _, e := range items {
		fmt.Fprintf(w, "%s %s %s/%s %s: %s\n", eventTime(&e).Format("15:04:05"), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
}

func eventTime(e *corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Waiting != nil:
		return fmt.Sprintf("waiting(%s: %s)", s.Waiting.Reason, s.Waiting.Message)
	case s.Terminated != nil:
		return fmt.Sprintf("terminated(%s exit %d: %s)", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.Message)
	}
	return "unknown"
}

// waitDefaultServiceAccount polls until the service-account controller has created
// default/default: until then every pod created in "default" is refused.
func waitDefaultServiceAccount(ctx context.Context, c kubernetes.Interface) error {
	for {
		_, err := c.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("service account default/default not created (is kube-controller-manager running?): %w", err)
		case <-time.After(300 * time.Millisecond):
		}
	}
}
