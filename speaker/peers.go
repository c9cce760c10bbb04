package speaker

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// peerReconciler keeps the memberlist peers equal to the speaker Pods' IPs.
type peerReconciler struct {
	client.Client
	log   logr.Logger
	opts  Options
	ml    *membership.List
	own   *owners
	ready *atomic.Bool
}

func (p *peerReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-peers").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == p.opts.Namespace
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(p)
}

func (p *peerReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var pods corev1.PodList
	sel, _ := labels.Parse(p.opts.MLLabels)
	if err := p.List(ctx, &pods, client.InNamespace(p.opts.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return reconcile.Result{}, err
	}
	var addrs []string
	// Every node that runs a speaker counts in ownership's quorum, seen by
	// memberlist yet or not (ownership.Engine.SetSpeakerNodes).
	nodes := []string{p.opts.NodeName}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName != "" && pod.DeletionTimestamp == nil {
			nodes = append(nodes, pod.Spec.NodeName)
		}
		if pod.Name == p.opts.PodName || pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
			continue
		}
		addrs = append(addrs, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(p.opts.MLBindPort)))
	}
	p.own.SetSpeakerNodes(nodes)
	p.ml.SetPeers(addrs) // joins synchronously the peers not yet members
	if p.ready.Load() {
		return reconcile.Result{}, nil
	}
	// The first join must reach a peer when there are any: its push/pull
	// brings the current owners, and a speaker that decided alone would
	// place every IP on itself. Speakers starting together retry until one
	// answers (Run gives up waiting after a bound).
	if members := p.ml.Members(); len(addrs) == 0 || len(members) > 1 {
		p.ready.Store(true)
		p.log.Info("initial peer join done", "peers", len(addrs), "members", members)
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: 250 * time.Millisecond}, nil
}

// deletedNodes tells ownership when a Node object is deleted: the cluster
// shrank, and its speaker no longer counts in the quorum's membership.
type deletedNodes struct {
	client.Client
	own *owners
}

func (d *deletedNodes) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-deleted-nodes").
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(d)
}

func (d *deletedNodes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	err := d.Get(ctx, req.NamespacedName, &node)
	switch {
	case apierrors.IsNotFound(err):
		d.own.Forget(req.Name)
	case err != nil:
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// readyNodes is liveness without memberlist: a node whose Ready condition is
// True counts as a live speaker (failover then waits for the kubelet
// heartbeat to go stale and the node lifecycle controller to mark the node
// NotReady, about 40-50 s by default).
type readyNodes struct {
	client.Client
	own *owners
}

func (n *readyNodes) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-ready-nodes").
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, ok1 := e.ObjectOld.(*corev1.Node)
				nw, ok2 := e.ObjectNew.(*corev1.Node)
				return !ok1 || !ok2 || election.Ready(o) != election.Ready(nw)
			},
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(n)
}

func (n *readyNodes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	st := ownership.SpeakerGone
	if err := n.Get(ctx, req.NamespacedName, &node); err == nil && election.Ready(&node) {
		st = ownership.SpeakerAlive
	} else if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	n.own.SetSpeaker(req.Name, st, time.Now())
	return reconcile.Result{}, nil
}

// list feeds the Ready state of every Node (ownership must not decide
// before); false if ctx ended first.
func (n *readyNodes) list(ctx context.Context) bool {
	var nodes corev1.NodeList
	for {
		err := n.List(ctx, &nodes)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	now := time.Now()
	for i := range nodes.Items {
		st := ownership.SpeakerGone
		if election.Ready(&nodes.Items[i]) {
			st = ownership.SpeakerAlive
		}
		n.own.SetSpeaker(nodes.Items[i].Name, st, now)
	}
	return true
}

// nodeAddresses returns a node's internal and external IPs from its Node
// object: the addresses its data path is probed on.
func nodeAddresses(ctx context.Context, c client.Reader, name string) []netip.Addr {
	var node corev1.Node
	if err := c.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
