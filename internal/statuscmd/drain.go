package statuscmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/statusview"
)

// drainOptions are the flags of drain and undrain.
type drainOptions struct {
	kubeconfig, kubeContext, ironlbNamespace string
	wait                                     bool
	timeout                                  time.Duration
}

var serviceL2Statuses = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "servicel2statuses"}

// NewDrainCommand is `kubectl ironlb drain NODE`: the node takes no IP any
// more and its IPs move off it as planned moves.
func NewDrainCommand() *cobra.Command {
	o := drainOptions{}
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every LoadBalancer IP off a node without breaking its connections (maintenance)",
		Long: `drain annotates the Node with ` + election.DrainAnnotation + `=true (automation can set the
annotation itself): the node takes no IP any more and the IPs it announces move to other nodes
as planned moves. Their new owners serve new connections at once and forward the TCP
connections they do not know to the drained node, which still holds their state, for the
speakers' --drain-timeout (5 minutes by default; the metric ironlb_drain_forwarded_flows
counts them), so that none breaks. With --wait (the default) it prints the IPs still on the
node until none is, then how many connections the new owners still forward to the node
(read from the speakers as "kubectl ironlb status" does, which needs pods/exec: the chart's
status-reader role) and until when. "kubectl ironlb undrain NODE" makes the node eligible
again.

Cordon does not move IPs: a cordoned node still delivers its Services (kube-proxy runs on it).`,
		Args:          cobra.ExactArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return drain(ctx, o, args[0], true, cmd.OutOrStdout())
		},
	}
	o.flags(cmd, "wait until no IP is announced from the node, printing the ones left")
	return cmd
}

// NewUndrainCommand is `kubectl ironlb undrain NODE`.
func NewUndrainCommand() *cobra.Command {
	o := drainOptions{}
	cmd := &cobra.Command{
		Use:   "undrain NODE",
		Short: "Make a drained node eligible for LoadBalancer IPs again",
		Long: `undrain removes the ` + election.DrainAnnotation + ` annotation: the node takes new IPs again
(IPs that moved off it stay where they are unless --failback=immediate).`,
		Args:          cobra.ExactArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return drain(ctx, o, args[0], false, cmd.OutOrStdout())
		},
	}
	o.flags(cmd, "")
	return cmd
}

// flags adds the common flags, and --wait (described by waitHelp) and
// --ironlb-namespace when waitHelp is not empty.
func (o *drainOptions) flags(cmd *cobra.Command, waitHelp string) {
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.kubeContext, "context", "", "kubeconfig context (default: the current one)")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	if waitHelp != "" {
		f.StringVar(&o.ironlbNamespace, "ironlb-namespace", DefaultNamespace, "namespace ironlb is installed in (its ServiceL2Status objects)")
		f.BoolVar(&o.wait, "wait", true, waitHelp)
	}
}

func drain(ctx context.Context, o drainOptions, node string, on bool, out io.Writer) error {
	fail := func(err error) error { return &ExitError{Code: 2, Err: err} }
	cfg, err := kubeconfigLoader(o.kubeconfig, o.kubeContext).ClientConfig()
	if err != nil {
		return fail(fmt.Errorf("kubeconfig: %w", err))
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	var value any // nil removes the annotation
	if on {
		value = "true"
	}
	if err := annotate(ctx, cs, node, election.DrainAnnotation, value); err != nil {
		return fail(err)
	}
	if !on {
		say(out, "node %s undrained: it takes LoadBalancer IPs again\n", node)
		return nil
	}
	say(out, "node %s drained (%s=true): its IPs move to other nodes as planned moves\n", node, election.DrainAnnotation)
	if !o.wait {
		return nil
	}
	if err := waitDrained(ctx, cfg, o.ironlbNamespace, node, out); err != nil {
		return err
	}
	reportForwarded(ctx, cfg, cs, o.ironlbNamespace, node, out)
	return nil
}

// reportForwarded prints how many connections the new owners still forward
// to node (the speakers' drains, read as `kubectl ironlb status` does). It
// only informs: a speaker that cannot be read (no pods/exec permission, say)
// is named, and the drain goes on regardless.
func reportForwarded(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, ns, node string, out io.Writer) {
	r, err := speakerReport(ctx, cfg, cs, ns, DefaultSelector, DefaultContainer, statusview.Filter{})
	if err != nil {
		say(out, "could not read the speakers' drains (%v): the metric ironlb_drain_forwarded_flows counts the connections forwarded\n", err)
		return
	}
	for _, s := range r.Speakers {
		if s.Error != "" {
			say(out, "could not read the speaker on %s (%s): its forwarded connections are not counted below\n", s.Node, s.Error)
		}
	}
	f := r.ForwardedTo(node)
	if f.Drains == 0 {
		say(out, "no node forwards connections to %s (--drain-timeout=0, or the moves were failovers): it can go down now\n", node)
		return
	}
	say(out, "%d connections opened before the move are still forwarded to %s by their new owners (%s); %s serves them until they close, or until %s at the latest\n",
		f.Flows, node, formatSpread(f.ByNode), node, f.Until.Format(time.RFC3339))
}

// waitDrained polls the ServiceL2Status objects until none names node,
// printing the Services still announced from it whenever they change.
func waitDrained(ctx context.Context, cfg *rest.Config, ns, node string, out io.Writer) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	start, last := time.Now(), ""
	for {
		left, err := announcedFrom(ctx, dc, ns, node)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("listing ServiceL2Statuses in %s: %w", ns, err)}
		}
		if len(left) == 0 {
			say(out, "no IP is announced from %s any more (%s): their new owners forward the connections it still serves to it for their --drain-timeout\n",
				node, time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		if s := strings.Join(left, ", "); s != last {
			say(out, "%d Services still announced from %s: %s\n", len(left), node, s)
			last = s
		}
		select {
		case <-ctx.Done():
			return &ExitError{Code: 1, Err: fmt.Errorf("%d Services still announced from %s when the --timeout ran out: see kubectl ironlb status", len(left), node)}
		case <-time.After(time.Second):
		}
	}
}

// announcedFrom returns the Services (namespace/name) whose ServiceL2Status
// names node, sorted.
func announcedFrom(ctx context.Context, dc dynamic.Interface, ns, node string) ([]string, error) {
	all, err := l2Statuses(ctx, dc, ns)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, st := range all {
		if st.node == node {
			out = append(out, st.service)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// say prints one progress line; a closed output does not stop the drain,
// which the annotation has already started.
func say(out io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(out, format, args...)
}

// l2Status is what drain and rebalance read of a ServiceL2Status.
type l2Status struct{ node, service string }

// l2Statuses lists the ServiceL2Status objects of ns.
func l2Statuses(ctx context.Context, dc dynamic.Interface, ns string) ([]l2Status, error) {
	l, err := dc.Resource(serviceL2Statuses).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]l2Status, 0, len(l.Items))
	for _, it := range l.Items {
		n, _, _ := unstructured.NestedString(it.Object, "status", "node")
		sns, _, _ := unstructured.NestedString(it.Object, "status", "serviceNamespace")
		sn, _, _ := unstructured.NestedString(it.Object, "status", "serviceName")
		out = append(out, l2Status{node: n, service: sns + "/" + sn})
	}
	return out, nil
}

// NewRebalanceCommand is `kubectl ironlb rebalance`: every node evens out the
// spread now, by planned moves.
func NewRebalanceCommand() *cobra.Command {
	o := drainOptions{}
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "Even out how many LoadBalancer IPs each node announces, without breaking connections",
		Long: `rebalance annotates every Node with ` + election.RebalanceAnnotation + `=<now>: for a minute, each
node gives one of its IPs a second to the least-loaded node that owns at least two fewer and
may announce it, as planned moves whose new owners forward the connections they do not know
to the previous owner (--drain-timeout), so that none breaks. Failures leave IPs piled on the
survivors (ironlb does not move IPs back by itself unless --rebalance-rate or
--failback=immediate is set). With --wait (the default) it prints the Services per node
before and after, once no IP has moved for 5 s, and then removes the annotation, which ends
the rebalancing.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return rebalance(ctx, o, cmd.OutOrStdout())
		},
	}
	o.flags(cmd, "wait until no IP moved for 5 s, printing the Services per node")
	return cmd
}

func rebalance(ctx context.Context, o drainOptions, out io.Writer) error {
	fail := func(err error) error { return &ExitError{Code: 2, Err: err} }
	cfg, err := kubeconfigLoader(o.kubeconfig, o.kubeContext).ClientConfig()
	if err != nil {
		return fail(fmt.Errorf("kubeconfig: %w", err))
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	before, err := spreadOf(ctx, dc, o.ironlbNamespace)
	if err != nil {
		return fail(fmt.Errorf("listing ServiceL2Statuses in %s: %w", o.ironlbNamespace, err))
	}
	say(out, "Services per node before: %s\n", formatSpread(before))
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(fmt.Errorf("listing nodes: %w", err))
	}
	now := time.Now().UTC().Format(time.RFC3339)
	for _, n := range nodes.Items {
		if err := annotate(ctx, cs, n.Name, election.RebalanceAnnotation, now); err != nil {
			return fail(err)
		}
	}
	say(out, "asked the speakers of %d nodes to rebalance (%s=%s)\n", len(nodes.Items), election.RebalanceAnnotation, now)
	if !o.wait {
		return nil // the speakers rebalance for a minute
	}
	last, since := formatSpread(before), time.Now()
	for time.Since(since) < 5*time.Second {
		select {
		case <-ctx.Done():
			return &ExitError{Code: 1, Err: fmt.Errorf("the spread was still changing when the --timeout ran out: %s", last)}
		case <-time.After(time.Second):
		}
		cur, err := spreadOf(ctx, dc, o.ironlbNamespace)
		if err != nil {
			return fail(fmt.Errorf("listing ServiceL2Statuses in %s: %w", o.ironlbNamespace, err))
		}
		if s := formatSpread(cur); s != last {
			say(out, "Services per node: %s\n", s)
			last, since = s, time.Now()
		}
	}
	say(out, "Services per node after: %s\n", last)
	// Stable: the annotation goes, which ends the speakers' burst.
	for _, n := range nodes.Items {
		if err := annotate(ctx, cs, n.Name, election.RebalanceAnnotation, nil); err != nil {
			return fail(err)
		}
	}
	return nil
}

// annotate sets (value a string) or removes (value nil) an annotation of a
// Node with a merge patch.
func annotate(ctx context.Context, cs kubernetes.Interface, node, key string, value any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if value == nil {
			return fmt.Errorf("removing the %s annotation from node %q: %w", key, node, err)
		}
		return fmt.Errorf("annotating node %q: %w", node, err)
	}
	return nil
}

// spreadOf counts the Services each node announces (ServiceL2Status).
func spreadOf(ctx context.Context, dc dynamic.Interface, ns string) (map[string]int, error) {
	all, err := l2Statuses(ctx, dc, ns)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, st := range all {
		if st.node != "" {
			out[st.node]++
		}
	}
	return out, nil
}

func formatSpread(m map[string]int) string {
	var parts []string
	for n, c := range m {
		parts = append(parts, fmt.Sprintf("%s %d", n, c))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// kubeconfigLoader loads the user's kubeconfig as kubectl does: --kubeconfig,
// else $KUBECONFIG, else ~/.kube/config; --context, else the current one.
func kubeconfigLoader(path, context string) clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path, Precedence: clientcmd.NewDefaultClientConfigLoadingRules().Precedence},
		&clientcmd.ConfigOverrides{CurrentContext: context})
}
